#include "core/comm/collective_call.h"
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

namespace distckpt {
namespace internal_nccl {
namespace {

using internal_comm::Call;
using internal_comm::Clock;
using internal_comm::Millis;
using internal_comm::Op;
using internal_comm::OpName;

using Header = internal_comm::FixedHeader;

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

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device, ncclComm_t comm, cudaStream_t stream)
      : rank_(rank), size_(size), device_(device), comm_(comm), stream_(stream) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    // Abort, not destroy: it never waits on peers, so a process can always tear down, healthy group or not.
    if (comm_ != nullptr) ncclCommAbort(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  Status AllGather(const std::string& mine, std::vector<std::string>* all, Millis timeout) override {
    all->clear();
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(Op::kAllGather, -1, timeout, &call));
    std::vector<std::string> out;
    Status st = Finish(Guard(call, [&] { return AllGatherBytes(call, mine, &out); }));
    if (st.ok()) *all = std::move(out);
    return st;
  }

  Status Gather(const std::string& mine, int root, std::vector<std::string>* all, Millis timeout) override {
    all->clear();
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(Op::kGather, root, timeout, &call));
    std::vector<std::string> out;
    Status st = Finish(Guard(call, [&] { return AllGatherBytes(call, mine, &out); }));
    if (st.ok() && rank_ == root) *all = std::move(out);
    return st;
  }

  Status Broadcast(std::string* data, int root, Millis timeout) override {
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(Op::kBroadcast, root, timeout, &call));
    std::string received;
    Status st = Finish(Guard(call, [&]() -> Status {
      const bool is_root = rank_ == root;
      Header h = MakeHeader(call, is_root ? data->size() : 0);
      DCKPT_RETURN_IF_ERROR(BroadcastBytes(call, &h, sizeof(h), "the header"));
      if (!is_root) DCKPT_RETURN_IF_ERROR(CheckHeader(call, h, root));
      if (h.size == 0) return OkStatus();
      if (is_root) return BroadcastBytes(call, &(*data)[0], data->size(), "the payload");
      received.assign(static_cast<size_t>(h.size), '\0');
      return BroadcastBytes(call, &received[0], received.size(), "the payload");
    }));
    if (st.ok() && rank_ != root) *data = std::move(received);
    return st;
  }

  Status Barrier(Millis timeout) override {
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(Op::kBarrier, -1, timeout, &call));
    std::vector<std::string> ignored;
    return Finish(Guard(call, [&] { return AllGatherBytes(call, std::string(), &ignored); }));
  }

 private:
  std::string Who() const { return "rank " + std::to_string(rank_) + " of " + std::to_string(size_); }

  Status Begin(Op op, int root, Millis timeout, Call* call) {
    call->op = op;
    call->root = root;
    if (!broken_.ok()) {
      return Status(StatusCode::kState, "nccl: " + OpName(static_cast<uint32_t>(op), root) + " on " + Who() +
                                            " refused: the communicator is unusable after an earlier failure: " +
                                            broken_.message());
    }
    if ((op == Op::kGather || op == Op::kBroadcast) && (root < 0 || root >= size_)) {
      return InvalidArgument("nccl: " + std::string(op == Op::kGather ? "gather" : "broadcast") + " root " +
                             std::to_string(root) + " is not a rank of this group of " + std::to_string(size_) +
                             " (on " + Who() + ")");
    }
    call->seq = ++seq_;
    call->timeout = timeout.count() < 0 ? Millis(0) : timeout;
    call->deadline = Clock::now() + call->timeout;
    cudaSetDevice(device_);
    return OkStatus();
  }

  Status Finish(Status st) {
    if (!st.ok()) broken_ = st;
    return st;
  }

  template <typename F>
  Status Guard(const Call& call, F&& f) {
    try {
      return f();
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::kNoMemory, "nccl: " + call.Describe() + " on " + Who() + ": out of host memory");
    } catch (const std::exception& e) {
      return Internal("nccl: " + call.Describe() + " on " + Who() + ": " + e.what());
    }
  }

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

  // Every rank contributes `n` bytes at `send`; `recv` (size_ * n bytes) gets them in rank order.
  Status AllGatherRaw(const Call& call, const void* send, size_t n, void* recv, const std::string& what) {
    if (n > std::numeric_limits<size_t>::max() / (size_ + 1)) {
      return Fail(call, what, StatusCode::kNoMemory, std::to_string(n) + " bytes per rank do not fit");
    }
    const size_t in = n, out = n * size_;
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

  Status BroadcastBytes(const Call& call, void* buf, size_t n, const std::string& what) {
    cudaError_t e = send_.Reserve(n);
    if (e != cudaSuccess) return CudaFail(call, what, e);
    if (rank_ == call.root) {
      std::memcpy(send_.host(), buf, n);
      e = cudaMemcpyAsync(send_.device(), send_.host(), n, cudaMemcpyHostToDevice, stream_);
      if (e != cudaSuccess) return CudaFail(call, what, e);
    }
    DCKPT_RETURN_IF_ERROR(Enqueued(
        call, what, ncclBroadcast(send_.device(), send_.device(), n, ncclUint8, call.root, comm_, stream_)));
    if (rank_ != call.root) {
      e = cudaMemcpyAsync(send_.host(), send_.device(), n, cudaMemcpyDeviceToHost, stream_);
      if (e != cudaSuccess) return CudaFail(call, what, e);
    }
    DCKPT_RETURN_IF_ERROR(Await(call, what));
    if (rank_ != call.root) std::memcpy(buf, send_.host(), n);
    return OkStatus();
  }

  Header MakeHeader(const Call& call, size_t size) const {
    Header h;
    h.seq = call.seq;
    h.op = static_cast<uint32_t>(call.op);
    h.root = call.root;
    h.size = size;
    return h;
  }

  Status CheckHeader(const Call& call, const Header& h, int from) const {
    if (h.seq == call.seq && h.op == static_cast<uint32_t>(call.op) && h.root == call.root) return OkStatus();
    return InvalidArgument("nccl: collective mismatch at " + call.Describe() + ": " + Who() + " called " +
                           OpName(static_cast<uint32_t>(call.op), call.root) + " but rank " + std::to_string(from) +
                           " called " + OpName(h.op, h.root) + " #" + std::to_string(h.seq) +
                           "; every rank must call the same collectives in the same order");
  }

  Status AllGatherBytes(const Call& call, const std::string& mine, std::vector<std::string>* out) {
    const size_t n = static_cast<size_t>(size_);
    Header h = MakeHeader(call, mine.size());
    std::vector<Header> headers(n);
    DCKPT_RETURN_IF_ERROR(AllGatherRaw(call, &h, sizeof(h), headers.data(), "the sizes"));
    uint64_t max = 0;
    for (size_t r = 0; r < n; ++r) {
      DCKPT_RETURN_IF_ERROR(CheckHeader(call, headers[r], static_cast<int>(r)));
      max = std::max(max, headers[r].size);
    }
    out->assign(n, std::string());
    if (max == 0) return OkStatus();
    std::string send(static_cast<size_t>(max), '\0');
    std::memcpy(&send[0], mine.data(), mine.size());
    std::string recv(n * static_cast<size_t>(max), '\0');
    DCKPT_RETURN_IF_ERROR(AllGatherRaw(call, send.data(), send.size(), &recv[0], "the payloads"));
    for (size_t r = 0; r < n; ++r) {
      (*out)[r].assign(recv.data() + r * static_cast<size_t>(max), static_cast<size_t>(headers[r].size));
    }
    return OkStatus();
  }

  const int rank_;
  const int size_;
  const int device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  Staging send_;
  Staging recv_;
  uint64_t seq_ = 0;
  Status broken_;
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
