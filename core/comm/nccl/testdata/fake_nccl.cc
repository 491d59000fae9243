// A stand-in for libnccl.so.2, so that the real NCCL communicator runs without NCCL or a GPU. Never used outside
// tests. It reports the version DCKPT_FAKE_NCCL_VERSION and exports the entry points the communicator resolves; with
// DCKPT_FAKE_NCCL_PARTIAL ncclCommInitRankConfig is left out (a library the loader refuses), with
// DCKPT_FAKE_NCCL_NO_FINALIZE ncclCommFinalize and ncclCommDestroy are (the communicator then tears down by abort).
//
// It makes communicators of one rank, which need no transport (more ranks: ncclInvalidUsage). Their collectives are
// copies queued on the caller's stream through the CUDA driver the process has loaded (DCKPT_CUDA_DRIVER_LIBRARY,
// e.g. core/cuda/testdata/fake_cuda.cc). A non-blocking communicator is ncclInProgress for one poll after
// ncclCommInitRankConfig, and after ncclCommFinalize until the next poll, as NCCL's can be for longer.
//
// Controls for the tests (fake_nccl_*, reached with dlsym on the same library): collectives that hang (the kernel
// waits for a peer that never comes: the fake driver's stream is held, and ncclCommAbort leaves it stopping, so it
// drains at the next cuStreamSynchronize), collectives that fail (the async error becomes the given code), a finalize
// that never completes or that fails, and counters per entry point.
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kSuccess = 0;
constexpr int kUnhandledCudaError = 1;
constexpr int kInvalidUsage = 5;
constexpr int kInProgress = 7;

struct FakeUniqueId {  // ncclUniqueId
  char internal[128];
};
struct FakeConfig {  // ncclConfig_t's first fields (every version)
  size_t size;
  unsigned magic;
  unsigned version;
  int blocking;
};

struct Fake {
  std::mutex mu;
  std::map<std::string, long> counters;
  bool hang = false;
  int collective_error = kSuccess;
  bool finalize_never_completes = false;
  int finalize_error = kSuccess;
  std::string last_error;
};

Fake& F() {
  static Fake* const f = new Fake();
  return *f;
}

// The CUDA driver this process loaded, and the fake's stream control where it is the fake.
struct Driver {
  int (*memcpy_dtod)(uintptr_t dst, uintptr_t src, size_t n, void* stream) = nullptr;
  void (*hold_stream)(void* stream, int held) = nullptr;
};
Driver LoadedDriver() {
  Driver d;
  const char* name = std::getenv("DCKPT_CUDA_DRIVER_LIBRARY");
  void* lib = ::dlopen(name != nullptr && *name != '\0' ? name : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return d;
  d.memcpy_dtod = reinterpret_cast<decltype(d.memcpy_dtod)>(::dlsym(lib, "cuMemcpyDtoDAsync_v2"));
  d.hold_stream = reinterpret_cast<decltype(d.hold_stream)>(::dlsym(lib, "fake_cuda_hold_stream"));
  return d;
}

}  // namespace

struct ncclComm {
  bool blocking = true;
  int init_polls = 0;          // polls that still report ncclInProgress after a non-blocking init
  bool finalizing = false;
  int state = kSuccess;        // the async error
  std::vector<void*> held;     // streams whose kernels wait for a peer
};

namespace {

int Fail(Fake& f, int code, const std::string& why) {
  f.last_error = "fake NCCL: " + why;
  return code;
}

// A collective of one rank: the bytes are copied on `stream` (in place: nothing to do). As controlled, its kernel
// hangs, or fails: the communicator's async error becomes the code while the kernel still waits for the peer that
// failed (both until ncclCommAbort).
int Collective(const char* entry, const void* send, void* recv, size_t count, ncclComm* comm, void* stream) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.counters[entry];
  if (comm == nullptr || comm->state != kSuccess) return Fail(f, kInvalidUsage, "communicator not usable");
  const Driver d = LoadedDriver();
  if (d.memcpy_dtod == nullptr) return Fail(f, kUnhandledCudaError, "no CUDA driver loaded");
  if (f.collective_error != kSuccess) {
    comm->state = f.collective_error;  // reported through ncclCommGetAsyncError, as a peer's failure is
    f.last_error = "fake NCCL: the collective failed (as controlled)";
  }
  if (f.hang || f.collective_error != kSuccess) {
    if (d.hold_stream == nullptr) return Fail(f, kUnhandledCudaError, "hanging needs the fake CUDA driver");
    d.hold_stream(stream, 1);
    comm->held.push_back(stream);
  }
  if (send != recv && count > 0) {
    if (int r = d.memcpy_dtod(reinterpret_cast<uintptr_t>(recv), reinterpret_cast<uintptr_t>(send), count, stream)) {
      return Fail(f, kUnhandledCudaError, "cuMemcpyDtoDAsync failed: " + std::to_string(r));
    }
  }
  return kSuccess;
}

}  // namespace

FAKE_API int ncclGetVersion(int* version) {
  *version = DCKPT_FAKE_NCCL_VERSION;
  return kSuccess;
}
FAKE_API int ncclGetUniqueId(FakeUniqueId* id) {
  std::memset(id->internal, 0, sizeof(id->internal));
  return kSuccess;
}
#ifndef DCKPT_FAKE_NCCL_PARTIAL
FAKE_API int ncclCommInitRankConfig(ncclComm** out, int nranks, FakeUniqueId, int rank, FakeConfig* config) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.counters["ncclCommInitRankConfig"];
  if (nranks != 1 || rank != 0) return Fail(f, kInvalidUsage, "only communicators of one rank can be made");
  auto* comm = new ncclComm();
  comm->blocking = config == nullptr || config->blocking != 0;
  comm->init_polls = comm->blocking ? 0 : 1;
  *out = comm;
  return comm->blocking ? kSuccess : kInProgress;
}
#endif
FAKE_API int ncclCommGetAsyncError(ncclComm* comm, int* error) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.counters["ncclCommGetAsyncError"];
  if (comm->init_polls > 0) {
    --comm->init_polls;
    *error = kInProgress;
    return kSuccess;
  }
  if (comm->finalizing && !f.finalize_never_completes) {
    comm->finalizing = false;
    comm->state = f.finalize_error;
  }
  *error = comm->finalizing ? kInProgress : comm->state;
  return kSuccess;
}
FAKE_API int ncclCommAbort(ncclComm* comm) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.counters["ncclCommAbort"];
  if (comm == nullptr) return kSuccess;
  // The kernels are told to stop; they are gone once the stream is waited for.
  const Driver d = LoadedDriver();
  for (void* s : comm->held) {
    if (d.hold_stream != nullptr) d.hold_stream(s, 2);
  }
  delete comm;
  return kSuccess;
}
#ifndef DCKPT_FAKE_NCCL_NO_FINALIZE
FAKE_API int ncclCommFinalize(ncclComm* comm) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.counters["ncclCommFinalize"];
  if (comm == nullptr || comm->finalizing) return Fail(f, kInvalidUsage, "finalize of a bad or finalizing comm");
  comm->finalizing = true;
  comm->state = kInProgress;
  return kInProgress;
}
FAKE_API int ncclCommDestroy(ncclComm* comm) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.counters["ncclCommDestroy"];
  if (comm != nullptr && !comm->held.empty()) ++f.counters["destroyed_with_kernels_waiting"];
  delete comm;
  return kSuccess;
}
#endif
FAKE_API int ncclAllGather(const void* send, void* recv, size_t count, int /*type: ncclUint8*/, ncclComm* comm,
                           void* stream) {
  return Collective("ncclAllGather", send, recv, count, comm, stream);
}
FAKE_API int ncclBroadcast(const void* send, void* recv, size_t count, int /*type*/, int /*root*/, ncclComm* comm,
                           void* stream) {
  return Collective("ncclBroadcast", send, recv, count, comm, stream);
}
FAKE_API const char* ncclGetErrorString(int) { return "fake NCCL"; }
FAKE_API const char* ncclGetLastError(ncclComm*) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  static thread_local std::string copy;
  copy = f.last_error;
  return copy.c_str();
}

// ---- Controls for the tests (dlsym) ---------------------------------------------------------------------------------

/// How many times an entry point was called ("ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort", ...), or
/// "destroyed_with_kernels_waiting".
FAKE_API long fake_nccl_count(const char* what) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.counters.find(what);
  return it == f.counters.end() ? 0 : it->second;
}
/// Collectives from now on hang (1: their kernel waits for a peer until ncclCommAbort) or complete (0).
FAKE_API void fake_nccl_collectives_hang(int hang) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  f.hang = hang != 0;
}
/// Collectives from now on fail asynchronously with `code` (e.g. 6, ncclRemoteError: a peer failed), their kernels
/// left waiting for that peer until ncclCommAbort; 0: they work.
FAKE_API void fake_nccl_collectives_fail(int code) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  f.collective_error = code;
}
/// ncclCommFinalize from now on stays in progress for ever (1: a peer never finalizes) or completes (0).
FAKE_API void fake_nccl_finalize_never_completes(int never) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  f.finalize_never_completes = never != 0;
}
/// ncclCommFinalize from now on ends with async error `code` (0: success).
FAKE_API void fake_nccl_finalize_fails(int code) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  f.finalize_error = code;
}
