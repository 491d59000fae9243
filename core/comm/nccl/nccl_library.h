// NCCL, loaded at run time with dlopen("libnccl.so.2"), so that one libdistckpt.so serves machines with and without
// GPUs: nothing links against NCCL, and users of the other backends never load it. The types below mirror nccl.h for
// the handful of entry points the NCCL communicator uses; nccl_library_abi_test checks them against the real nccl.h
// under --config=cuda.
#ifndef DISTCKPT_CORE_COMM_NCCL_NCCL_LIBRARY_H_
#define DISTCKPT_CORE_COMM_NCCL_NCCL_LIBRARY_H_

#include <climits>
#include <cstddef>
#include <string>

#include "core/base/status.h"
#include "core/cuda/cuda_driver.h"

namespace distckpt {
namespace nccl {

// Mirrors of nccl.h's types. Enums are C enums (int); the communicator is an opaque pointer; a stream is the CUDA
// driver's CUstream (cudaStream_t is the same type: struct CUstream_st*).
using ncclResult_t = int;
using ncclDataType_t = int;
using ncclComm_t = struct ncclComm*;
using cudaStream_t = cuda::CUstream;

constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct ncclUniqueId {
  char internal[kUniqueIdBytes];
};

// ncclResult_t
constexpr ncclResult_t kSuccess = 0;             // ncclSuccess
constexpr ncclResult_t kUnhandledCudaError = 1;  // ncclUnhandledCudaError
constexpr ncclResult_t kSystemError = 2;         // ncclSystemError
constexpr ncclResult_t kInternalError = 3;       // ncclInternalError
constexpr ncclResult_t kInvalidArgument = 4;     // ncclInvalidArgument
constexpr ncclResult_t kInvalidUsage = 5;        // ncclInvalidUsage
constexpr ncclResult_t kRemoteError = 6;         // ncclRemoteError
constexpr ncclResult_t kInProgress = 7;          // ncclInProgress

// ncclDataType_t
constexpr ncclDataType_t kUint8 = 1;  // ncclUint8

/// NCCL_VERSION(X, Y, Z) of nccl.h (the code ncclGetVersion reports).
constexpr int Version(int major, int minor, int patch) {
  return (major <= 2 && minor <= 8) ? major * 1000 + minor * 100 + patch : major * 10000 + minor * 100 + patch;
}

/// ncclConfig_t as NCCL 2.17 defined it (struct ncclConfig_v21700 before 2.18 appended splitShare). Later releases
/// only append fields and read a config by its `size` and `version`: fields past `size` take their defaults. So this
/// prefix works with NCCL 2.17 and every later release, and NCCL older than 2.17 is refused (kUnsupported).
struct ncclConfig_t {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
};
constexpr unsigned kConfigMagic = 0xcafebeef;      // NCCL_CONFIG_INITIALIZER's magic
constexpr int kConfigVersion = Version(2, 17, 0);  // the nccl.h whose ncclConfig_t is mirrored above
constexpr int kConfigUndefInt = INT_MIN;           // NCCL_CONFIG_UNDEF_INT
/// NCCL_CONFIG_INITIALIZER for the mirrored layout.
constexpr ncclConfig_t ConfigInitializer() {
  return ncclConfig_t{sizeof(ncclConfig_t), kConfigMagic,    static_cast<unsigned>(kConfigVersion),
                      kConfigUndefInt,      kConfigUndefInt, kConfigUndefInt,
                      kConfigUndefInt,      nullptr};
}
/// The oldest NCCL the communicator accepts: ncclConfig_t as mirrored, non-blocking communicators, ncclInProgress,
/// ncclGetLastError and ncclCommGetAsyncError polling all exist from here on.
constexpr int kMinVersion = kConfigVersion;

/// The entry points, resolved once by symbol name. A missing required one makes the load fail (kUnsupported naming it).
struct NcclLibrary {
  ncclResult_t (*ncclGetVersion)(int* version);
  ncclResult_t (*ncclGetUniqueId)(ncclUniqueId* id);
  ncclResult_t (*ncclCommInitRankConfig)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                         ncclConfig_t* config);
  ncclResult_t (*ncclCommAbort)(ncclComm_t comm);
  ncclResult_t (*ncclCommGetAsyncError)(ncclComm_t comm, ncclResult_t* async_error);
  ncclResult_t (*ncclAllGather)(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                                cudaStream_t stream);
  ncclResult_t (*ncclBroadcast)(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                ncclComm_t comm, cudaStream_t stream);
  const char* (*ncclGetErrorString)(ncclResult_t result);
  const char* (*ncclGetLastError)(ncclComm_t comm);
  // Optional: null where the library lacks them. Every NCCL from kMinVersion on has both (ncclCommFinalize came in
  // 2.14), so only an unusual build would; without them the communicator tears down with ncclCommAbort alone, as it
  // did before it used them (nccl.cc, ~NcclCommunicator).
  ncclResult_t (*ncclCommFinalize)(ncclComm_t comm);
  ncclResult_t (*ncclCommDestroy)(ncclComm_t comm);

  int version = 0;  ///< ncclGetVersion's code, e.g. 22809 for 2.28.9.

  /// "ncclSystemError (unhandled system error): <ncclGetLastError>" for messages; `comm` may be null.
  std::string ErrorString(ncclResult_t r, ncclComm_t comm) const;
};

/// "2.28.9" for a version code.
std::string VersionString(int code);

/// NCCL, loaded on the first call; later calls return the same table or the same error. kUnsupported when the
/// library cannot be loaded ("libnccl.so.2 not found: <dlerror>; ..."), lacks a symbol (named), or is older than
/// kMinVersion. Loading NCCL does not touch CUDA. Thread-safe.
Result<const NcclLibrary*> LoadNcclLibrary();

/// The file name LoadNcclLibrary opens. DCKPT_NCCL_LIBRARY in the environment overrides it (a path, or a name for the
/// dynamic loader's search); read once, on the first load.
std::string NcclLibraryName();

}  // namespace nccl
}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_NCCL_NCCL_LIBRARY_H_
