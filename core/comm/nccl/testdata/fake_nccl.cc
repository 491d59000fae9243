// A stand-in for libnccl.so.2 that exercises the loader without NCCL: it exports the entry points the NCCL
// communicator resolves (all failing with ncclInternalError) and reports the version DCKPT_FAKE_NCCL_VERSION.
// With DCKPT_FAKE_NCCL_PARTIAL, ncclCommInitRankConfig is left out. Never used outside tests.
#include <cstddef>

extern "C" {

struct ncclComm;
struct FakeUniqueId {
  char internal[128];
};

__attribute__((visibility("default"))) int ncclGetVersion(int* version) {
  *version = DCKPT_FAKE_NCCL_VERSION;
  return 0;
}
__attribute__((visibility("default"))) int ncclGetUniqueId(FakeUniqueId*) { return 3; }
#ifndef DCKPT_FAKE_NCCL_PARTIAL
__attribute__((visibility("default"))) int ncclCommInitRankConfig(ncclComm**, int, FakeUniqueId, int, void*) { return 3; }
#endif
__attribute__((visibility("default"))) int ncclCommAbort(ncclComm*) { return 0; }
__attribute__((visibility("default"))) int ncclCommGetAsyncError(ncclComm*, int* error) {
  *error = 3;
  return 0;
}
__attribute__((visibility("default"))) int ncclAllGather(const void*, void*, size_t, int, ncclComm*, void*) {
  return 3;
}
__attribute__((visibility("default"))) int ncclBroadcast(const void*, void*, size_t, int, int, ncclComm*, void*) {
  return 3;
}
__attribute__((visibility("default"))) const char* ncclGetErrorString(int) { return "fake NCCL"; }
__attribute__((visibility("default"))) const char* ncclGetLastError(ncclComm*) { return ""; }

}  // extern "C"
