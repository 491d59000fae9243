// Where a buffer lives: host memory, or the memory of one CUDA device with the stream its contents are ordered on.
#ifndef DISTCKPT_CORE_CUDA_MEMORY_H_
#define DISTCKPT_CORE_CUDA_MEMORY_H_

#include <string>

namespace distckpt {

/// The values are the C ABI's DCKPT_MEMORY_* and are never renumbered.
enum class MemoryKind : int {
  kHost = 0,
  kCuda = 1,
};

/// A buffer's location. For kCuda: the device ordinal and the stream (a CUstream / cudaStream_t, borrowed; nullptr
/// is the legacy default stream) whose queued work produces the data. A save waits for that work before copying.
struct MemoryLocation {
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;
  void* stream = nullptr;
  /// The data is complete already (a snapshot distckpt made and waited for): copies need not wait for any stream.
  bool ready = false;

  bool is_host() const { return kind == MemoryKind::kHost; }
  /// "host" or "cuda:N", for messages.
  std::string ToString() const { return is_host() ? "host" : "cuda:" + std::to_string(device); }
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_CUDA_MEMORY_H_
