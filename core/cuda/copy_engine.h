// Copies of device memory into host memory, asynchronously, with a fence per copy. Two implementations: CUDA (driver
// API, a dedicated copy stream per device, events as fences; cuda_copy_engine.h) and host (memcpy on a worker thread,
// the same semantics; host_copy_engine.h), which the tests use to run the whole staging pipeline without a GPU.
#ifndef DISTCKPT_CORE_CUDA_COPY_ENGINE_H_
#define DISTCKPT_CORE_CUDA_COPY_ENGINE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/cuda/memory.h"

namespace distckpt {

class PinnedPool;

/// When an operation gives up waiting for the device: a save's or a load's `timeout` after it started.
using Deadline = std::chrono::steady_clock::time_point;
/// `timeout` from now; no deadline (Deadline::max()) for timeouts too long to add without overflow.
Deadline DeadlineAfter(std::chrono::milliseconds timeout);

/// Completion of one asynchronous copy. Waits may be called from any thread, once or more.
class CopyFence {
 public:
  virtual ~CopyFence() = default;  ///< Does not wait: wait before the destination is reused or freed.
  /// Blocks (sleeping, never spinning) until the copy has finished, and returns its outcome (an error names the
  /// source location), or until `deadline`: then kTimeout naming the stream and device the copy is stuck on. A copy
  /// that timed out may still run later (a kernel on the caller's stream that ends after all): the memory it reads
  /// and writes must never be reused or freed (quarantined); a later wait may still see it finish.
  virtual Status WaitUntil(Deadline deadline) = 0;
  /// WaitUntil with no deadline.
  Status Wait() { return WaitUntil(Deadline::max()); }
};

/// Thread-safe. An engine outlives every pool and fence it hands out.
class CopyEngine {
 public:
  virtual ~CopyEngine();
  /// "cuda" or "host", for messages.
  virtual std::string name() const = 0;

  /// Host memory for staging buffers, 4 KiB aligned (page-locked for CUDA, so copies run at full speed).
  virtual Result<void*> AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* p) = 0;

  /// Orders every later copy from `loc`'s device after the work queued on `loc.stream` so far (CUDA: an event
  /// recorded on the caller's stream, which the copy stream waits on). Never blocks the calling thread on the device.
  virtual Status OrderAfter(const MemoryLocation& loc) = 0;
  /// OrderAfter once for every distinct (device, stream) of `locations`, skipping host memory and `ready` data (which
  /// waits for nothing). An error names the location.
  Status OrderAfterEach(const std::vector<MemoryLocation>& locations);
  /// Starts copying `n` bytes at `src` (memory at `loc`) into host memory at `dst`. Copies from one device run in
  /// the order they were issued, those of `ready` data apart from the others (CUDA: a stream of their own, so they
  /// never wait behind an OrderAfter on a caller's stream). `dst` must stay valid until the fence's Wait() returns.
  virtual Result<std::unique_ptr<CopyFence>> CopyToHostAsync(void* dst, const void* src, uint64_t n,
                                                             const MemoryLocation& loc) = 0;

  /// Starts copying `height` rows of `width` bytes from host memory at `src` (rows `src_pitch` bytes apart) into
  /// memory at `loc` starting at `dst` (rows `dst_pitch` bytes apart): one strided copy for a box that is not
  /// contiguous (CUDA: cuMemcpy2DAsync; height 1 is a plain cuMemcpyHtoDAsync). Ordered with this engine's other
  /// copies to the same device, after OrderAfter. `src` must stay valid until the fence's Wait() returns; pitches
  /// are at least `width` and below kMaxCopyPitch.
  virtual Result<std::unique_ptr<CopyFence>> CopyToDeviceAsync(void* dst, uint64_t dst_pitch, const void* src,
                                                               uint64_t src_pitch, uint64_t width, uint64_t height,
                                                               const MemoryLocation& loc) = 0;
  /// Device memory for a snapshot of device data (an asynchronous save's device-to-device staging): `bytes` on
  /// `device`, or kNoMemory when the device has not that much free. FreeDevice waits for nothing: the caller has
  /// waited for every copy that uses the memory.
  virtual Result<void*> AllocateDevice(size_t bytes, int device) = 0;
  virtual void FreeDevice(void* p, int device) = 0;
  /// Free and total memory of `device` (CUDA: cuMemGetInfo, which does not count a framework's cached blocks as free),
  /// for sizing a snapshot against what training leaves.
  struct DeviceMemory {
    uint64_t free = 0, total = 0;
  };
  virtual Result<DeviceMemory> DeviceMemoryInfo(int device) = 0;
  /// Starts copying `n` bytes between two buffers of `loc`'s device, after OrderAfter, in order with the other
  /// copies to and from that device.
  virtual Result<std::unique_ptr<CopyFence>> CopyOnDeviceAsync(void* dst, const void* src, uint64_t n,
                                                               const MemoryLocation& loc) = 0;

  /// The largest row pitch CopyToDeviceAsync takes (CUDA's limit for 2-D copies is 2^31 - 1 on current devices).
  static constexpr uint64_t kMaxCopyPitch = (1ull << 31) - 1;

  /// The engine's staging pool of `count` buffers of `buffer_bytes`: made on first use and reused by every later
  /// save that asks for the same shape (a different shape replaces it; saves still holding the old one keep it
  /// until they finish). Its memory is bounded by buffer_bytes * count whatever the size of the state.
  Result<std::shared_ptr<PinnedPool>> StagingPool(size_t buffer_bytes, size_t count);

  /// Takes memory a copy that timed out may still read or write (from AllocateHost with device -1, else from
  /// AllocateDevice on `device`): never reused, freed only when the engine is destroyed, after its last copy (the
  /// process-wide CUDA engine never is).
  void Quarantine(void* p, int device);
  /// Allocations held by Quarantine.
  size_t quarantined() const;

 protected:
  /// Frees the cached pool; every engine's destructor calls it (the pool frees through the engine's FreeHost).
  void DropStagingPool();
  /// Frees what Quarantine holds: engines call it from their destructors once no copy can run any more.
  void FreeQuarantined();

 private:
  std::mutex pool_mu_;
  std::shared_ptr<PinnedPool> pool_;
  mutable std::mutex quarantine_mu_;
  std::vector<std::pair<void*, int>> quarantined_;
};

/// Testing only: true when DCKPT_TEST_CUDA_ON_HOST=1 was in the environment at the first call. Then "CUDA" buffers
/// are taken to be host memory: DefaultCopyEngine(kCuda) is the host engine and CheckDeviceBuffer accepts any
/// pointer, so the bindings' device paths (Python, Rust) run through the real pipeline on machines without a GPU.
bool CudaEmulatedOnHost();

/// The engine for device memory of `kind`: for kCuda the process-wide CUDA engine, which loads the driver on first
/// use (kUnsupported naming libcuda.so.1 where it is missing); for kHost the process-wide host engine.
Result<CopyEngine*> DefaultCopyEngine(MemoryKind kind);

/// Checks that `data` is memory of `loc` (CUDA: device memory of loc.device, through cuPointerGetAttribute) and, for
/// `bytes` > 0, that [data, data + bytes) lies inside one allocation; loads the driver for CUDA. kUnsupported without a
/// driver, kInvalidArgument for a pointer that is not device memory, of another device, or a buffer that overruns.
Status CheckDeviceBuffer(const MemoryLocation& loc, const void* data, uint64_t bytes = 0);

/// The C ABI's DCKPT_DEVICE_OF_POINTER: a MemoryLocation::device asking for the device the buffer is on.
constexpr int kDeviceOfPointer = -1;
/// For a CUDA `loc` whose device is kDeviceOfPointer: sets it to the device `data` is on (asked of the driver, from a
/// thread with or without a current context; device 0 when CUDA is emulated on the host); then CheckDeviceBuffer.
Status ResolveDeviceBuffer(MemoryLocation* loc, const void* data, uint64_t bytes);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_CUDA_COPY_ENGINE_H_
