#include "core/comm/nccl/nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/collective_call.h"
#include "core/comm/layered_communicator.h"

namespace distckpt {
namespace internal_nccl {
namespace {

using internal_comm::Call;
using internal_comm::Clock;
using internal_comm::Millis;
using internal_comm::Op;
using internal_comm::OpName;

StatusCode CodeOf(ncclResult_t r) {
  switch (r) {
    case ncclRemoteError:
      return StatusCode::kPeer;
    case ncclSystemError:
      return StatusCode::kIo;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kInternal;
  }
}

// Pinned host memory and device memory that only grow: control-plane messages reuse them call after call.
class Staging {
 public:
  ~Staging() { Release(); }
  cudaError_t Reserve(size_t bytes) {
    if (bytes <= capacity_) return cudaSuccess;
    Release();
    const size_t want = std::max(bytes, size_t{4096});
    cudaError_t e = cudaMallocHost(&host_, want);
    if (e != cudaSuccess) return e;
    e = cudaMalloc(&device_, want);
    if (e != cudaSuccess) return e;
    capacity_ = want;
    return cudaSuccess;
  }
  char* host() const { return static_cast<char*>(host_); }
  void* device() const { return device_; }

 private:
  void Release() {
    if (host_ != nullptr) cudaFreeHost(host_);
    if (device_ != nullptr) cudaFree(device_);
    host_ = device_ = nullptr;
    capacity_ = 0;
  }
  void* host_ = nullptr;
  void* device_ = nullptr;
  size_t capacity_ = 0;
};

class NcclCommunicator final : public internal_comm::LayeredCommunicator {
 public:
  NcclCommunicator(int rank, int size, int device, ncclComm_t comm, cudaStream_t stream)
      : LayeredCommunicator("nccl", rank, size), device_(device), comm_(comm), stream_(stream) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    // Abort, not destroy: it never waits on peers, so a process can always tear down, healthy group or not.
    if (comm_ != nullptr) ncclCommAbort(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

 private:
  void OnBegin() override { cudaSetDevice(device_); }

  Status Fail(const Call& call, const std::string& what, StatusCode code, const std::string& detail) {
    return Status(code, "nccl: " + call.Describe() + " failed on " + Who() + " (" + what + "; timeout " +
                            std::to_string(call.timeout.count()) + " ms): " + detail);
  }
  Status CudaFail(const Call& call, const std::string& what, cudaError_t e) {
    return Fail(call, what, StatusCode::kInternal, std::string("CUDA error: ") + cudaGetErrorString(e));
  }
  Status NcclFail(const Call& call, const std::string& what, ncclResult_t r) {
    const char* last = ncclGetLastError(comm_);
    return Fail(call, what, CodeOf(r),
                std::string(ncclGetErrorString(r)) + (last != nullptr && *last ? std::string(": ") + last : ""));
  }

  // Waits until NCCL has no operation in progress and the stream is drained, sleeping between polls, or aborts
  // the communicator at the deadline (which also unblocks the kernels waiting on absent peers).
  Status Await(const Call& call, const std::string& what) {
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) return NcclFail(call, what, r);
      if (async != ncclSuccess && async != ncclInProgress) return NcclFail(call, what, async);
      if (async == ncclSuccess) {
        cudaError_t e = cudaStreamQuery(stream_);
        if (e == cudaSuccess) return OkStatus();
        if (e != cudaErrorNotReady) return CudaFail(call, what, e);
      }
      if (Clock::now() >= call.deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return TimeoutError("nccl: " + call.Describe() + " timed out after " + std::to_string(call.timeout.count()) +
                            " ms on " + Who() + " (" + what +
                            "); the communicator was aborted. NCCL cannot tell which rank is missing: one died, "
                            "stalled or did not call " + OpName(static_cast<uint32_t>(call.op), call.root));
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }

  // An enqueue on a non-blocking communicator returns ncclSuccess or ncclInProgress; Await() finishes both.
  Status Enqueued(const Call& call, const std::string& what, ncclResult_t r) {
    if (r == ncclSuccess || r == ncclInProgress) return OkStatus();
    return NcclFail(call, what, r);
  }

  // Every rank contributes `n` bytes at `send`; `recv` (size() * n bytes) gets them in rank order.
  Status RawAllGather(const Call& call, const void* send, size_t n, void* recv, const std::string& what) override {
    if (n > std::numeric_limits<size_t>::max() / (size() + 1)) {
      return Fail(call, what, StatusCode::kNoMemory, std::to_string(n) + " bytes per rank do not fit");
    }
    const size_t in = n, out = n * size();
    cudaError_t e = send_.Reserve(in);
    if (e == cudaSuccess) e = recv_.Reserve(out);
    if (e != cudaSuccess) return CudaFail(call, what, e);
    std::memcpy(send_.host(), send, in);
    e = cudaMemcpyAsync(send_.device(), send_.host(), in, cudaMemcpyHostToDevice, stream_);
    if (e != cudaSuccess) return CudaFail(call, what, e);
    DCKPT_RETURN_IF_ERROR(
        Enqueued(call, what, ncclAllGather(send_.device(), recv_.device(), in, ncclUint8, comm_, stream_)));
    // Pinned destination: the copy is truly asynchronous, so the wait below stays under our deadline.
    e = cudaMemcpyAsync(recv_.host(), recv_.device(), out, cudaMemcpyDeviceToHost, stream_);
    if (e != cudaSuccess) return CudaFail(call, what, e);
    DCKPT_RETURN_IF_ERROR(Await(call, what));
    std::memcpy(recv, recv_.host(), out);
    return OkStatus();
  }

  Status RawBroadcast(const Call& call, void* buf, size_t n, const std::string& what) override {
    cudaError_t e = send_.Reserve(n);
    if (e != cudaSuccess) return CudaFail(call, what, e);
    if (rank() == call.root) {
      std::memcpy(send_.host(), buf, n);
      e = cudaMemcpyAsync(send_.device(), send_.host(), n, cudaMemcpyHostToDevice, stream_);
      if (e != cudaSuccess) return CudaFail(call, what, e);
    }
    DCKPT_RETURN_IF_ERROR(Enqueued(
        call, what, ncclBroadcast(send_.device(), send_.device(), n, ncclUint8, call.root, comm_, stream_)));
    if (rank() != call.root) {
      e = cudaMemcpyAsync(send_.host(), send_.device(), n, cudaMemcpyDeviceToHost, stream_);
      if (e != cudaSuccess) return CudaFail(call, what, e);
    }
    DCKPT_RETURN_IF_ERROR(Await(call, what));
    if (rank() != call.root) std::memcpy(buf, send_.host(), n);
    return OkStatus();
  }

  const int device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  Staging send_;
  Staging recv_;
};

}  // namespace
}  // namespace internal_nccl

Result<std::unique_ptr<Communicator>> NewNcclCommunicator(Communicator* bootstrap, const NcclOptions& options) {
  using internal_nccl::Clock;
  if (bootstrap == nullptr) return InvalidArgument("nccl: a bootstrap communicator is required");
  if (options.timeout.count() <= 0) return InvalidArgument("nccl: the timeout must be positive");
  const int rank = bootstrap->rank(), size = bootstrap->size();
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
  const auto deadline = Clock::now() + options.timeout;

  int device = options.device;
  cudaError_t e = device >= 0 ? cudaSetDevice(device) : cudaGetDevice(&device);
  if (e != cudaSuccess) {
    return Unsupported("nccl: " + who + " cannot use CUDA device " + std::to_string(options.device) + ": " +
                       cudaGetErrorString(e));
  }

  // Rank 0 makes the id; everyone else gets it through the bootstrap group.
  std::string id(sizeof(ncclUniqueId), '\0');
  if (rank == 0) {
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
      return Status(internal_nccl::CodeOf(r), std::string("nccl: rank 0 cannot create a unique id: ") +
                                                  ncclGetErrorString(r));
    }
    std::memcpy(&id[0], &uid, sizeof(uid));
  }
  Status st = bootstrap->Broadcast(&id, 0, options.timeout);
  if (!st.ok()) return Status(st.code(), "nccl: broadcasting the unique id through " + bootstrap->name() + ": " +
                                             st.message());
  if (id.size() != sizeof(ncclUniqueId)) return Internal("nccl: the unique id arrived with the wrong size");
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));

  // Non-blocking, so initialisation (and later every collective) can be abandoned at a deadline.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, uid, rank, &config);
  auto nap = std::chrono::microseconds(50);
  while (r == ncclInProgress || r == ncclSuccess) {
    ncclResult_t async = ncclSuccess;
    r = ncclCommGetAsyncError(comm, &async);
    if (r != ncclSuccess) break;
    if (async != ncclInProgress) {
      r = async;
      break;
    }
    if (Clock::now() >= deadline) {
      ncclCommAbort(comm);
      return TimeoutError("nccl: " + who + " could not create the communicator on device " + std::to_string(device) +
                          " within " + std::to_string(options.timeout.count()) +
                          " ms (a rank died or stalled during ncclCommInitRank)");
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(5000));
  }
  if (r != ncclSuccess) {
    const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    if (comm != nullptr) ncclCommAbort(comm);
    return Status(internal_nccl::CodeOf(r), "nccl: " + who + " could not create the communicator on device " +
                                                std::to_string(device) + ": " + ncclGetErrorString(r) +
                                                (last != nullptr && *last ? std::string(": ") + last : ""));
  }
  cudaStream_t stream = nullptr;
  e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    ncclCommAbort(comm);
    return Internal(std::string("nccl: cannot create a CUDA stream: ") + cudaGetErrorString(e));
  }
  return std::unique_ptr<Communicator>(new internal_nccl::NcclCommunicator(rank, size, device, comm, stream));
}

}  // namespace distckpt
