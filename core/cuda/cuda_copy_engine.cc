#include "core/cuda/cuda_copy_engine.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <optional>
#include <thread>

namespace distckpt {

using cuda::CUcontext;
using cuda::CUdeviceptr;
using cuda::CUevent;
using cuda::CUresult;
using cuda::CUstream;
using cuda::CudaDriver;

namespace {

// Makes a context current on this thread for a scope, restoring the previous one after (the framework's threads
// have their own current context, which must survive a call into distckpt).
// Lets this thread's driver calls run while another thread captures a CUDA graph in the default (global) mode: that
// mode forbids "potentially unsafe" calls (cuMemFree, cuMemHostAlloc, cuEventSynchronize, ...) on every thread of the
// process and invalidates the capture when one is made (found on an H100: a background save broke torch.cuda.graph).
// None of the engine's calls touch a capturing stream (OrderAfter refuses one), so they are safe; the thread's own
// mode is restored on exit.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const CudaDriver* d) : d_(d) {
    ok_ = d_->cuThreadExchangeStreamCaptureMode(&mode_) == cuda::kCudaSuccess;
  }
  ~RelaxedCapture() {
    if (ok_) (void)d_->cuThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  const CudaDriver* d_;
  int mode_ = cuda::kStreamCaptureModeRelaxed;  // then the thread's own mode, to restore
  bool ok_ = false;
};

// The context current on this thread for the scope, with relaxed capture mode (RelaxedCapture).
class ScopedContext {
 public:
  ScopedContext(const CudaDriver* d, CUcontext ctx)
      : relaxed_(d), d_(d), status_(d->Check(d->cuCtxPushCurrent(ctx), "cuCtxPushCurrent")) {}
  ~ScopedContext() {
    CUcontext popped;
    if (status_.ok()) (void)d_->cuCtxPopCurrent(&popped);
  }
  const Status& status() const { return status_; }

 private:
  RelaxedCapture relaxed_;
  const CudaDriver* d_;
  Status status_;
};

// What a fence's waiters share with its stream's waiter thread.
struct FenceState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
};

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

// Waits, on a thread of its own, for the events recorded on one copy stream in the order they were recorded (a stream
// runs its work in order, so the oldest event is always the next to complete), and wakes each fence's waiters, who
// wait on a condition variable up to their deadline: cuEventSynchronize has no deadline, and polling cuEventQuery
// either spins or adds latency. The thread sleeps in the driver (blocking-sync events); a stream that never moves
// keeps only that thread waiting, and every fence on it times out at its waiter's deadline.
class CudaCopyEngine::StreamWaiter {
 public:
  StreamWaiter(const CudaDriver* d, CUcontext ctx, CUstream stream, std::string label)
      : d_(d), ctx_(ctx), stream_(stream), label_(std::move(label)) {}

  // Takes `ev` (destroyed once it completed) and completes `state` with its outcome.
  void Add(CUevent ev, std::shared_ptr<FenceState> state, std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Item{ev, std::move(state), std::move(what)});
    if (!started_) {
      started_ = true;
      std::thread([this] { Loop(); }).detach();  // lives as long as the engine: the whole process
    }
    cv_.notify_one();
  }
  // The caller's stream the copy stream was last ordered after (OrderAfter), for timeout messages.
  void set_waiting_for(void* caller_stream) { waiting_for_.store(caller_stream); }

  // "the copy stream 0x... of cuda:1 (ordered after the caller's stream 0x...)"
  std::string Describe() const {
    std::string out = label_ + " " + Hex(stream_);
    if (void* caller = waiting_for_.load()) out += " (ordered after the caller's stream " + Hex(caller) + ")";
    return out;
  }

 private:
  struct Item {
    CUevent ev;
    std::shared_ptr<FenceState> state;
    std::string what;
  };
  void Loop() {
    // A thread of the engine's own: the stream's context stays current on it.
    int relaxed = cuda::kStreamCaptureModeRelaxed;  // for good: cuEventSynchronize is "unsafe" (RelaxedCapture)
    (void)d_->cuThreadExchangeStreamCaptureMode(&relaxed);
    const Status ctx = d_->Check(d_->cuCtxSetCurrent(ctx_), "cuCtxSetCurrent (the fence thread of " + label_ + ")");
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      Status st = ctx.ok() ? d_->Check(d_->cuEventSynchronize(item.ev), item.what) : ctx;
      if (ctx.ok()) (void)d_->cuEventDestroy(item.ev);
      {
        std::lock_guard<std::mutex> lock(item.state->mu);
        item.state->status = std::move(st);
        item.state->done = true;
      }
      item.state->cv.notify_all();
    }
  }

  const CudaDriver* const d_;
  const CUcontext ctx_;
  const CUstream stream_;
  const std::string label_;
  std::atomic<void*> waiting_for_{nullptr};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool started_ = false;
};

namespace {

class CudaFence final : public CopyFence {
 public:
  CudaFence(std::shared_ptr<FenceState> state, std::string what, const CudaCopyEngine::StreamWaiter* waiter)
      : state_(std::move(state)), what_(std::move(what)), waiter_(waiter) {}
  Status WaitUntil(Deadline deadline) override {
    std::unique_lock<std::mutex> lock(state_->mu);
    auto done = [this] { return state_->done; };
    const auto start = std::chrono::steady_clock::now();
    if (deadline == Deadline::max()) {
      state_->cv.wait(lock, done);
    } else if (!state_->cv.wait_until(lock, deadline, done)) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      return TimeoutError(what_ + ": not finished after waiting " + std::to_string(waited.count()) + " ms: " +
                          waiter_->Describe() + " has not reached it (work queued on the caller's stream has not " +
                          "ended: a kernel that never finishes, or a collective waiting for a peer that is gone)");
    }
    return state_->status;
  }

 private:
  std::shared_ptr<FenceState> state_;
  std::string what_;
  const CudaCopyEngine::StreamWaiter* waiter_;
};

}  // namespace

Result<CudaCopyEngine*> CudaCopyEngine::Get() {
  DCKPT_ASSIGN_OR_RETURN(const CudaDriver* d, cuda::LoadCudaDriver());
  static CudaCopyEngine* const engine = new CudaCopyEngine(d);
  return engine;
}

Result<CudaCopyEngine::Device> CudaCopyEngine::GetDevice(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = devices_.find(device);
  if (it != devices_.end()) return it->second;
  RelaxedCapture relaxed(d_);
  int count = 0;
  DCKPT_RETURN_IF_ERROR(d_->Check(d_->cuDeviceGetCount(&count), "cuDeviceGetCount"));
  if (device < 0 || device >= count) {
    return InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (this machine has " +
                           std::to_string(count) + ")");
  }
  cuda::CUdevice dev;
  DCKPT_RETURN_IF_ERROR(d_->Check(d_->cuDeviceGet(&dev, device), "cuDeviceGet"));
  Device out;
  DCKPT_RETURN_IF_ERROR(d_->Check(d_->cuDevicePrimaryCtxRetain(&out.ctx, dev), "cuDevicePrimaryCtxRetain"));
  Status st;
  {
    ScopedContext scope(d_, out.ctx);
    st = scope.status();
    if (st.ok()) {
      st = d_->Check(d_->cuStreamCreate(&out.copy_stream, cuda::kStreamNonBlocking),
                     "cuStreamCreate (the copy stream of cuda:" + std::to_string(device) + ")");
    }
    if (st.ok()) {
      st = d_->Check(d_->cuStreamCreate(&out.ready_stream, cuda::kStreamNonBlocking),
                     "cuStreamCreate (the second copy stream of cuda:" + std::to_string(device) + ")");
      if (!st.ok()) (void)d_->cuStreamDestroy(out.copy_stream);
    }
  }
  if (!st.ok()) {
    (void)d_->cuDevicePrimaryCtxRelease(dev);  // retained for nothing: the next use sets the device up again
    return st;
  }
  // Never destroyed, as the engine (their threads may be waiting in the driver).
  const std::string name = "cuda:" + std::to_string(device);
  out.copy_waiter = new StreamWaiter(d_, out.ctx, out.copy_stream, "the copy stream of " + name);
  out.ready_waiter = new StreamWaiter(d_, out.ctx, out.ready_stream, "the second copy stream of " + name);
  devices_[device] = out;
  return out;
}

Result<CUcontext> CudaCopyEngine::Context(int device) {
  DCKPT_ASSIGN_OR_RETURN(Device dev, GetDevice(device));
  return dev.ctx;
}

Result<cuda::CUcontext> CudaCopyEngine::HostMemoryContext() {
  // Page-locked memory needs a context, and portable memory then serves every context: the caller's current one
  // (a framework thread's device), else a device this engine already serves (the data's), and only failing both
  // device 0. Never a context on GPU 0 for every rank of a node, whichever GPU a rank uses.
  cuda::CUdevice current;
  if (d_->cuCtxGetDevice(&current) == cuda::kCudaSuccess) return static_cast<cuda::CUcontext>(nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!devices_.empty()) return devices_.begin()->second.ctx;
  }
  DCKPT_ASSIGN_OR_RETURN(Device dev, GetDevice(0));
  return dev.ctx;
}

Result<void*> CudaCopyEngine::AllocateHost(size_t bytes) {
  RelaxedCapture relaxed(d_);
  DCKPT_ASSIGN_OR_RETURN(cuda::CUcontext ctx, HostMemoryContext());
  std::optional<ScopedContext> scope;
  if (ctx != nullptr) {
    scope.emplace(d_, ctx);
    DCKPT_RETURN_IF_ERROR(scope->status());
  }
  void* p = nullptr;
  CUresult r = d_->cuMemHostAlloc(&p, bytes, cuda::kMemHostAllocPortable);
  if (r != cuda::kCudaSuccess) {
    return Status(StatusCode::kNoMemory, "cuMemHostAlloc of " + std::to_string(bytes) +
                                             " bytes of page-locked staging memory failed: " + d_->ErrorString(r));
  }
  return p;
}

void CudaCopyEngine::FreeHost(void* p) {
  if (p == nullptr) return;
  RelaxedCapture relaxed(d_);
  auto ctx = HostMemoryContext();
  if (!ctx.ok()) return;
  std::optional<ScopedContext> scope;
  if (*ctx != nullptr) scope.emplace(d_, *ctx);
  (void)d_->cuMemFreeHost(p);
}

Status CudaCopyEngine::OrderAfter(const MemoryLocation& loc) {
  DCKPT_ASSIGN_OR_RETURN(Device dev, GetDevice(loc.device));
  ScopedContext scope(d_, dev.ctx);
  DCKPT_RETURN_IF_ERROR(scope.status());
  // Ordering the copy stream after a stream that is capturing a CUDA graph would join the copies to the graph: they
  // would run only when it is launched, and the fence would wait in vain.
  int capture = 0;
  DCKPT_RETURN_IF_ERROR(d_->Check(d_->cuStreamIsCapturing(static_cast<CUstream>(loc.stream), &capture),
                                  "asking whether the caller's stream " + Hex(loc.stream) + " of " + loc.ToString() +
                                      " is capturing a CUDA graph"));
  if (capture == cuda::kStreamCaptureStatusActive) {
    return Status(StatusCode::kState, "the caller's stream " + Hex(loc.stream) + " of " + loc.ToString() +
                                          " is capturing a CUDA graph: save and load outside the capture (the copies "
                                          "cannot be part of a graph)");
  }
  CUevent ev = nullptr;
  DCKPT_RETURN_IF_ERROR(d_->Check(d_->cuEventCreate(&ev, cuda::kEventDisableTiming), "cuEventCreate"));
  Status st = d_->Check(d_->cuEventRecord(ev, static_cast<CUstream>(loc.stream)),
                        "recording an event on the caller's stream of " + loc.ToString());
  if (st.ok()) st = d_->Check(d_->cuStreamWaitEvent(dev.copy_stream, ev, 0), "cuStreamWaitEvent");
  (void)d_->cuEventDestroy(ev);  // released by the driver once the wait is done
  if (st.ok()) dev.copy_waiter->set_waiting_for(loc.stream);
  return st;
}

Result<std::unique_ptr<CopyFence>> CudaCopyEngine::CopyToHostAsync(void* dst, const void* src, uint64_t n,
                                                                   const MemoryLocation& loc) {
  DCKPT_ASSIGN_OR_RETURN(Device dev, GetDevice(loc.device));
  ScopedContext scope(d_, dev.ctx);
  DCKPT_RETURN_IF_ERROR(scope.status());
  const std::string what = "copying " + std::to_string(n) + " bytes from " + loc.ToString() + " to host";
  DCKPT_RETURN_IF_ERROR(d_->Check(
      d_->cuMemcpyDtoHAsync(dst, reinterpret_cast<CUdeviceptr>(src), n, StreamFor(dev, loc)), what));
  return FenceAfter(dev, StreamFor(dev, loc), what);
}

Result<std::unique_ptr<CopyFence>> CudaCopyEngine::CopyToDeviceAsync(void* dst, uint64_t dst_pitch, const void* src,
                                                                     uint64_t src_pitch, uint64_t width,
                                                                     uint64_t height, const MemoryLocation& loc) {
  DCKPT_ASSIGN_OR_RETURN(Device dev, GetDevice(loc.device));
  ScopedContext scope(d_, dev.ctx);
  DCKPT_RETURN_IF_ERROR(scope.status());
  const auto to = reinterpret_cast<CUdeviceptr>(dst);
  std::string what;
  if (height <= 1) {
    what = "copying " + std::to_string(width) + " bytes from host to " + loc.ToString();
    DCKPT_RETURN_IF_ERROR(d_->Check(d_->cuMemcpyHtoDAsync(to, src, width, StreamFor(dev, loc)), what));
  } else {
    if (dst_pitch < width || src_pitch < width || dst_pitch > kMaxCopyPitch || src_pitch > kMaxCopyPitch) {
      return InvalidArgument("strided copy with pitches " + std::to_string(src_pitch) + "/" +
                             std::to_string(dst_pitch) + " for rows of " + std::to_string(width) + " bytes");
    }
    what = "copying " + std::to_string(height) + " rows of " + std::to_string(width) + " bytes from host to " +
           loc.ToString();
    cuda::Memcpy2D c;
    c.srcMemoryType = cuda::kMemoryTypeHost;
    c.srcHost = src;
    c.srcPitch = src_pitch;
    c.dstMemoryType = cuda::kMemoryTypeDevice;
    c.dstDevice = to;
    c.dstPitch = dst_pitch;
    c.WidthInBytes = width;
    c.Height = height;
    DCKPT_RETURN_IF_ERROR(d_->Check(d_->cuMemcpy2DAsync(&c, StreamFor(dev, loc)), what));
  }
  return FenceAfter(dev, StreamFor(dev, loc), what);
}

Result<void*> CudaCopyEngine::AllocateDevice(size_t bytes, int device) {
  DCKPT_ASSIGN_OR_RETURN(Device dev, GetDevice(device));
  ScopedContext scope(d_, dev.ctx);
  DCKPT_RETURN_IF_ERROR(scope.status());
  CUdeviceptr p = 0;
  CUresult r = d_->cuMemAlloc(&p, bytes == 0 ? 1 : bytes);
  if (r != cuda::kCudaSuccess) {
    // Only running out of memory is kNoMemory (callers may fall back on it); anything else is an error.
    return Status(r == cuda::kCudaErrorOutOfMemory ? StatusCode::kNoMemory : StatusCode::kUnknown,
                  "cuMemAlloc of " + std::to_string(bytes) + " bytes on cuda:" + std::to_string(device) +
                      " failed: " + d_->ErrorString(r));
  }
  return reinterpret_cast<void*>(p);
}

void CudaCopyEngine::FreeDevice(void* p, int device) {
  if (p == nullptr) return;
  auto dev = GetDevice(device);
  if (!dev.ok()) return;
  ScopedContext scope(d_, dev->ctx);
  (void)d_->cuMemFree(reinterpret_cast<CUdeviceptr>(p));
}

Result<std::unique_ptr<CopyFence>> CudaCopyEngine::CopyOnDeviceAsync(void* dst, const void* src, uint64_t n,
                                                                     const MemoryLocation& loc) {
  DCKPT_ASSIGN_OR_RETURN(Device dev, GetDevice(loc.device));
  ScopedContext scope(d_, dev.ctx);
  DCKPT_RETURN_IF_ERROR(scope.status());
  const std::string what = "copying " + std::to_string(n) + " bytes within " + loc.ToString();
  DCKPT_RETURN_IF_ERROR(d_->Check(d_->cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst),
                                                        reinterpret_cast<CUdeviceptr>(src), n, StreamFor(dev, loc)),
                                  what));
  return FenceAfter(dev, StreamFor(dev, loc), what);
}

Status CudaCopyEngine::CheckDeviceBuffer(const MemoryLocation& loc, const void* data, uint64_t bytes) {
  DCKPT_ASSIGN_OR_RETURN(Device dev, GetDevice(loc.device));
  if (data == nullptr) return OkStatus();  // an empty piece
  // Under the device's context: the calling thread may have none (a fresh thread, JAX's main thread, a C caller),
  // and the driver may then refuse the query.
  ScopedContext scope(d_, dev.ctx);
  DCKPT_RETURN_IF_ERROR(scope.status());
  unsigned type = 0;
  const auto ptr = reinterpret_cast<CUdeviceptr>(data);
  CUresult r = d_->cuPointerGetAttribute(&type, cuda::kPointerAttributeMemoryType, ptr);
  if (r != cuda::kCudaSuccess || (type != cuda::kMemoryTypeDevice && type != cuda::kMemoryTypeUnified)) {
    return InvalidArgument("the buffer is not CUDA device memory (" +
                           (r != cuda::kCudaSuccess ? d_->ErrorString(r) : "memory type " + std::to_string(type)) +
                           "): pass DCKPT_MEMORY_HOST for host memory");
  }
  int ordinal = -1;
  r = d_->cuPointerGetAttribute(&ordinal, cuda::kPointerAttributeDeviceOrdinal, ptr);
  if (r != cuda::kCudaSuccess) {
    return d_->Check(r, "asking the driver which device the buffer for " + loc.ToString() + " is on");
  }
  if (ordinal != loc.device) {
    return InvalidArgument("the buffer is memory of cuda:" + std::to_string(ordinal) + ", not of " + loc.ToString());
  }
  if (bytes == 0) return OkStatus();
  // The bytes must be mapped memory of this device all the way. cuMemGetAddressRange answers with one allocation, or
  // with one physical mapping of a virtual range (cuMemMap: torch's expandable segments, JAX's and RMM's pools map a
  // tensor from several chunks back to back), so walk the mappings that follow until the buffer's end.
  const CUdeviceptr end = ptr + bytes;
  if (end < ptr) return InvalidArgument("the buffer of " + std::to_string(bytes) + " bytes wraps the address space");
  CUdeviceptr at = ptr;
  CUdeviceptr first_base = 0;
  uint64_t first_size = 0;
  for (int mappings = 0; at < end; ++mappings) {
    CUdeviceptr base = 0;
    size_t size = 0;
    r = d_->cuMemGetAddressRange(&base, &size, at);
    if (r != cuda::kCudaSuccess && mappings == 0) {
      return d_->Check(r, "asking the driver for the allocation of the buffer for " + loc.ToString());
    }
    if (mappings == 0) first_base = base, first_size = size;
    int next_ordinal = loc.device;
    if (r == cuda::kCudaSuccess && mappings > 0) {
      r = d_->cuPointerGetAttribute(&next_ordinal, cuda::kPointerAttributeDeviceOrdinal, at);
    }
    if (r != cuda::kCudaSuccess || at < base || at - base >= size || next_ordinal != loc.device) {
      return InvalidArgument(
          "the buffer overruns its allocation: " + std::to_string(bytes) + " bytes from offset " +
          std::to_string(ptr - first_base) + " of a " + std::to_string(first_size) + "-byte block of " +
          loc.ToString() +
          (mappings == 0 ? std::string()
                         : " (mapped on for " + std::to_string(at - ptr) + " bytes, then " +
                               (r != cuda::kCudaSuccess ? "unmapped" : "memory of cuda:" + std::to_string(next_ordinal)) +
                               ")"));
    }
    at = base + size;  // past this mapping (at <= base + size - 1 above, so this advances)
  }
  return OkStatus();
}

Result<int> CudaCopyEngine::DeviceOf(const void* data) {
  const auto ptr = reinterpret_cast<CUdeviceptr>(data);
  RelaxedCapture relaxed(d_);
  int ordinal = -1;
  cuda::CUdevice current;
  if (d_->cuCtxGetDevice(&current) == cuda::kCudaSuccess &&
      d_->cuPointerGetAttribute(&ordinal, cuda::kPointerAttributeDeviceOrdinal, ptr) == cuda::kCudaSuccess) {
    return ordinal;
  }
  int count = 0;
  DCKPT_RETURN_IF_ERROR(d_->Check(d_->cuDeviceGetCount(&count), "cuDeviceGetCount"));
  for (int device = 0; device < count; ++device) {
    unsigned flags = 0;
    int active = 0;
    if (d_->cuDevicePrimaryCtxGetState(device, &flags, &active) != cuda::kCudaSuccess || !active) continue;
    DCKPT_ASSIGN_OR_RETURN(Device dev, GetDevice(device));
    ScopedContext scope(d_, dev.ctx);
    DCKPT_RETURN_IF_ERROR(scope.status());
    if (d_->cuPointerGetAttribute(&ordinal, cuda::kPointerAttributeDeviceOrdinal, ptr) == cuda::kCudaSuccess) {
      return ordinal;
    }
  }
  return InvalidArgument("the buffer is not CUDA device memory of any device in use (the driver knows no device " +
                         std::string("for it): pass the device ordinal, or DCKPT_MEMORY_HOST for host memory"));
}

Result<CopyEngine::DeviceMemory> CudaCopyEngine::DeviceMemoryInfo(int device) {
  DCKPT_ASSIGN_OR_RETURN(Device dev, GetDevice(device));
  ScopedContext scope(d_, dev.ctx);
  DCKPT_RETURN_IF_ERROR(scope.status());
  size_t free = 0, total = 0;
  DCKPT_RETURN_IF_ERROR(d_->Check(d_->cuMemGetInfo(&free, &total), "cuMemGetInfo (cuda:" + std::to_string(device) + ")"));
  return DeviceMemory{free, total};
}

Result<std::unique_ptr<CopyFence>> CudaCopyEngine::FenceAfter(const Device& dev, cuda::CUstream stream,
                                                              const std::string& what) {
  CUevent ev = nullptr;
  // Blocking sync: a thread waiting on the fence sleeps in the driver instead of spinning a core.
  DCKPT_RETURN_IF_ERROR(
      d_->Check(d_->cuEventCreate(&ev, cuda::kEventDisableTiming | cuda::kEventBlockingSync), "cuEventCreate"));
  if (Status st = d_->Check(d_->cuEventRecord(ev, stream), "cuEventRecord"); !st.ok()) {
    (void)d_->cuEventDestroy(ev);
    return st;
  }
  StreamWaiter* waiter = stream == dev.ready_stream ? dev.ready_waiter : dev.copy_waiter;
  auto state = std::make_shared<FenceState>();
  waiter->Add(ev, state, what);
  return std::unique_ptr<CopyFence>(new CudaFence(std::move(state), what, waiter));
}

}  // namespace distckpt
