// The host-to-device side of a load: bytes for device destinations are read into buffers of the copy engine's bounded
// pinned pool, verified there on the host, and copied to the device from there, while the I/O threads go on with the
// next reads. A box whose rows are not contiguous in the chunk becomes strided (2-D) copies, one per run of equally
// spaced rows, never a staging copy of the whole tensor. Buffers return to the pool once their copies have landed
// (a retiring thread waits on the fences in order), so a load pins at most the pool's memory whatever its size, and
// the I/O threads block on Acquire when every buffer is in flight (back-pressure).
#ifndef DISTCKPT_CORE_ENGINE_LOAD_STAGING_H_
#define DISTCKPT_CORE_ENGINE_LOAD_STAGING_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/cuda/copy_engine.h"
#include "core/cuda/pinned_pool.h"

namespace distckpt {

/// One run of a copy plan: `n` bytes from offset `src` of a segment buffer to `dst` (device memory).
struct DeviceRun {
  uint64_t src = 0;
  char* dst = nullptr;
  uint64_t n = 0;
};

/// Consecutive runs of equal length whose sources and destinations are equally spaced, as one strided copy: `rows`
/// rows of `width` bytes, `src_pitch` / `dst_pitch` apart (both 0 for a single row).
struct StridedCopy {
  uint64_t src = 0;
  char* dst = nullptr;
  uint64_t width = 0, rows = 0, src_pitch = 0, dst_pitch = 0;
};

/// Groups `runs` (in source order) into strided copies. Pitches stay within CopyEngine::kMaxCopyPitch, and runs that
/// overlap or go backwards start a new copy.
std::vector<StridedCopy> BatchRuns(const std::vector<DeviceRun>& runs);

/// The runs of one destination buffer, at `loc`.
struct DeviceRuns {
  MemoryLocation loc;
  std::vector<DeviceRun> runs;
};

/// Thread-safe. Created per read pass that has device destinations.
class LoadStaging {
 public:
  /// The engine (`engine`, else the CUDA engine: kUnsupported naming libcuda.so.1 without a driver) and its staging
  /// pool of max(2, count) buffers of `buffer_bytes`. Waits for copies end at `deadline`: a copy not finished by then
  /// fails the pass with kTimeout, and its buffer is quarantined (never reused), so Drain never hangs on a stream that
  /// does not move.
  static Result<std::unique_ptr<LoadStaging>> Create(CopyEngine* engine, uint64_t buffer_bytes, size_t count,
                                                     Deadline deadline = Deadline::max());
  ~LoadStaging();  ///< Drains.

  /// A pinned buffer of at least the segment size, blocking while every buffer is in flight. Fails with the first
  /// copy failure of this pass (no further reads are worth doing), or kNoMemory.
  Result<char*> Acquire();
  /// Gives back a buffer from Acquire that carries no copies (its read or verification failed).
  void Release(char* buffer);

  /// Issues the strided copies of `groups` from `buffer` (from Acquire), and hands the buffer to the retiring
  /// thread, which returns it to the pool once they have landed. A copy failure, wrapped by `context`, becomes this
  /// pass's failure. The buffer belongs to this object from this call on, whatever the outcome.
  Status Submit(char* buffer, const std::vector<DeviceRuns>& groups, std::function<Status(const Status&)> context);
  /// Copies `runs` from a transient host buffer (`src` + run.src) through pinned buffers and waits for them, up to
  /// the deadline (fan-out deliveries).
  Status CopyNow(const char* src, const std::vector<DeviceRun>& runs, const MemoryLocation& loc);

  /// Waits until every submitted copy has landed and every buffer is back; returns the first failure.
  Status Drain();

  CopyEngine* engine() const { return engine_; }
  uint64_t buffer_bytes() const { return pool_->buffer_bytes(); }

 private:
  LoadStaging(CopyEngine* engine, std::shared_ptr<PinnedPool> pool, Deadline deadline)
      : engine_(engine), pool_(std::move(pool)), deadline_(deadline) {}
  Status Issue(const char* base, const std::vector<DeviceRun>& runs, const MemoryLocation& loc,
               std::vector<std::unique_ptr<CopyFence>>* fences);
  void Fail(const Status& st);
  /// Waits for `fences` (copies from `buffer`) up to the deadline, then gives the buffer back to the pool, or
  /// quarantines it if one of them has not finished; returns the first failure, passed through `context`.
  Status WaitAndRetire(char* buffer, std::vector<std::unique_ptr<CopyFence>>* fences,
                       const std::function<Status(const Status&)>& context);
  void Retire();

  struct InFlight {
    char* buffer = nullptr;
    std::vector<std::unique_ptr<CopyFence>> fences;
    std::function<Status(const Status&)> context;
  };
  CopyEngine* const engine_;
  const std::shared_ptr<PinnedPool> pool_;
  const Deadline deadline_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<InFlight> queue_;
  bool retiring_ = false;  // the retiring thread holds an item it has popped
  bool stop_ = false;
  Status failure_;
  std::thread retirer_;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_LOAD_STAGING_H_
