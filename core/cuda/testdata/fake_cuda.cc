// A stand-in for libcuda.so.1, so that the real CudaCopyEngine (and everything above it) runs in the default test
// command on machines without a GPU. Loaded through DCKPT_CUDA_DRIVER_LIBRARY; never used outside tests.
//
// It exports the entry points core/cuda/cuda_driver.cc resolves, with the driver's rules where distckpt can get them
// wrong, and records what a real driver would make expensive or fatal:
//  - "device memory" is host memory that cuMemAlloc hands out and remembers (device, size); cuPointerGetAttribute
//    answers from that registry, and in strict mode (the default) fails with CUDA_ERROR_INVALID_CONTEXT on a thread
//    with no current context, as the real one can;
//  - contexts: one primary context per device, a per-thread stack (push/pop/set); every call that needs one fails
//    with CUDA_ERROR_INVALID_CONTEXT without one, and a stream used under another device's context fails too;
//  - streams queue their work: a stream can be held (a kernel that has not finished), so events recorded after it stay
//    pending, a stream waiting on such an event holds its own work back, and cuEventQuery says CUDA_ERROR_NOT_READY;
//    releasing the stream runs the queue in order; a stream can also be left stopping (a kernel told to exit, as
//    ncclCommAbort tells NCCL's, that has not yet): its work runs at the next cuStreamSynchronize on it;
//  - memory freed (cuMemFree, cuMemFreeHost) while some stream still has work queued, which may use it, and a stream
//    destroyed with work queued, are counted;
//  - counters per entry point and per device (primary contexts retained, page-locked allocations made under each
//    device's context, cuEventSynchronize calls on events without CU_EVENT_BLOCKING_SYNC, which spin in the real
//    driver), and failures on demand (the nth call of an entry point returns a chosen error).
// The test side reaches the controls (fake_cuda_*) with dlsym on the same library.
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kOutOfMemory = 2;
constexpr int kInvalidContext = 201;
constexpr int kInvalidHandle = 400;
constexpr int kNotReady = 600;
constexpr unsigned kEventBlockingSync = 0x1;

struct Ctx {
  int device;
};

struct Event;

struct Op {
  enum Kind { kRun, kRecord, kWait } kind;
  std::function<void()> run;
  Event* event = nullptr;
};

struct Stream {
  int device = 0;
  bool held = false;
  bool stopping = false;  // held until the next cuStreamSynchronize on it
  bool capturing = false;  // fake_cuda_capture_stream: capturing a CUDA graph
  std::deque<Op> queue;
};

struct Event {
  unsigned flags = 0;
  bool complete = true;  // an event never recorded counts as complete
  int device = 0;
  int queued = 0;          // ops that refer to it
  bool destroyed = false;  // cuEventDestroy'd while queued: freed when the last of them is done
};

struct Alloc {
  size_t size;
  int device;        // -1: page-locked host memory
  size_t chunk = 0;  // > 0: mapped in chunks of this size (fake_cuda_map_in_chunks)
};

struct Fake {
  std::mutex mu;
  std::condition_variable cv;
  int devices = 2;
  std::vector<Ctx> ctxs;
  std::map<std::string, long> counters;
  std::map<std::string, std::pair<long, int>> failures;  // entry -> (calls left before it fails, -1: every call; code)
  std::map<uintptr_t, Alloc> allocs;
  std::map<int, size_t> device_bytes;
  std::map<int, size_t> device_limit;
  std::map<std::pair<int, uintptr_t>, std::unique_ptr<Stream>> default_streams;  // (device, legacy/per-thread handle)
  std::vector<Stream*> streams;
  bool strict_pointer_queries = true;

  Fake() {
    if (const char* n = std::getenv("DCKPT_FAKE_CUDA_DEVICES")) devices = std::atoi(n);
    for (int i = 0; i < devices; ++i) ctxs.push_back(Ctx{i});
  }
};

Fake& F() {
  static Fake* const f = new Fake();
  return *f;
}

thread_local std::vector<Ctx*> ctx_stack;
thread_local int capture_mode = 0;  // CU_STREAM_CAPTURE_MODE_GLOBAL, the driver's default

Ctx* Current() { return ctx_stack.empty() ? nullptr : ctx_stack.back(); }

// Counts the call (under the lock) and returns the error injected for it, or kSuccess.
int Enter(Fake& f, const std::string& entry) {
  ++f.counters[entry];
  if (Current() == nullptr) ++f.counters["no_context:" + entry];
  if (capture_mode != 2) ++f.counters["unrelaxed"];  // a call another thread's global-mode capture would refuse
  auto it = f.failures.find(entry);
  if (it == f.failures.end()) return kSuccess;
  auto& [left, code] = it->second;
  const int error = code;
  if (left < 0) return error;
  if (left-- == 0) {
    f.failures.erase(it);
    return error;
  }
  return kSuccess;
}

// Runs what can run on every stream, in order, until nothing moves (events completing release other streams).
void Drain(Fake& f) {
  bool moved = true;
  while (moved) {
    moved = false;
    std::vector<Stream*> all = f.streams;
    for (auto& [key, s] : f.default_streams) all.push_back(s.get());
    for (Stream* s : all) {
      while (!s->held && !s->queue.empty()) {
        Op& op = s->queue.front();
        if (op.kind == Op::kWait && !op.event->complete) break;
        if (op.kind == Op::kRun) op.run();
        if (op.kind == Op::kRecord) op.event->complete = true;
        Event* ev = op.event;
        s->queue.pop_front();
        if (ev != nullptr && --ev->queued == 0 && ev->destroyed) delete ev;
        moved = true;
      }
    }
  }
  f.cv.notify_all();
}

// The stream a handle names: a created one, or the legacy (0, 1) / per-thread (2) stream of the current device.
Stream* StreamOf(Fake& f, void* handle) {
  const auto h = reinterpret_cast<uintptr_t>(handle);
  if (h > 2) return static_cast<Stream*>(handle);
  Ctx* c = Current();
  const int device = c != nullptr ? c->device : 0;
  auto& s = f.default_streams[{device, h == 0 ? 1 : h}];
  if (!s) {
    s = std::make_unique<Stream>();
    s->device = device;
  }
  return s.get();
}

// The stream's work runs under its own context: a stream of another device than the current context's is an error.
int CheckStream(Fake& f, Stream* s) {
  Ctx* c = Current();
  if (c == nullptr) return kInvalidContext;
  if (c->device != s->device) {
    ++f.counters["context_mismatch"];
    return kInvalidContext;
  }
  return kSuccess;
}

const Alloc* Find(Fake& f, uintptr_t p, uintptr_t* base = nullptr) {
  auto it = f.allocs.upper_bound(p);
  if (it == f.allocs.begin()) return nullptr;
  --it;
  if (p >= it->first + it->second.size && !(it->second.size == 0 && p == it->first)) return nullptr;
  if (base != nullptr) *base = it->first;
  return &it->second;
}

// Counts a free of memory while some stream still has work queued (which may read or write it).
void CountFreeWhileQueued(Fake& f) {
  bool queued = false;
  for (Stream* s : f.streams) queued = queued || !s->queue.empty();
  for (auto& [key, s] : f.default_streams) queued = queued || !s->queue.empty();
  if (queued) ++f.counters["freed_while_queued"];
}

int Enqueue(Fake& f, void* stream, std::function<void()> run) {
  Stream* s = StreamOf(f, stream);
  if (int r = CheckStream(f, s); r != kSuccess) return r;
  s->queue.push_back(Op{Op::kRun, std::move(run), nullptr});
  Drain(f);
  return kSuccess;
}

}  // namespace

// ---- The driver API (the symbols cuda_driver.cc resolves) ----------------------------------------------------------

FAKE_API int cuInit(unsigned) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  return Enter(f, "cuInit");
}
FAKE_API int cuDeviceGetCount(int* count) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuDeviceGetCount")) return r;
  *count = f.devices;
  return kSuccess;
}
FAKE_API int cuDeviceGet(int* device, int ordinal) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuDeviceGet")) return r;
  if (ordinal < 0 || ordinal >= f.devices) return kInvalidValue;
  *device = ordinal;
  return kSuccess;
}
FAKE_API int cuDevicePrimaryCtxRetain(Ctx** ctx, int device) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuDevicePrimaryCtxRetain")) return r;
  if (device < 0 || device >= f.devices) return kInvalidValue;
  ++f.counters["retain:" + std::to_string(device)];
  *ctx = &f.ctxs[device];
  return kSuccess;
}
FAKE_API int cuDevicePrimaryCtxRelease_v2(int device) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuDevicePrimaryCtxRelease")) return r;
  --f.counters["retain:" + std::to_string(device)];
  return kSuccess;
}
FAKE_API int cuCtxSetCurrent(Ctx* ctx) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuCtxSetCurrent")) return r;
  if (ctx_stack.empty()) {
    if (ctx != nullptr) ctx_stack.push_back(ctx);
  } else if (ctx == nullptr) {
    ctx_stack.pop_back();
  } else {
    ctx_stack.back() = ctx;
  }
  return kSuccess;
}
FAKE_API int cuCtxPushCurrent_v2(Ctx* ctx) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuCtxPushCurrent")) return r;
  if (ctx == nullptr) return kInvalidContext;
  ctx_stack.push_back(ctx);
  return kSuccess;
}
FAKE_API int cuCtxPopCurrent_v2(Ctx** ctx) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuCtxPopCurrent")) return r;
  if (ctx_stack.empty()) return kInvalidContext;
  if (ctx != nullptr) *ctx = ctx_stack.back();
  ctx_stack.pop_back();
  return kSuccess;
}
FAKE_API int cuCtxGetDevice(int* device) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuCtxGetDevice")) return r;
  Ctx* c = Current();
  if (c == nullptr) return kInvalidContext;
  *device = c->device;
  return kSuccess;
}
FAKE_API int cuMemAlloc_v2(uintptr_t* p, size_t bytes) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuMemAlloc")) return r;
  Ctx* c = Current();
  if (c == nullptr) return kInvalidContext;
  auto limit = f.device_limit.find(c->device);
  if (limit != f.device_limit.end() && f.device_bytes[c->device] + bytes > limit->second) return kOutOfMemory;
  void* mem = std::calloc(1, bytes == 0 ? 1 : bytes);
  if (mem == nullptr) return kOutOfMemory;
  *p = reinterpret_cast<uintptr_t>(mem);
  f.allocs[*p] = Alloc{bytes, c->device};
  f.device_bytes[c->device] += bytes;
  return kSuccess;
}
FAKE_API int cuMemFree_v2(uintptr_t p) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuMemFree")) return r;
  if (Current() == nullptr) return kInvalidContext;
  auto it = f.allocs.find(p);
  if (it == f.allocs.end() || it->second.device < 0) return kInvalidValue;
  CountFreeWhileQueued(f);
  f.device_bytes[it->second.device] -= it->second.size;
  f.allocs.erase(it);
  std::free(reinterpret_cast<void*>(p));
  return kSuccess;
}
FAKE_API int cuMemHostAlloc(void** p, size_t bytes, unsigned) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuMemHostAlloc")) return r;
  Ctx* c = Current();
  if (c == nullptr) return kInvalidContext;
  ++f.counters["host_alloc_under:" + std::to_string(c->device)];
  *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096);
  if (*p == nullptr) return kOutOfMemory;
  f.allocs[reinterpret_cast<uintptr_t>(*p)] = Alloc{bytes, -1};
  return kSuccess;
}
FAKE_API int cuMemFreeHost(void* p) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuMemFreeHost")) return r;
  auto it = f.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == f.allocs.end() || it->second.device >= 0) return kInvalidValue;
  CountFreeWhileQueued(f);
  f.allocs.erase(it);
  std::free(p);
  return kSuccess;
}
FAKE_API int cuMemcpyDtoHAsync_v2(void* dst, uintptr_t src, size_t n, void* stream) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuMemcpyDtoHAsync")) return r;
  const Alloc* a = Find(f, src);
  if (a == nullptr || a->device < 0) return kInvalidValue;
  return Enqueue(f, stream, [dst, src, n] { std::memcpy(dst, reinterpret_cast<const void*>(src), n); });
}
FAKE_API int cuMemcpyHtoDAsync_v2(uintptr_t dst, const void* src, size_t n, void* stream) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuMemcpyHtoDAsync")) return r;
  const Alloc* a = Find(f, dst);
  if (a == nullptr || a->device < 0) return kInvalidValue;
  return Enqueue(f, stream, [dst, src, n] { std::memcpy(reinterpret_cast<void*>(dst), src, n); });
}
FAKE_API int cuMemcpyDtoDAsync_v2(uintptr_t dst, uintptr_t src, size_t n, void* stream) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuMemcpyDtoDAsync")) return r;
  const Alloc* a = Find(f, dst);
  const Alloc* b = Find(f, src);
  if (a == nullptr || b == nullptr || a->device < 0 || b->device < 0) return kInvalidValue;
  return Enqueue(f, stream, [dst, src, n] {
    std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  });
}
struct FakeMemcpy2D {  // CUDA_MEMCPY2D's layout, as core/cuda/cuda_driver.h mirrors it
  size_t srcXInBytes, srcY;
  unsigned srcMemoryType;
  const void* srcHost;
  uintptr_t srcDevice;
  void* srcArray;
  size_t srcPitch;
  size_t dstXInBytes, dstY;
  unsigned dstMemoryType;
  void* dstHost;
  uintptr_t dstDevice;
  void* dstArray;
  size_t dstPitch;
  size_t WidthInBytes, Height;
};
FAKE_API int cuMemcpy2DAsync_v2(const FakeMemcpy2D* c, void* stream) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuMemcpy2DAsync")) return r;
  const FakeMemcpy2D copy = *c;
  const char* src = copy.srcMemoryType == 2 ? reinterpret_cast<const char*>(copy.srcDevice)
                                            : static_cast<const char*>(copy.srcHost);
  char* dst = copy.dstMemoryType == 2 ? reinterpret_cast<char*>(copy.dstDevice) : static_cast<char*>(copy.dstHost);
  if (copy.dstMemoryType == 2 && Find(f, copy.dstDevice) == nullptr) return kInvalidValue;
  return Enqueue(f, stream, [copy, src, dst] {
    for (size_t row = 0; row < copy.Height; ++row) {
      std::memcpy(dst + row * copy.dstPitch, src + row * copy.srcPitch, copy.WidthInBytes);
    }
  });
}
FAKE_API int cuEventCreate(Event** event, unsigned flags) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuEventCreate")) return r;
  Ctx* c = Current();
  if (c == nullptr) return kInvalidContext;
  *event = new Event{flags, true, c->device};
  return kSuccess;
}
FAKE_API int cuEventRecord(Event* event, void* stream) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuEventRecord")) return r;
  Stream* s = StreamOf(f, stream);
  if (int r = CheckStream(f, s); r != kSuccess) return r;
  if (event->device != s->device) return kInvalidHandle;
  event->complete = false;
  ++event->queued;
  s->queue.push_back(Op{Op::kRecord, nullptr, event});
  Drain(f);
  return kSuccess;
}
FAKE_API int cuEventQuery(Event* event) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuEventQuery")) return r;
  return event->complete ? kSuccess : kNotReady;
}
FAKE_API int cuEventSynchronize(Event* event) {
  Fake& f = F();
  std::unique_lock<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuEventSynchronize")) return r;
  if (!(event->flags & kEventBlockingSync)) ++f.counters["spinning_waits"];
  f.cv.wait(lock, [event] { return event->complete; });
  return kSuccess;
}
FAKE_API int cuEventDestroy_v2(Event* event) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuEventDestroy")) return r;
  // The driver releases an event still queued once its work is done.
  if (event->queued > 0) {
    event->destroyed = true;
  } else {
    delete event;
  }
  return kSuccess;
}
FAKE_API int cuStreamCreate(Stream** stream, unsigned) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuStreamCreate")) return r;
  Ctx* c = Current();
  if (c == nullptr) return kInvalidContext;
  auto* s = new Stream();
  s->device = c->device;
  f.streams.push_back(s);
  *stream = s;
  return kSuccess;
}
FAKE_API int cuStreamWaitEvent(void* stream, Event* event, unsigned) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuStreamWaitEvent")) return r;
  Stream* s = StreamOf(f, stream);
  if (int r = CheckStream(f, s); r != kSuccess) return r;
  if (!event->complete) {
    ++event->queued;
    s->queue.push_back(Op{Op::kWait, nullptr, event});
  }
  Drain(f);
  return kSuccess;
}
FAKE_API int cuStreamSynchronize(void* stream) {
  Fake& f = F();
  std::unique_lock<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuStreamSynchronize")) return r;
  Stream* s = StreamOf(f, stream);
  if (s->stopping) {
    s->stopping = false;
    s->held = false;
    Drain(f);
  }
  f.cv.wait(lock, [s] { return s->queue.empty(); });
  return kSuccess;
}
FAKE_API int cuStreamQuery(void* stream) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuStreamQuery")) return r;
  return StreamOf(f, stream)->queue.empty() ? kSuccess : kNotReady;
}
FAKE_API int cuStreamIsCapturing(void* stream, int* status) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuStreamIsCapturing")) return r;
  *status = StreamOf(f, stream)->capturing ? 1 : 0;  // CU_STREAM_CAPTURE_STATUS_ACTIVE / _NONE
  return kSuccess;
}
// Not counted: the caller's thread calls it around every use, and the counter would count the exchange itself.
FAKE_API int cuThreadExchangeStreamCaptureMode(int* mode) {
  std::swap(*mode, capture_mode);
  return kSuccess;
}
FAKE_API int cuStreamDestroy_v2(Stream* stream) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuStreamDestroy")) return r;
  for (auto it = f.streams.begin(); it != f.streams.end(); ++it) {
    if (*it == stream) {
      if (!stream->queue.empty()) ++f.counters["destroyed_while_queued"];
      f.streams.erase(it);
      delete stream;
      return kSuccess;
    }
  }
  return kInvalidHandle;
}
FAKE_API int cuPointerGetAttribute(void* data, int attribute, uintptr_t ptr) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuPointerGetAttribute")) return r;
  if (f.strict_pointer_queries && Current() == nullptr) return kInvalidContext;
  const Alloc* a = Find(f, ptr);
  if (a == nullptr) return kInvalidValue;  // memory the driver does not know
  if (attribute == 2) {  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    *static_cast<unsigned*>(data) = a->device < 0 ? 1u : 2u;
    return kSuccess;
  }
  if (attribute == 9) {  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    *static_cast<int*>(data) = a->device;
    return kSuccess;
  }
  return kInvalidValue;
}
FAKE_API int cuMemGetAddressRange_v2(uintptr_t* base, size_t* size, uintptr_t ptr) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuMemGetAddressRange")) return r;
  if (Current() == nullptr) return kInvalidContext;
  uintptr_t b = 0;
  const Alloc* a = Find(f, ptr, &b);
  if (a == nullptr || a->device < 0) return kInvalidValue;  // not device memory
  // A range mapped in chunks (cuMemMap) answers with the chunk holding ptr, as the driver does.
  const size_t first = a->chunk == 0 ? 0 : (ptr - b) / a->chunk * a->chunk;
  if (base != nullptr) *base = b + first;
  if (size != nullptr) *size = a->chunk == 0 ? a->size : std::min(a->chunk, a->size - first);
  return kSuccess;
}
// A device's primary context is active while it is retained (by a framework or by distckpt).
FAKE_API int cuDevicePrimaryCtxGetState(int device, unsigned* flags, int* active) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuDevicePrimaryCtxGetState")) return r;
  if (device < 0 || device >= f.devices) return kInvalidValue;
  *flags = 0;
  *active = f.counters["retain:" + std::to_string(device)] > 0 ? 1 : 0;
  return kSuccess;
}
// Free and total memory of the current context's device: its limit (fake_cuda_device_memory_limit), else 80 GiB.
FAKE_API int cuMemGetInfo_v2(size_t* free, size_t* total) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (int r = Enter(f, "cuMemGetInfo")) return r;
  Ctx* c = Current();
  if (c == nullptr) return kInvalidContext;
  auto limit = f.device_limit.find(c->device);
  *total = limit != f.device_limit.end() ? limit->second : (80ull << 30);
  const size_t used = f.device_bytes[c->device];
  *free = used < *total ? *total - used : 0;
  return kSuccess;
}
FAKE_API int cuGetErrorString(int error, const char** str) {
  switch (error) {
    case kSuccess: *str = "no error"; break;
    case kInvalidValue: *str = "invalid argument"; break;
    case kOutOfMemory: *str = "out of memory"; break;
    case kInvalidContext: *str = "invalid device context"; break;
    case kInvalidHandle: *str = "invalid resource handle"; break;
    case kNotReady: *str = "device not ready"; break;
    default: *str = "unknown error (fake driver)"; break;
  }
  return kSuccess;
}

// ---- Controls for the tests (dlsym) ---------------------------------------------------------------------------------

/// How many times `what` happened: an entry point's name ("cuMemHostAlloc"), "no_context:<entry>", "retain:<device>",
/// "host_alloc_under:<device>", "context_mismatch", "spinning_waits", "freed_while_queued", "destroyed_while_queued".
FAKE_API long fake_cuda_count(const char* what) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.counters.find(what);
  return it == f.counters.end() ? 0 : it->second;
}
/// The `nth` call (0: the next) of `entry` from now fails with `code`; nth < 0: every call until cleared (code 0).
FAKE_API void fake_cuda_fail(const char* entry, int code, long nth) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (code == kSuccess) {
    f.failures.erase(entry);
  } else {
    f.failures[entry] = {nth, code};
  }
}
/// Holds (1) or releases (0) a stream's work: a kernel still running. Handles 0/1/2 name the current device's legacy
/// or per-thread stream. Releasing runs what queued up, in order. 2: stopping, a held kernel told to exit that has not
/// yet: the work stays queued until the next cuStreamSynchronize on the stream, which runs it.
FAKE_API void fake_cuda_hold_stream(void* stream, int held) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  Stream* s = StreamOf(f, stream);
  s->stopping = held == 2 && s->held;
  s->held = held == 1 || s->stopping;
  Drain(f);
}
/// Pointer queries with no current context fail (1, the default) or succeed (0).
FAKE_API void fake_cuda_strict_pointer_queries(int strict) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  f.strict_pointer_queries = strict != 0;
}
/// cuMemAlloc on `device` fails with CUDA_ERROR_OUT_OF_MEMORY past `bytes` live.
FAKE_API void fake_cuda_device_memory_limit(int device, size_t bytes) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  f.device_limit[device] = bytes;
}
/// Makes the device allocation at `p` look like a virtual range mapped from physical chunks of `chunk` bytes back
/// to back (torch's expandable segments): cuMemGetAddressRange then answers with one chunk.
FAKE_API void fake_cuda_map_in_chunks(uintptr_t p, size_t chunk) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.allocs.find(p);
  if (it != f.allocs.end()) it->second.chunk = chunk;
}
/// Marks `stream` as capturing a CUDA graph (or not): cuStreamIsCapturing reports it.
FAKE_API void fake_cuda_capture_stream(void* stream, int capturing) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  StreamOf(f, stream)->capturing = capturing != 0;
}
/// The calling thread's stream capture mode (cuThreadExchangeStreamCaptureMode).
FAKE_API int fake_cuda_thread_capture_mode() { return capture_mode; }
/// Live cuMemAlloc bytes on `device`.
FAKE_API size_t fake_cuda_device_bytes(int device) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.device_bytes[device];
}
