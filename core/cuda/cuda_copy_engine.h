// The CUDA CopyEngine, on the driver API loaded at run time (cuda_driver.h): per device, the primary context and one
// dedicated non-blocking copy stream, used in both directions; every copy (cuMemcpyDtoHAsync, cuMemcpyHtoDAsync,
// cuMemcpy2DAsync) is followed by a blocking-sync event on that stream, which is the copy's fence: a thread per stream
// waits for the events in order and wakes the fence's waiters, who wait up to their deadline (sleeping, never
// spinning; a stream stuck behind a caller's kernel is a timeout naming the stream and device, not a hang). Staging buffers are page-locked (cuMemHostAlloc, portable across contexts), made under the caller's current
// context or a device the engine already serves, never GPU 0's for every rank.
#ifndef DISTCKPT_CORE_CUDA_CUDA_COPY_ENGINE_H_
#define DISTCKPT_CORE_CUDA_CUDA_COPY_ENGINE_H_

#include <map>
#include <mutex>

#include "core/cuda/copy_engine.h"
#include "core/cuda/cuda_driver.h"

namespace distckpt {

class CudaCopyEngine final : public CopyEngine {
 public:
  /// The process-wide engine (never destroyed); kUnsupported where the driver cannot be loaded.
  static Result<CudaCopyEngine*> Get();

  std::string name() const override { return "cuda"; }
  Result<void*> AllocateHost(size_t bytes) override;
  void FreeHost(void* p) override;
  Status OrderAfter(const MemoryLocation& loc) override;
  Result<std::unique_ptr<CopyFence>> CopyToHostAsync(void* dst, const void* src, uint64_t n,
                                                     const MemoryLocation& loc) override;
  Result<std::unique_ptr<CopyFence>> CopyToDeviceAsync(void* dst, uint64_t dst_pitch, const void* src,
                                                       uint64_t src_pitch, uint64_t width, uint64_t height,
                                                       const MemoryLocation& loc) override;
  Result<void*> AllocateDevice(size_t bytes, int device) override;
  void FreeDevice(void* p, int device) override;
  Result<std::unique_ptr<CopyFence>> CopyOnDeviceAsync(void* dst, const void* src, uint64_t n,
                                                       const MemoryLocation& loc) override;

  /// The primary context of `device` (retained once, kept for the life of the process).
  Result<cuda::CUcontext> Context(int device);
  Result<DeviceMemory> DeviceMemoryInfo(int device) override;

  /// Checks that `data` is device memory of loc.device (cuPointerGetAttribute under that device's context, so a
  /// thread with no current context can ask) and that `bytes` from it lie in one allocation (cuMemGetAddressRange).
  /// kInvalidArgument for other memory or an overrun; a failed query is an error.
  Status CheckDeviceBuffer(const MemoryLocation& loc, const void* data, uint64_t bytes = 0);
  /// The device `data` is on: asked under the caller's current context, else under each device whose primary context
  /// is active (the memory's own device is: frameworks allocate under it), never making a context on an idle GPU.
  Result<int> DeviceOf(const void* data);

  class StreamWaiter;  // a thread per copy stream completing its fences in order (cuda_copy_engine.cc)

 private:
  explicit CudaCopyEngine(const cuda::CudaDriver* d) : d_(d) {}
  struct Device {
    cuda::CUcontext ctx = nullptr;
    cuda::CUstream copy_stream = nullptr;   // copies ordered after callers' streams (OrderAfter)
    cuda::CUstream ready_stream = nullptr;  // copies of `ready` data, which wait for nothing: an async save's
                                            // background drain of its snapshot never queues behind a foreground
                                            // save's wait on a training stream
    StreamWaiter* copy_waiter = nullptr;    // the fences of each stream
    StreamWaiter* ready_waiter = nullptr;
  };
  /// The stream a copy of memory at `loc` goes on.
  static cuda::CUstream StreamFor(const Device& dev, const MemoryLocation& loc) {
    return loc.ready ? dev.ready_stream : dev.copy_stream;
  }
  Result<Device> GetDevice(int device);
  /// The context to make and free page-locked memory under: null when the caller has one current (use it as is),
  /// else a device this engine already serves, else device 0's.
  Result<cuda::CUcontext> HostMemoryContext();
  /// An event recorded on `stream` (one of `dev`'s) after the copy just queued there: the fence for `what`.
  Result<std::unique_ptr<CopyFence>> FenceAfter(const Device& dev, cuda::CUstream stream, const std::string& what);
  const cuda::CudaDriver* const d_;
  std::mutex mu_;
  std::map<int, Device> devices_;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_CUDA_CUDA_COPY_ENGINE_H_
