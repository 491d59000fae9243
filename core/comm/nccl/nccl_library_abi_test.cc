// The hand-written NCCL table (nccl_library.h) against the real nccl.h: constants, the unique id, the mirrored
// ncclConfig_t prefix field by field, NCCL_CONFIG_INITIALIZER's magic, and every entry point's signature. Compiled
// against nccl.h only in the CUDA build (--config=cuda); the default build has no nccl.h to check against and skips.
// The check is at compile time: a mismatch fails the CUDA build.
#include <gtest/gtest.h>

#include "core/comm/nccl/nccl_library.h"

#if defined(DISTCKPT_WITH_CUDA)
#include <cuda.h>
#include <nccl.h>

#include <cstddef>
#include <type_traits>

// Outside our namespace: the initializer says sizeof(ncclConfig_t), which must name nccl.h's type.
constexpr ::ncclConfig_t kRealConfig = NCCL_CONFIG_INITIALIZER;

namespace distckpt {
namespace nccl {

static_assert(kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES, "NCCL_UNIQUE_ID_BYTES");
static_assert(sizeof(ncclUniqueId) == sizeof(::ncclUniqueId) && alignof(ncclUniqueId) == alignof(::ncclUniqueId),
              "ncclUniqueId");
static_assert(sizeof(ncclResult_t) == sizeof(::ncclResult_t) && sizeof(ncclDataType_t) == sizeof(::ncclDataType_t),
              "enum sizes");
static_assert(sizeof(ncclComm_t) == sizeof(::ncclComm_t), "ncclComm_t");
static_assert(kSuccess == ::ncclSuccess && kUnhandledCudaError == ::ncclUnhandledCudaError &&
                  kSystemError == ::ncclSystemError && kInternalError == ::ncclInternalError &&
                  kInvalidArgument == ::ncclInvalidArgument && kInvalidUsage == ::ncclInvalidUsage &&
                  kRemoteError == ::ncclRemoteError && kInProgress == ::ncclInProgress,
              "ncclResult_t");
static_assert(kUint8 == ::ncclUint8, "ncclUint8");
static_assert(Version(2, 8, 4) == NCCL_VERSION(2, 8, 4) && Version(2, 17, 0) == NCCL_VERSION(2, 17, 0) &&
                  Version(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) == NCCL_VERSION_CODE,
              "NCCL_VERSION");
static_assert(NCCL_VERSION_CODE >= kConfigVersion, "nccl.h is older than the mirrored ncclConfig_t");
static_assert(kConfigUndefInt == NCCL_CONFIG_UNDEF_INT, "NCCL_CONFIG_UNDEF_INT");
static_assert(CUDA_ERROR_OUT_OF_MEMORY == 2, "CUDA_ERROR_OUT_OF_MEMORY (nccl.cc)");

// NCCL_CONFIG_INITIALIZER: same magic, every mirrored field undefined, version and size its own.
constexpr ::ncclConfig_t kReal = ::kRealConfig;
constexpr ncclConfig_t kOurs = ConfigInitializer();
static_assert(kReal.magic == kConfigMagic && kOurs.magic == kConfigMagic, "NCCL_CONFIG_INITIALIZER magic");
static_assert(kReal.size == sizeof(::ncclConfig_t) && kOurs.size == sizeof(ncclConfig_t), "size field");
static_assert(kOurs.version == static_cast<unsigned>(kConfigVersion), "version field");
static_assert(kReal.blocking == kOurs.blocking && kReal.cgaClusterSize == kOurs.cgaClusterSize &&
                  kReal.minCTAs == kOurs.minCTAs && kReal.maxCTAs == kOurs.maxCTAs &&
                  kReal.netName == kOurs.netName,
              "NCCL_CONFIG_INITIALIZER defaults");

// ncclConfig_t: ours is a prefix of the real one (fields are only ever appended), field by field.
static_assert(sizeof(ncclConfig_t) <= sizeof(::ncclConfig_t), "ncclConfig_t prefix");
static_assert(alignof(ncclConfig_t) == alignof(::ncclConfig_t), "ncclConfig_t alignment");
#define DCKPT_CHECK_FIELD(f)                                                                  \
  static_assert(offsetof(ncclConfig_t, f) == offsetof(::ncclConfig_t, f) &&                  \
                    sizeof(ncclConfig_t::f) == sizeof(::ncclConfig_t::f) &&                  \
                    std::is_same<decltype(ncclConfig_t::f), decltype(::ncclConfig_t::f)>::value, \
                "ncclConfig_t::" #f)
DCKPT_CHECK_FIELD(size);
DCKPT_CHECK_FIELD(magic);
DCKPT_CHECK_FIELD(version);
DCKPT_CHECK_FIELD(blocking);
DCKPT_CHECK_FIELD(cgaClusterSize);
DCKPT_CHECK_FIELD(minCTAs);
DCKPT_CHECK_FIELD(maxCTAs);
DCKPT_CHECK_FIELD(netName);
#undef DCKPT_CHECK_FIELD
// The field after ours starts where ours ends (nothing of the 2.17 layout is left out).
static_assert(offsetof(::ncclConfig_t, splitShare) == sizeof(ncclConfig_t), "ncclConfig_t 2.17 prefix ends at netName");

// Every field of NcclLibrary has the type of the nccl.h function it holds, with nccl.h's types mapped to ours.
template <typename T>
struct Ours { using type = T; };
template <> struct Ours<::ncclResult_t> { using type = ncclResult_t; };
template <> struct Ours<::ncclResult_t*> { using type = ncclResult_t*; };
template <> struct Ours<::ncclDataType_t> { using type = ncclDataType_t; };
template <> struct Ours<::ncclComm_t> { using type = ncclComm_t; };
template <> struct Ours<::ncclComm_t*> { using type = ncclComm_t*; };
template <> struct Ours<::ncclUniqueId> { using type = ncclUniqueId; };
template <> struct Ours<::ncclUniqueId*> { using type = ncclUniqueId*; };
template <> struct Ours<::ncclConfig_t*> { using type = ncclConfig_t*; };
template <> struct Ours<::cudaStream_t> { using type = cudaStream_t; };
template <typename R, typename... A>
struct Ours<R (*)(A...)> { using type = typename Ours<R>::type (*)(typename Ours<A>::type...); };

#define DCKPT_CHECK_ENTRY(symbol)                                                                        \
  static_assert(std::is_same<decltype(NcclLibrary::symbol), Ours<decltype(&::symbol)>::type>::value, \
                "NcclLibrary::" #symbol " does not match nccl.h")
DCKPT_CHECK_ENTRY(ncclGetVersion);
DCKPT_CHECK_ENTRY(ncclGetUniqueId);
DCKPT_CHECK_ENTRY(ncclCommInitRankConfig);
DCKPT_CHECK_ENTRY(ncclCommAbort);
DCKPT_CHECK_ENTRY(ncclCommGetAsyncError);
DCKPT_CHECK_ENTRY(ncclAllGather);
DCKPT_CHECK_ENTRY(ncclBroadcast);
DCKPT_CHECK_ENTRY(ncclGetErrorString);
DCKPT_CHECK_ENTRY(ncclGetLastError);
DCKPT_CHECK_ENTRY(ncclCommFinalize);
DCKPT_CHECK_ENTRY(ncclCommDestroy);
#undef DCKPT_CHECK_ENTRY
// cudaStream_t and the driver's CUstream are the same handle.
static_assert(std::is_same<::cudaStream_t, ::CUstream>::value && sizeof(cudaStream_t) == sizeof(::cudaStream_t),
              "cudaStream_t");

}  // namespace nccl
}  // namespace distckpt

TEST(NcclLibraryAbiTest, TableMatchesNcclH) { SUCCEED() << "checked at compile time against NCCL " NCCL_SUFFIX; }
#else
TEST(NcclLibraryAbiTest, TableMatchesNcclH) { GTEST_SKIP() << "needs nccl.h: bazel test --config=cuda"; }
#endif
