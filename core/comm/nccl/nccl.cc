#include "core/comm/nccl/nccl.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/collective_call.h"
#include "core/comm/layered_communicator.h"
#include "core/comm/nccl/nccl_library.h"
#include "core/cuda/cuda_driver.h"

namespace distckpt {
namespace internal_nccl {
namespace {

using cuda::CUcontext;
using cuda::CudaDriver;
using cuda::CUdevice;
using cuda::CUdeviceptr;
using cuda::CUresult;
using cuda::CUstream;
using internal_comm::Call;
using internal_comm::Clock;
using internal_comm::Millis;
using internal_comm::OpName;
using nccl::NcclLibrary;
using nccl::ncclComm_t;
using nccl::ncclResult_t;

constexpr CUresult kCudaErrorOutOfMemory = 2;  // CUDA_ERROR_OUT_OF_MEMORY (checked in nccl_library_abi_test)

StatusCode CodeOf(ncclResult_t r) {
  switch (r) {
    case nccl::kRemoteError:
      return StatusCode::kPeer;
    case nccl::kSystemError:
      return StatusCode::kIo;
    case nccl::kInvalidArgument:
    case nccl::kInvalidUsage:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kInternal;
  }
}

// Makes `ctx` current on the calling thread for the scope and restores the previous context after. NCCL (and every
// driver call below) works on the current context: the device's primary context, the one the CUDA runtime and
// frameworks use, so buffers and streams are shared with them.
class ScopedContext {
 public:
  ScopedContext(const CudaDriver* d, CUcontext ctx)
      : d_(d), status_(d->Check(d->cuCtxPushCurrent(ctx), "cuCtxPushCurrent")) {}
  ~ScopedContext() {
    CUcontext popped;
    if (status_.ok()) (void)d_->cuCtxPopCurrent(&popped);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  const Status& status() const { return status_; }

 private:
  const CudaDriver* d_;
  Status status_;
};

// Pinned host memory and device memory that only grow: control-plane messages reuse them call after call. Every
// method runs with the communicator's context current.
class Staging {
 public:
  explicit Staging(const CudaDriver* d) : d_(d) {}
  ~Staging() { Release(); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  CUresult Reserve(size_t bytes) {
    if (bytes <= capacity_) return cuda::kCudaSuccess;
    Release();
    const size_t want = std::max(bytes, size_t{4096});
    CUresult r = d_->cuMemHostAlloc(&host_, want, 0);
    if (r != cuda::kCudaSuccess) {
      host_ = nullptr;
      return r;
    }
    r = d_->cuMemAlloc(&device_, want);
    if (r != cuda::kCudaSuccess) {
      device_ = 0;
      return r;
    }
    capacity_ = want;
    return cuda::kCudaSuccess;
  }
  char* host() const { return static_cast<char*>(host_); }
  CUdeviceptr device() const { return device_; }
  void* device_ptr() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(device_)); }

  void Release() {
    if (host_ != nullptr) (void)d_->cuMemFreeHost(host_);
    if (device_ != 0) (void)d_->cuMemFree(device_);
    host_ = nullptr;
    device_ = 0;
    capacity_ = 0;
  }

 private:
  const CudaDriver* d_;
  void* host_ = nullptr;
  CUdeviceptr device_ = 0;
  size_t capacity_ = 0;
};

class NcclCommunicator final : public internal_comm::LayeredCommunicator {
 public:
  NcclCommunicator(const NcclLibrary* n, const CudaDriver* d, int rank, int size, int device, CUcontext ctx,
                   ncclComm_t comm, CUstream stream, Millis teardown_timeout)
      : LayeredCommunicator("nccl", rank, size),
        n_(n),
        d_(d),
        device_(device),
        ctx_(ctx),
        teardown_timeout_(teardown_timeout),
        comm_(comm),
        stream_(stream),
        send_(d),
        recv_(d) {}

  // A healthy group finalizes and destroys (Finalize); after a failure, or when finalizing fails or does not finish by
  // the deadline, the communicator is aborted, which waits on no peer, so a process can always tear down. Either way
  // the stream is synchronized before the staging memory is freed and the stream destroyed: after an abort the
  // collective's kernels (told to stop) and the copies queued behind them may still be running, on that memory.
  // NCCL kernels launched from a background thread would run beside the application's own NCCL work on its other
  // communicators, in an order that differs from rank to rank, which NCCL documents as deadlock-prone ("Using
  // multiple NCCL communicators concurrently"); and the staging's cuMemAlloc/cuMemFree can synchronize the device
  // in the middle of a collective.
  Status CheckBackgroundUse() const override {
    return Unsupported(
        "nccl: the NCCL communicator cannot run an asynchronous save's collectives: they would run on a background "
        "thread, launching NCCL kernels while the application launches its own on other communicators in a "
        "different order on each rank (NCCL documents this as deadlock-prone), and its staging allocations can "
        "synchronize the device mid-collective. Pass a host communicator for asynchronous saves, such as the Gloo "
        "communicator this one was bootstrapped over, or save synchronously over this one");
  }

  ~NcclCommunicator() override {
    ScopedContext scope(d_, ctx_);
    if (comm_ != nullptr && !Finalize()) (void)n_->ncclCommAbort(comm_);
    comm_ = nullptr;
    if (stream_ != nullptr) (void)d_->cuStreamSynchronize(stream_);
    send_.Release();
    recv_.Release();
    if (stream_ != nullptr) (void)d_->cuStreamDestroy(stream_);
  }

 private:
  // NCCL's documented shutdown of a healthy non-blocking communicator: ncclCommFinalize flushes what was issued and
  // leaves the state ncclInProgress until every rank has finalized and the group is quiescent; ncclCommGetAsyncError
  // is polled until it leaves ncclInProgress, and once it is ncclSuccess ncclCommDestroy frees the local rest without
  // blocking. True when the communicator was destroyed that way. False, leaving it to be aborted, after a failed
  // collective (the ranks may be at different steps: finalizing could wait on a peer that never comes), when finalize
  // fails or is still in progress after teardown_timeout_ (NcclOptions::timeout: a peer died or never tears down), or
  // with a library lacking ncclCommFinalize/ncclCommDestroy (the old behaviour: abort alone).
  bool Finalize() {
    if (broken() || n_->ncclCommFinalize == nullptr || n_->ncclCommDestroy == nullptr) return false;
    const auto deadline = Clock::now() + teardown_timeout_;
    ncclResult_t r = n_->ncclCommFinalize(comm_);
    if (r != nccl::kSuccess && r != nccl::kInProgress) return false;
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      ncclResult_t async = nccl::kSuccess;
      if (n_->ncclCommGetAsyncError(comm_, &async) != nccl::kSuccess) return false;
      if (async == nccl::kSuccess) break;
      if (async != nccl::kInProgress || Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(5000));
    }
    // Destroy after a completed finalize only frees local resources; the handle is gone whatever it returns.
    (void)n_->ncclCommDestroy(comm_);
    return true;
  }

  Status Fail(const Call& call, const std::string& what, StatusCode code, const std::string& detail) {
    return Status(code, "nccl: " + call.Describe() + " failed on " + Who() + " (device " + std::to_string(device_) +
                            ", " + what + "; timeout " + std::to_string(call.timeout.count()) + " ms): " + detail);
  }
  Status CudaFail(const Call& call, const std::string& what, const char* op, CUresult r) {
    return Fail(call, what, r == kCudaErrorOutOfMemory ? StatusCode::kNoMemory : StatusCode::kInternal,
                std::string(op) + ": " + d_->ErrorString(r));
  }
  Status NcclFail(const Call& call, const std::string& what, ncclResult_t r) {
    return Fail(call, what, CodeOf(r), n_->ErrorString(r, comm_));
  }

  // Waits until NCCL has no operation in progress (and, with `drain`, the stream is drained too), sleeping between
  // polls, or aborts the communicator at the deadline (which also unblocks the kernels waiting on absent peers).
  // A non-blocking communicator may finish enqueueing a collective in the background (the call returned
  // ncclInProgress): the collective is on the stream only once the async state is ncclSuccess, so work that must
  // follow it on the stream is queued after Await(call, what, /*drain=*/false).
  Status Await(const Call& call, const std::string& what, bool drain) {
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      ncclResult_t async = nccl::kSuccess;
      ncclResult_t r = n_->ncclCommGetAsyncError(comm_, &async);
      if (r != nccl::kSuccess) return NcclFail(call, what, r);
      if (async != nccl::kSuccess && async != nccl::kInProgress) return NcclFail(call, what, async);
      if (async == nccl::kSuccess) {
        if (!drain) return OkStatus();
        CUresult e = d_->cuStreamQuery(stream_);
        if (e == cuda::kCudaSuccess) return OkStatus();
        if (e != cuda::kCudaErrorNotReady) return CudaFail(call, what, "cuStreamQuery", e);
      }
      if (Clock::now() >= call.deadline) {
        (void)n_->ncclCommAbort(comm_);
        comm_ = nullptr;
        return TimeoutError("nccl: " + call.Describe() + " timed out after " + std::to_string(call.timeout.count()) +
                            " ms on " + Who() + " (" + what +
                            "); the communicator was aborted. NCCL cannot tell which rank is missing: one died, "
                            "stalled or did not call " +
                            OpName(static_cast<uint32_t>(call.op), call.root));
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }

  // An enqueue on a non-blocking communicator returns ncclSuccess or ncclInProgress; Await() finishes both.
  Status Enqueued(const Call& call, const std::string& what, ncclResult_t r) {
    if (r == nccl::kSuccess || r == nccl::kInProgress) return OkStatus();
    return NcclFail(call, what, r);
  }

  // Every rank contributes `n` bytes at `send`; `recv` (size() * n bytes) gets them in rank order.
  Status RawAllGather(const Call& call, const void* send, size_t n, void* recv, const std::string& what) override {
    if (n > std::numeric_limits<size_t>::max() / (size() + 1)) {
      return Fail(call, what, StatusCode::kNoMemory, std::to_string(n) + " bytes per rank do not fit");
    }
    if (comm_ == nullptr) return Fail(call, what, StatusCode::kState, "the communicator was aborted");
    ScopedContext scope(d_, ctx_);
    if (!scope.status().ok()) return Fail(call, what, StatusCode::kInternal, scope.status().message());
    const size_t in = n, out = n * size();
    if (CUresult e = send_.Reserve(in); e != cuda::kCudaSuccess) return CudaFail(call, what, "cuMemAlloc", e);
    if (CUresult e = recv_.Reserve(out); e != cuda::kCudaSuccess) return CudaFail(call, what, "cuMemAlloc", e);
    std::memcpy(send_.host(), send, in);
    if (CUresult e = d_->cuMemcpyHtoDAsync(send_.device(), send_.host(), in, stream_); e != cuda::kCudaSuccess) {
      return CudaFail(call, what, "cuMemcpyHtoDAsync", e);
    }
    DCKPT_RETURN_IF_ERROR(Enqueued(
        call, what, n_->ncclAllGather(send_.device_ptr(), recv_.device_ptr(), in, nccl::kUint8, comm_, stream_)));
    DCKPT_RETURN_IF_ERROR(Await(call, what, /*drain=*/false));
    // Pinned destination: the copy is truly asynchronous, so the wait below stays under our deadline.
    if (CUresult e = d_->cuMemcpyDtoHAsync(recv_.host(), recv_.device(), out, stream_); e != cuda::kCudaSuccess) {
      return CudaFail(call, what, "cuMemcpyDtoHAsync", e);
    }
    DCKPT_RETURN_IF_ERROR(Await(call, what, /*drain=*/true));
    std::memcpy(recv, recv_.host(), out);
    return OkStatus();
  }

  Status RawBroadcast(const Call& call, void* buf, size_t n, const std::string& what) override {
    if (comm_ == nullptr) return Fail(call, what, StatusCode::kState, "the communicator was aborted");
    ScopedContext scope(d_, ctx_);
    if (!scope.status().ok()) return Fail(call, what, StatusCode::kInternal, scope.status().message());
    if (CUresult e = send_.Reserve(n); e != cuda::kCudaSuccess) return CudaFail(call, what, "cuMemAlloc", e);
    if (rank() == call.root) {
      std::memcpy(send_.host(), buf, n);
      if (CUresult e = d_->cuMemcpyHtoDAsync(send_.device(), send_.host(), n, stream_); e != cuda::kCudaSuccess) {
        return CudaFail(call, what, "cuMemcpyHtoDAsync", e);
      }
    }
    DCKPT_RETURN_IF_ERROR(Enqueued(call, what,
                                   n_->ncclBroadcast(send_.device_ptr(), send_.device_ptr(), n, nccl::kUint8,
                                                     call.root, comm_, stream_)));
    DCKPT_RETURN_IF_ERROR(Await(call, what, /*drain=*/false));
    if (rank() != call.root) {
      if (CUresult e = d_->cuMemcpyDtoHAsync(send_.host(), send_.device(), n, stream_); e != cuda::kCudaSuccess) {
        return CudaFail(call, what, "cuMemcpyDtoHAsync", e);
      }
    }
    DCKPT_RETURN_IF_ERROR(Await(call, what, /*drain=*/true));
    if (rank() != call.root) std::memcpy(buf, send_.host(), n);
    return OkStatus();
  }

  const NcclLibrary* const n_;
  const CudaDriver* const d_;
  const int device_;
  const CUcontext ctx_;
  const Millis teardown_timeout_;  // bounds Finalize
  ncclComm_t comm_;
  CUstream stream_;
  Staging send_;
  Staging recv_;
};

// What one rank brings to the exchange: NCCL, the driver and its device's primary context, and (rank 0) the id.
struct Local {
  const NcclLibrary* n = nullptr;
  const CudaDriver* d = nullptr;
  int device = -1;
  CUcontext ctx = nullptr;
  nccl::ncclUniqueId id{};
};

// The ordinal of the device a CUdevice handle names (cuCtxGetDevice gives a handle, which need not be the ordinal).
Result<int> OrdinalOf(const CudaDriver* d, CUdevice handle, int count) {
  for (int i = 0; i < count; ++i) {
    CUdevice h = 0;
    DCKPT_RETURN_IF_ERROR(d->Check(d->cuDeviceGet(&h, i), "cuDeviceGet(" + std::to_string(i) + ")"));
    if (h == handle) return i;
  }
  return Internal("the current CUDA context's device is none of the " + std::to_string(count) + " visible devices");
}

// The device of a rank that did not name one (`requested` < 0): the calling thread's current context's (a framework's,
// after torch.cuda.set_device), else LOCAL_RANK's (torchrun, and most launchers, set it), else the only one. With
// several GPUs and none of those every rank would take GPU 0 (and NCCL then fails on duplicate GPUs), so that is an
// error saying what to set.
Result<int> ChooseDevice(const CudaDriver* d, int requested, int count) {
  if (requested >= 0) return requested;
  CUdevice current = 0;
  if (d->cuCtxGetDevice(&current) == cuda::kCudaSuccess) return OrdinalOf(d, current, count);
  for (const char* var : {"DCKPT_LOCAL_RANK", "LOCAL_RANK"}) {
    const char* value = std::getenv(var);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long local = std::strtol(value, &end, 10);
    if (*end != '\0' || local < 0 || local >= count) {
      return InvalidArgument(std::string(var) + "=" + value + " does not name one of the " + std::to_string(count) +
                             " visible CUDA devices: pass the device explicitly");
    }
    return static_cast<int>(local);
  }
  if (count == 1) return 0;
  return InvalidArgument("no CUDA device given, no current CUDA context on this thread and no LOCAL_RANK in the "
                         "environment, with " + std::to_string(count) + " devices visible: every rank would take "
                         "device 0. Pass the device (NcclOptions::device, dckpt_nccl_options.device), make the rank's "
                         "device current first (torch.cuda.set_device), or set LOCAL_RANK");
}

// NCCL first (loading it touches no device), then the driver, the device and its primary context.
Status PrepareLocal(int rank, const NcclOptions& options, Local* out) {
  DCKPT_ASSIGN_OR_RETURN(out->n, nccl::LoadNcclLibrary());
  auto driver = cuda::LoadCudaDriver();
  if (!driver.ok()) {
    return Status(driver.status().code(), "the NCCL communicator needs the CUDA driver: " + driver.status().message());
  }
  out->d = *driver;
  const CudaDriver* d = out->d;
  int count = 0;
  DCKPT_RETURN_IF_ERROR(d->Check(d->cuDeviceGetCount(&count), "cuDeviceGetCount"));
  if (count <= 0) return Unsupported("no CUDA device is visible (CUDA_VISIBLE_DEVICES?)");
  DCKPT_ASSIGN_OR_RETURN(int device, ChooseDevice(d, options.device, count));
  if (device >= count) {
    return InvalidArgument("CUDA device " + std::to_string(device) + " does not exist: " + std::to_string(count) +
                           " device(s) are visible");
  }
  out->device = device;
  CUdevice dev = 0;
  DCKPT_RETURN_IF_ERROR(d->Check(d->cuDeviceGet(&dev, device), "cuDeviceGet(" + std::to_string(device) + ")"));
  // Retained for the life of the process, as the copy engine does: the runtime and frameworks share it.
  DCKPT_RETURN_IF_ERROR(d->Check(d->cuDevicePrimaryCtxRetain(&out->ctx, dev), "cuDevicePrimaryCtxRetain"));
  if (rank == 0) {
    ScopedContext scope(d, out->ctx);
    DCKPT_RETURN_IF_ERROR(scope.status());
    ncclResult_t r = out->n->ncclGetUniqueId(&out->id);
    if (r != nccl::kSuccess) {
      return Status(CodeOf(r), "ncclGetUniqueId failed: " + out->n->ErrorString(r, nullptr));
    }
  }
  return OkStatus();
}

// The exchange's message: a 4-byte status code, then rank 0's unique id (OK) or the error message.
std::string Encode(const Status& st, const Local& local, int rank) {
  const int32_t code = static_cast<int32_t>(st.code());
  std::string out(reinterpret_cast<const char*>(&code), sizeof(code));
  if (!st.ok()) {
    out += st.message();
  } else if (rank == 0) {
    out.append(local.id.internal, sizeof(local.id.internal));
  }
  return out;
}

}  // namespace
}  // namespace internal_nccl

Result<std::unique_ptr<Communicator>> NewNcclCommunicator(Communicator* bootstrap, const NcclOptions& options) {
  using namespace internal_nccl;  // NOLINT: the helpers above
  if (bootstrap == nullptr) return InvalidArgument("nccl: a bootstrap communicator is required");
  if (options.timeout.count() <= 0) return InvalidArgument("nccl: the timeout must be positive");
  const int rank = bootstrap->rank(), size = bootstrap->size();
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
  const auto deadline = Clock::now() + options.timeout;

  // Every rank says whether it is ready (and rank 0 adds the id), so that a rank without NCCL, a driver or its device
  // makes every rank fail at once, naming it, instead of leaving the others in ncclCommInitRank until the timeout.
  Local local;
  const Status ready = PrepareLocal(rank, options, &local);
  std::vector<std::string> all;
  Status st = bootstrap->AllGather(Encode(ready, local, rank), &all, options.timeout);
  if (!st.ok()) {
    return Status(st.code(), "nccl: " + who + ": exchanging the unique id through " + bootstrap->name() + ": " +
                                 st.message() + (ready.ok() ? "" : " (and locally: " + ready.message() + ")"));
  }
  if (!ready.ok()) {
    return Status(ready.code(), "nccl: " + who + " cannot create the communicator: " + ready.message());
  }
  if (all.size() != static_cast<size_t>(size)) return Internal("nccl: the id exchange returned the wrong count");
  for (int r = 0; r < size; ++r) {
    int32_t code = 0;
    if (all[r].size() < sizeof(code)) return Internal("nccl: rank " + std::to_string(r) + " sent a short message");
    std::memcpy(&code, all[r].data(), sizeof(code));
    if (code != 0) {
      return Status(StatusCode::kPeer, "nccl: " + who + " cannot create the communicator because rank " +
                                           std::to_string(r) + " cannot: " + all[r].substr(sizeof(code)));
    }
  }
  if (all[0].size() != sizeof(int32_t) + sizeof(nccl::ncclUniqueId)) {
    return Internal("nccl: the unique id arrived with the wrong size");
  }
  nccl::ncclUniqueId uid;
  std::memcpy(&uid, all[0].data() + sizeof(int32_t), sizeof(uid));

  const NcclLibrary* n = local.n;
  const cuda::CudaDriver* d = local.d;
  const std::string where = who + " on device " + std::to_string(local.device);
  ScopedContext scope(d, local.ctx);
  if (!scope.status().ok()) return Status(scope.status().code(), "nccl: " + where + ": " + scope.status().message());

  // Non-blocking, so initialisation (and later every collective) can be abandoned at a deadline.
  nccl::ncclConfig_t config = nccl::ConfigInitializer();
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = n->ncclCommInitRankConfig(&comm, size, uid, rank, &config);
  auto nap = std::chrono::microseconds(50);
  while (comm != nullptr && (r == nccl::kInProgress || r == nccl::kSuccess)) {
    ncclResult_t async = nccl::kSuccess;
    r = n->ncclCommGetAsyncError(comm, &async);
    if (r != nccl::kSuccess) break;
    if (async != nccl::kInProgress) {
      r = async;
      break;
    }
    if (Clock::now() >= deadline) {
      (void)n->ncclCommAbort(comm);
      return TimeoutError("nccl: " + where + " could not create the communicator within " +
                          std::to_string(options.timeout.count()) +
                          " ms (a rank died or stalled during ncclCommInitRank)");
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(5000));
  }
  if (r != nccl::kSuccess || comm == nullptr) {
    if (r == nccl::kSuccess) r = nccl::kInternalError;  // success without a communicator: never seen
    Status failed(CodeOf(r), "nccl: " + where + " could not create the communicator (NCCL " +
                                 nccl::VersionString(n->version) + "): " + n->ErrorString(r, comm));
    if (comm != nullptr) (void)n->ncclCommAbort(comm);
    return failed;
  }
  CUstream stream = nullptr;
  if (CUresult e = d->cuStreamCreate(&stream, cuda::kStreamNonBlocking); e != cuda::kCudaSuccess) {
    (void)n->ncclCommAbort(comm);
    return Internal("nccl: " + where + ": cuStreamCreate failed: " + d->ErrorString(e));
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(n, d, rank, size, local.device, local.ctx, comm, stream, options.timeout));
}

}  // namespace distckpt
