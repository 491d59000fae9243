#include "core/comm/nccl/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <type_traits>

namespace distckpt {
namespace nccl {

std::string VersionString(int code) {
  // NCCL_VERSION: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z from 2.9 on.
  int major, minor, patch;
  if (code >= 10000) {
    major = code / 10000;
    minor = code / 100 % 100;
    patch = code % 100;
  } else {
    major = code / 1000;
    minor = code / 100 % 10;
    patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string NcclLibrary::ErrorString(ncclResult_t r, ncclComm_t comm) const {
  std::string out = "NCCL error " + std::to_string(r);
  const char* s = ncclGetErrorString != nullptr ? ncclGetErrorString(r) : nullptr;
  if (s != nullptr && *s != '\0') out += std::string(" (") + s + ")";
  // The last error is per thread (and per communicator where one is given): NCCL's own explanation.
  const char* last = ncclGetLastError != nullptr ? ncclGetLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') out += std::string(": ") + last;
  return out;
}

std::string NcclLibraryName() {
  const char* env = std::getenv("DCKPT_NCCL_LIBRARY");
  return env != nullptr && *env != '\0' ? env : "libnccl.so.2";
}

namespace {

Result<const NcclLibrary*> Load() {
  const std::string name = NcclLibraryName();
  // RTLD_LOCAL: NCCL's symbols stay out of the global namespace (a framework may load its own copy).
  void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    return Unsupported(name + " not found: " + (err ? err : "dlopen failed") +
                       "; the NCCL communicator needs NCCL " + VersionString(kMinVersion) +
                       " or later (install it, e.g. the nccl package or a PyTorch CUDA wheel's nvidia-nccl, put it "
                       "on the loader path or point DCKPT_NCCL_LIBRARY at it, or use the Gloo communicator)");
  }
  auto* n = new NcclLibrary();  // never freed: NCCL stays loaded for the life of the process
  Status missing;
  auto sym = [&](auto* field, const char* symbol) {
    void* p = ::dlsym(lib, symbol);
    if (p == nullptr && missing.ok()) {
      missing = Unsupported(name + " has no symbol " + symbol + ": the NCCL communicator needs NCCL " +
                            VersionString(kMinVersion) + " or later");
    }
    *field = reinterpret_cast<std::remove_pointer_t<decltype(field)>>(p);
  };
  sym(&n->ncclGetVersion, "ncclGetVersion");
  sym(&n->ncclGetUniqueId, "ncclGetUniqueId");
  sym(&n->ncclCommInitRankConfig, "ncclCommInitRankConfig");
  sym(&n->ncclCommAbort, "ncclCommAbort");
  sym(&n->ncclCommGetAsyncError, "ncclCommGetAsyncError");
  sym(&n->ncclAllGather, "ncclAllGather");
  sym(&n->ncclBroadcast, "ncclBroadcast");
  sym(&n->ncclGetErrorString, "ncclGetErrorString");
  sym(&n->ncclGetLastError, "ncclGetLastError");
  // Optional (see nccl_library.h): left null where missing, and the load goes on.
  auto optional_sym = [&](auto* field, const char* symbol) {
    *field = reinterpret_cast<std::remove_pointer_t<decltype(field)>>(::dlsym(lib, symbol));
  };
  optional_sym(&n->ncclCommFinalize, "ncclCommFinalize");
  optional_sym(&n->ncclCommDestroy, "ncclCommDestroy");
  if (!missing.ok()) {
    delete n;
    ::dlclose(lib);
    return missing;
  }
  int version = 0;
  if (ncclResult_t r = n->ncclGetVersion(&version); r != kSuccess) {
    Status st = Unsupported(name + ": ncclGetVersion failed: " + n->ErrorString(r, nullptr));
    delete n;
    ::dlclose(lib);
    return st;
  }
  if (version < kMinVersion) {
    Status st = Unsupported(name + " is NCCL " + VersionString(version) + "; the NCCL communicator needs NCCL " +
                            VersionString(kMinVersion) + " or later");
    delete n;
    ::dlclose(lib);
    return st;
  }
  n->version = version;
  return static_cast<const NcclLibrary*>(n);
}

}  // namespace

Result<const NcclLibrary*> LoadNcclLibrary() {
  static std::once_flag once;
  static Result<const NcclLibrary*>* result = nullptr;
  std::call_once(once, [] { result = new Result<const NcclLibrary*>(Load()); });
  return *result;
}

}  // namespace nccl
}  // namespace distckpt
