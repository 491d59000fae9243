// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1"), so that one libdistckpt.so serves machines
// with and without GPUs: nothing links against CUDA, and host-only users never load it. The types below mirror
// cuda.h (CUDA 13) for the handful of entry points distckpt uses; the --config=cuda build checks them against cuda.h.
#ifndef DISTCKPT_CORE_CUDA_CUDA_DRIVER_H_
#define DISTCKPT_CORE_CUDA_CUDA_DRIVER_H_

#include <cstddef>
#include <string>

#include "core/base/status.h"

namespace distckpt {
namespace cuda {

// Mirrors of cuda.h's types (opaque handles are pointers; CUdeviceptr is 64-bit on every 64-bit platform).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

constexpr CUresult kCudaSuccess = 0;
constexpr CUresult kCudaErrorOutOfMemory = 2;         // CUDA_ERROR_OUT_OF_MEMORY
constexpr CUresult kCudaErrorNotReady = 600;          // CUDA_ERROR_NOT_READY
constexpr unsigned kStreamNonBlocking = 0x1;          // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventBlockingSync = 0x1;          // CU_EVENT_BLOCKING_SYNC
constexpr unsigned kEventDisableTiming = 0x2;         // CU_EVENT_DISABLE_TIMING
constexpr unsigned kMemHostAllocPortable = 0x1;       // CU_MEMHOSTALLOC_PORTABLE
constexpr int kPointerAttributeMemoryType = 2;        // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttributeDeviceOrdinal = 9;     // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr unsigned kMemoryTypeHost = 1;               // CU_MEMORYTYPE_HOST
constexpr unsigned kMemoryTypeDevice = 2;             // CU_MEMORYTYPE_DEVICE
constexpr unsigned kMemoryTypeUnified = 4;            // CU_MEMORYTYPE_UNIFIED
constexpr int kStreamCaptureModeRelaxed = 2;          // CU_STREAM_CAPTURE_MODE_RELAXED
constexpr int kStreamCaptureStatusActive = 1;         // CU_STREAM_CAPTURE_STATUS_ACTIVE

/// Mirror of CUDA_MEMCPY2D (cuda.h's CUDA_MEMCPY2D_v2): a copy of `Height` rows of `WidthInBytes` bytes between
/// two pitched layouts. CUmemorytype fields are a C enum (an int); CUarray is a handle.
struct Memcpy2D {
  size_t srcXInBytes = 0, srcY = 0;
  unsigned srcMemoryType = 0;
  const void* srcHost = nullptr;
  CUdeviceptr srcDevice = 0;
  void* srcArray = nullptr;
  size_t srcPitch = 0;
  size_t dstXInBytes = 0, dstY = 0;
  unsigned dstMemoryType = 0;
  void* dstHost = nullptr;
  CUdeviceptr dstDevice = 0;
  void* dstArray = nullptr;
  size_t dstPitch = 0;
  size_t WidthInBytes = 0, Height = 0;
};

/// The entry points, resolved once. Names are the symbols libcuda exports (the _v2 ones where cuda.h #defines the
/// plain name to them).
struct CudaDriver {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuDeviceGetCount)(int* count);
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice dev);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev);  // cuDevicePrimaryCtxRelease_v2
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuCtxPushCurrent)(CUcontext ctx);    // cuCtxPushCurrent_v2
  CUresult (*cuCtxPopCurrent)(CUcontext* ctx);    // cuCtxPopCurrent_v2
  CUresult (*cuMemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes, CUstream stream);  // cuMemcpyDtoHAsync_v2
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream);  // _v2
  CUresult (*cuMemcpy2DAsync)(const Memcpy2D* copy, CUstream stream);                            // _v2
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);  // _v2
  CUresult (*cuMemAlloc)(CUdeviceptr* p, size_t bytes);                                          // cuMemAlloc_v2
  CUresult (*cuMemFree)(CUdeviceptr p);                                                            // cuMemFree_v2
  CUresult (*cuCtxGetDevice)(CUdevice* device);
  CUresult (*cuMemHostAlloc)(void** p, size_t bytes, unsigned flags);
  CUresult (*cuMemFreeHost)(void* p);
  CUresult (*cuEventCreate)(CUevent* event, unsigned flags);
  CUresult (*cuEventRecord)(CUevent event, CUstream stream);
  CUresult (*cuEventSynchronize)(CUevent event);
  CUresult (*cuEventQuery)(CUevent event);
  CUresult (*cuEventDestroy)(CUevent event);      // cuEventDestroy_v2
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned flags);
  CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned flags);
  CUresult (*cuStreamSynchronize)(CUstream stream);
  CUresult (*cuStreamQuery)(CUstream stream);
  CUresult (*cuStreamDestroy)(CUstream stream);   // cuStreamDestroy_v2
  CUresult (*cuPointerGetAttribute)(void* data, int attribute, CUdeviceptr ptr);
  CUresult (*cuGetErrorString)(CUresult error, const char** str);
  CUresult (*cuDevicePrimaryCtxGetState)(CUdevice dev, unsigned* flags, int* active);
  CUresult (*cuMemGetInfo)(size_t* free, size_t* total);                                          // cuMemGetInfo_v2
  CUresult (*cuMemGetAddressRange)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);  // cuMemGetAddressRange_v2
  CUresult (*cuThreadExchangeStreamCaptureMode)(int* mode);  // CUstreamCaptureMode*
  CUresult (*cuStreamIsCapturing)(CUstream stream, int* status);  // CUstreamCaptureStatus*

  /// "CUDA error 700 (an illegal memory access was encountered)" for messages.
  std::string ErrorString(CUresult r) const;
  /// OK, or an error whose message is "<what>: <ErrorString>".
  Status Check(CUresult r, const std::string& what) const;
};

/// The driver, loaded and initialised (cuInit) on the first call; later calls return the same table or the same
/// error. kUnsupported when libcuda.so.1 cannot be loaded ("libcuda.so.1 not found: <dlerror>"), lacks a symbol, or
/// cuInit fails (no device, driver too old); kState in a child forked after the driver was loaded (CUDA cannot be
/// used there). Thread-safe.
Result<const CudaDriver*> LoadCudaDriver();

/// The file name LoadCudaDriver opens. DCKPT_CUDA_DRIVER_LIBRARY in the environment overrides it (for tests that
/// need a driver that is not there); read once, on the first load.
std::string CudaDriverLibraryName();

}  // namespace cuda
}  // namespace distckpt

#endif  // DISTCKPT_CORE_CUDA_CUDA_DRIVER_H_
