// A bounded pool of staging buffers: at most `count` buffers of `buffer_bytes`, allocated on first use through a
// CopyEngine (page-locked for CUDA) and reused until the pool is destroyed. Acquire blocks while every buffer is in
// use: that is the back-pressure of the D2H pipeline, which therefore never holds more host memory than the pool.
#ifndef DISTCKPT_CORE_CUDA_PINNED_POOL_H_
#define DISTCKPT_CORE_CUDA_PINNED_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "core/base/status.h"

namespace distckpt {

class CopyEngine;

/// Thread-safe.
class PinnedPool {
 public:
  /// `engine` allocates and frees the buffers and must outlive the pool. count >= 1, buffer_bytes >= 1.
  PinnedPool(CopyEngine* engine, size_t buffer_bytes, size_t count);
  ~PinnedPool();  ///< Every buffer must have been released.
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  /// A free buffer of buffer_bytes(), blocking while all `count` are in use. Fails with
  /// kNoMemory if allocating a new buffer fails, or `cancelled`'s status once it returns non-OK while waiting
  /// (checked at least every 20 ms).
  Result<char*> Acquire(const std::function<Status()>& cancelled = nullptr);
  /// Gives a buffer from Acquire back.
  void Release(char* buffer);
  /// Gives up a buffer from Acquire that a copy which timed out may still read or write: it goes to the engine's
  /// quarantine (CopyEngine::Quarantine), never reused, and a new buffer may be allocated in its place.
  void Quarantine(char* buffer);
  /// Buffers given up by Quarantine.
  size_t quarantined() const;

  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t count() const { return count_; }
  /// Buffers allocated so far (never more than count()).
  size_t allocated() const;
  size_t in_use() const;
  /// The most buffers ever in use at once.
  size_t max_in_use() const;
  /// Times Acquire had to wait for a buffer (back-pressure).
  uint64_t waits() const;

 private:
  CopyEngine* const engine_;
  const size_t buffer_bytes_;
  const size_t count_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char*> all_;
  std::vector<char*> free_;
  size_t in_use_ = 0;
  size_t quarantined_ = 0;
  size_t max_in_use_ = 0;
  uint64_t waits_ = 0;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_CUDA_PINNED_POOL_H_
