#include "core/cuda/cuda_driver.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>


namespace distckpt {
namespace cuda {

std::string CudaDriver::ErrorString(CUresult r) const {
  const char* s = nullptr;
  std::string out = "CUDA error " + std::to_string(r);
  if (cuGetErrorString != nullptr && cuGetErrorString(r, &s) == kCudaSuccess && s != nullptr) {
    out += std::string(" (") + s + ")";
  }
  return out;
}

Status CudaDriver::Check(CUresult r, const std::string& what) const {
  if (r == kCudaSuccess) return OkStatus();
  return Status(StatusCode::kUnknown, what + ": " + ErrorString(r));
}

std::string CudaDriverLibraryName() {
  const char* env = std::getenv("DCKPT_CUDA_DRIVER_LIBRARY");
  return env != nullptr && *env != '\0' ? env : "libcuda.so.1";
}

namespace {

Result<const CudaDriver*> Load() {
  const std::string name = CudaDriverLibraryName();
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace (a framework may load its own copy).
  void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    return Unsupported(name + " not found: " + (err ? err : "dlopen failed") +
                       "; device memory needs the NVIDIA driver (install it, or save from host memory)");
  }
  auto* d = new CudaDriver();  // never freed: the driver stays loaded for the life of the process
  Status missing;
  auto sym = [&](auto* field, const char* symbol) {
    void* p = ::dlsym(lib, symbol);
    if (p == nullptr && missing.ok()) {
      missing = Unsupported(name + " has no symbol " + symbol + ": the NVIDIA driver is too old for distckpt");
    }
    *field = reinterpret_cast<std::remove_pointer_t<decltype(field)>>(p);
  };
  sym(&d->cuInit, "cuInit");
  sym(&d->cuDeviceGetCount, "cuDeviceGetCount");
  sym(&d->cuDeviceGet, "cuDeviceGet");
  sym(&d->cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  sym(&d->cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  sym(&d->cuCtxSetCurrent, "cuCtxSetCurrent");
  sym(&d->cuCtxPushCurrent, "cuCtxPushCurrent_v2");
  sym(&d->cuCtxPopCurrent, "cuCtxPopCurrent_v2");
  sym(&d->cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  sym(&d->cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  sym(&d->cuMemcpy2DAsync, "cuMemcpy2DAsync_v2");
  sym(&d->cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
  sym(&d->cuMemAlloc, "cuMemAlloc_v2");
  sym(&d->cuMemFree, "cuMemFree_v2");
  sym(&d->cuCtxGetDevice, "cuCtxGetDevice");
  sym(&d->cuMemHostAlloc, "cuMemHostAlloc");
  sym(&d->cuMemFreeHost, "cuMemFreeHost");
  sym(&d->cuEventCreate, "cuEventCreate");
  sym(&d->cuEventRecord, "cuEventRecord");
  sym(&d->cuEventSynchronize, "cuEventSynchronize");
  sym(&d->cuEventQuery, "cuEventQuery");
  sym(&d->cuEventDestroy, "cuEventDestroy_v2");
  sym(&d->cuStreamCreate, "cuStreamCreate");
  sym(&d->cuStreamWaitEvent, "cuStreamWaitEvent");
  sym(&d->cuStreamSynchronize, "cuStreamSynchronize");
  sym(&d->cuStreamQuery, "cuStreamQuery");
  sym(&d->cuStreamDestroy, "cuStreamDestroy_v2");
  sym(&d->cuPointerGetAttribute, "cuPointerGetAttribute");
  sym(&d->cuGetErrorString, "cuGetErrorString");
  sym(&d->cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState");
  sym(&d->cuMemGetInfo, "cuMemGetInfo_v2");
  sym(&d->cuMemGetAddressRange, "cuMemGetAddressRange_v2");
  sym(&d->cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
  sym(&d->cuStreamIsCapturing, "cuStreamIsCapturing");
  if (!missing.ok()) {
    delete d;
    ::dlclose(lib);
    return missing;
  }
  if (CUresult r = d->cuInit(0); r != kCudaSuccess) {
    Status st = Unsupported(name + " was loaded but cuInit failed: " + d->ErrorString(r) +
                            " (no usable GPU, or the driver does not match the kernel module)");
    delete d;
    return st;  // the library stays loaded: unloading a driver that failed to initialise gains nothing
  }
  return static_cast<const CudaDriver*>(d);
}

}  // namespace

Result<const CudaDriver*> LoadCudaDriver() {
  static std::once_flag once;
  static Result<const CudaDriver*>* result = nullptr;
  static pid_t loaded_in = 0;
  std::call_once(once, [] {
    result = new Result<const CudaDriver*>(Load());
    loaded_in = ::getpid();
  });
  // A child forked after the driver was initialised inherits its state but not its threads: CUDA calls there fail or
  // hang (and the copy engine's fence threads are gone). Refuse with what to do instead.
  if (result->ok() && ::getpid() != loaded_in) {
    return Status(StatusCode::kState, "CUDA was initialised in process " + std::to_string(loaded_in) +
                                          " before it forked this one (" + std::to_string(::getpid()) +
                                          "): a forked child cannot use it; start workers with the 'spawn' method " +
                                          "(Python: multiprocessing.get_context('spawn')), or fork before using CUDA");
  }
  return *result;
}

}  // namespace cuda
}  // namespace distckpt
