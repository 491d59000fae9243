// The hand-written driver table (cuda_driver.h) against the real cuda.h: constants, handle sizes and the key
// signatures. Compiled against cuda.h only in the CUDA build (--config=cuda); the default build has no cuda.h to
// check against and skips. The check is at compile time: a mismatch fails the CUDA build.
#include <gtest/gtest.h>

#include "core/cuda/cuda_driver.h"

#if defined(DISTCKPT_WITH_CUDA)
#include <cuda.h>

#include <type_traits>

// cuda.h maps these names to their _v2 symbols with macros, which would rename CudaDriver's fields here too.
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuMemcpyDtoHAsync
#undef cuEventDestroy
#undef cuMemcpyHtoDAsync
#undef cuMemcpy2DAsync
#undef cuMemcpyDtoDAsync
#undef cuMemAlloc
#undef cuMemFree
#undef cuStreamDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuMemGetInfo
#undef cuMemGetAddressRange

#include <cstddef>

namespace distckpt {
namespace cuda {

static_assert(sizeof(CUdeviceptr) == sizeof(::CUdeviceptr), "CUdeviceptr");
static_assert(kCudaErrorNotReady == ::CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY");
static_assert(kCudaErrorOutOfMemory == ::CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY");
static_assert(kStreamNonBlocking == ::CU_STREAM_NON_BLOCKING, "CU_STREAM_NON_BLOCKING");
static_assert(kEventDisableTiming == ::CU_EVENT_DISABLE_TIMING, "CU_EVENT_DISABLE_TIMING");
static_assert(kEventBlockingSync == ::CU_EVENT_BLOCKING_SYNC, "CU_EVENT_BLOCKING_SYNC");
static_assert(kMemHostAllocPortable == CU_MEMHOSTALLOC_PORTABLE, "CU_MEMHOSTALLOC_PORTABLE");
static_assert(kPointerAttributeMemoryType == ::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "CU_POINTER_ATTRIBUTE_MEMORY_TYPE");
static_assert(kPointerAttributeDeviceOrdinal == ::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "DEVICE_ORDINAL");
static_assert(kMemoryTypeHost == ::CU_MEMORYTYPE_HOST && kMemoryTypeDevice == ::CU_MEMORYTYPE_DEVICE &&
                  kMemoryTypeUnified == ::CU_MEMORYTYPE_UNIFIED,
              "CUmemorytype");
static_assert(kCudaSuccess == ::CUDA_SUCCESS, "CUDA_SUCCESS");
static_assert(kStreamCaptureModeRelaxed == ::CU_STREAM_CAPTURE_MODE_RELAXED, "CU_STREAM_CAPTURE_MODE_RELAXED");
static_assert(kStreamCaptureStatusActive == ::CU_STREAM_CAPTURE_STATUS_ACTIVE, "CU_STREAM_CAPTURE_STATUS_ACTIVE");
static_assert(sizeof(::CUstreamCaptureMode) == sizeof(int) && sizeof(::CUstreamCaptureStatus) == sizeof(int),
              "capture enums are int-sized");
// Memcpy2D has CUDA_MEMCPY2D's layout, field by field.
static_assert(sizeof(Memcpy2D) == sizeof(::CUDA_MEMCPY2D), "CUDA_MEMCPY2D size");
#define DCKPT_CHECK_FIELD(f) static_assert(offsetof(Memcpy2D, f) == offsetof(::CUDA_MEMCPY2D, f), "CUDA_MEMCPY2D::" #f)
DCKPT_CHECK_FIELD(srcXInBytes);
DCKPT_CHECK_FIELD(srcY);
DCKPT_CHECK_FIELD(srcMemoryType);
DCKPT_CHECK_FIELD(srcHost);
DCKPT_CHECK_FIELD(srcDevice);
DCKPT_CHECK_FIELD(srcArray);
DCKPT_CHECK_FIELD(srcPitch);
DCKPT_CHECK_FIELD(dstXInBytes);
DCKPT_CHECK_FIELD(dstY);
DCKPT_CHECK_FIELD(dstMemoryType);
DCKPT_CHECK_FIELD(dstHost);
DCKPT_CHECK_FIELD(dstDevice);
DCKPT_CHECK_FIELD(dstArray);
DCKPT_CHECK_FIELD(dstPitch);
DCKPT_CHECK_FIELD(WidthInBytes);
DCKPT_CHECK_FIELD(Height);
#undef DCKPT_CHECK_FIELD
static_assert(sizeof(CUcontext) == sizeof(::CUcontext) && sizeof(CUstream) == sizeof(::CUstream) &&
                  sizeof(CUevent) == sizeof(::CUevent) && sizeof(CUdevice) == sizeof(::CUdevice),
              "handle sizes");
// Every field of CudaDriver has the type of the cuda.h function it holds, with cuda.h's types mapped to ours.
template <typename T>
struct Ours { using type = T; };
template <> struct Ours<::CUresult> { using type = CUresult; };
template <> struct Ours<::CUpointer_attribute> { using type = int; };
template <> struct Ours<::CUstreamCaptureMode*> { using type = int*; };
template <> struct Ours<::CUstreamCaptureStatus*> { using type = int*; };
template <> struct Ours<::CUcontext> { using type = CUcontext; };
template <> struct Ours<::CUcontext*> { using type = CUcontext*; };
template <> struct Ours<::CUstream> { using type = CUstream; };
template <> struct Ours<::CUstream*> { using type = CUstream*; };
template <> struct Ours<::CUevent> { using type = CUevent; };
template <> struct Ours<::CUevent*> { using type = CUevent*; };
template <> struct Ours<::CUdeviceptr*> { using type = CUdeviceptr*; };
template <> struct Ours<const ::CUDA_MEMCPY2D*> { using type = const Memcpy2D*; };
template <typename R, typename... A>
struct Ours<R (*)(A...)> { using type = typename Ours<R>::type (*)(typename Ours<A>::type...); };

#define DCKPT_CHECK_ENTRY(field, symbol)                                                                 \
  static_assert(std::is_same<decltype(CudaDriver::field), Ours<decltype(&::symbol)>::type>::value, \
                "CudaDriver::" #field " does not match " #symbol " in cuda.h")
DCKPT_CHECK_ENTRY(cuInit, cuInit);
DCKPT_CHECK_ENTRY(cuDeviceGetCount, cuDeviceGetCount);
DCKPT_CHECK_ENTRY(cuDeviceGet, cuDeviceGet);
DCKPT_CHECK_ENTRY(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
DCKPT_CHECK_ENTRY(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2);
DCKPT_CHECK_ENTRY(cuCtxSetCurrent, cuCtxSetCurrent);
DCKPT_CHECK_ENTRY(cuCtxPushCurrent, cuCtxPushCurrent_v2);
DCKPT_CHECK_ENTRY(cuCtxPopCurrent, cuCtxPopCurrent_v2);
DCKPT_CHECK_ENTRY(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2);
DCKPT_CHECK_ENTRY(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2);
DCKPT_CHECK_ENTRY(cuMemcpy2DAsync, cuMemcpy2DAsync_v2);
DCKPT_CHECK_ENTRY(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2);
DCKPT_CHECK_ENTRY(cuMemAlloc, cuMemAlloc_v2);
DCKPT_CHECK_ENTRY(cuMemFree, cuMemFree_v2);
DCKPT_CHECK_ENTRY(cuCtxGetDevice, cuCtxGetDevice);
DCKPT_CHECK_ENTRY(cuStreamQuery, cuStreamQuery);
DCKPT_CHECK_ENTRY(cuStreamDestroy, cuStreamDestroy_v2);
DCKPT_CHECK_ENTRY(cuMemHostAlloc, cuMemHostAlloc);
DCKPT_CHECK_ENTRY(cuMemFreeHost, cuMemFreeHost);
DCKPT_CHECK_ENTRY(cuEventCreate, cuEventCreate);
DCKPT_CHECK_ENTRY(cuEventRecord, cuEventRecord);
DCKPT_CHECK_ENTRY(cuEventSynchronize, cuEventSynchronize);
DCKPT_CHECK_ENTRY(cuEventQuery, cuEventQuery);
DCKPT_CHECK_ENTRY(cuEventDestroy, cuEventDestroy_v2);
DCKPT_CHECK_ENTRY(cuStreamCreate, cuStreamCreate);
DCKPT_CHECK_ENTRY(cuStreamWaitEvent, cuStreamWaitEvent);
DCKPT_CHECK_ENTRY(cuStreamSynchronize, cuStreamSynchronize);
DCKPT_CHECK_ENTRY(cuPointerGetAttribute, cuPointerGetAttribute);
DCKPT_CHECK_ENTRY(cuGetErrorString, cuGetErrorString);
DCKPT_CHECK_ENTRY(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState);
DCKPT_CHECK_ENTRY(cuMemGetInfo, cuMemGetInfo_v2);
DCKPT_CHECK_ENTRY(cuMemGetAddressRange, cuMemGetAddressRange_v2);
DCKPT_CHECK_ENTRY(cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode);
DCKPT_CHECK_ENTRY(cuStreamIsCapturing, cuStreamIsCapturing);
#undef DCKPT_CHECK_ENTRY

}  // namespace cuda
}  // namespace distckpt

TEST(CudaDriverAbiTest, TableMatchesCudaH) { SUCCEED() << "checked at compile time"; }
#else
TEST(CudaDriverAbiTest, TableMatchesCudaH) { GTEST_SKIP() << "needs cuda.h: bazel test --config=cuda"; }
#endif
