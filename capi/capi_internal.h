// Shared between the C ABI's translation units: handle definitions and error reporting.
#ifndef DISTCKPT_CAPI_CAPI_INTERNAL_H_
#define DISTCKPT_CAPI_CAPI_INTERNAL_H_

#include <chrono>
#include <cstring>
#include <memory>

#include "capi/include/distckpt/distckpt.h"
#include "core/base/status.h"
#include "core/comm/communicator.h"
#include "core/engine/state.h"
#include "core/storage/storage.h"

struct dckpt_comm {
  std::unique_ptr<distckpt::Communicator> comm;
};

struct dckpt_state {
  distckpt::State state;
};

/// Shared: readers and async saves that use a storage keep it alive after dckpt_storage_free.
struct dckpt_storage {
  std::shared_ptr<distckpt::Storage> storage;
};

namespace distckpt {
namespace capi {

/// Records a failed status as the calling thread's last error and returns its code (0 for OK).
int Report(const Status& st);
/// Call inside catch (...): converts the active exception into a status.
int ReportException();
inline Communicator* CommunicatorOf(dckpt_comm* c) { return c->comm.get(); }
/// kInvalidArgument for version 0, kVersion for a version newer than `current`.
Status CheckVersion(unsigned version, unsigned current, const char* what);
Status NotNull(const void* p, const char* what);
/// The storage a call on `path` uses: `given` when the caller passed one, else the storage the URL names
/// (StorageForUrl: S3 for "s3://", kUnsupported for an unknown scheme), else nullptr (a plain path: the POSIX default).
Result<std::shared_ptr<Storage>> StorageForCall(std::shared_ptr<Storage> given, const char* path);
/// StorageForCall for a dckpt_storage handle, never nullptr: a plain path with no storage is the POSIX file system.
Result<std::shared_ptr<Storage>> StorageOrUrl(dckpt_storage* storage, const char* path);
/// 0 means the default collective timeout.
std::chrono::milliseconds Timeout(uint64_t ms);

}  // namespace capi
}  // namespace distckpt

/// Runs a function body so that no C++ exception escapes into C.
#define DCKPT_GUARD(...)                          \
  try {                                           \
    __VA_ARGS__                                   \
  } catch (...) {                                 \
    return ::distckpt::capi::ReportException();   \
  }

/// Returns the status code (recording the message) if `expr` is not OK.
#define DCKPT_RETURN_IF_FAILED(expr)                        \
  do {                                                      \
    ::distckpt::Status dckpt_st_ = (expr);                  \
    if (!dckpt_st_.ok()) return ::distckpt::capi::Report(dckpt_st_); \
  } while (0)

namespace distckpt {
namespace capi {

/// The body of every dckpt_*_init: checks `out` and `version`, then writes `defaults` (the struct's _INIT) with its
/// version set to `version`, only the first `size` bytes: the fields a caller built against `version` has room for.
template <typename T>
int InitVersioned(T* out, const char* arg, T defaults, unsigned version, unsigned current, const char* what,
                  size_t size = sizeof(T)) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, arg));
    DCKPT_RETURN_IF_FAILED(CheckVersion(version, current, what));
    defaults.version = version;
    std::memcpy(out, &defaults, size);
    return 0;
  })
}

}  // namespace capi
}  // namespace distckpt

#endif  // DISTCKPT_CAPI_CAPI_INTERNAL_H_
