#include "core/comm/collective_call.h"
#include "core/comm/external/external.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <vector>

namespace distckpt {
namespace internal_external {
namespace {

using internal_comm::Call;
using internal_comm::Clock;
using internal_comm::Millis;
using internal_comm::Op;
using internal_comm::OpName;

// Sent ahead of every payload: all ranks must agree on it, which catches ranks that are in different collectives
// (and a host callback that did not fill its output).
using Header = internal_comm::FixedHeader;

class ExternalCommunicator final : public Communicator {
 public:
  explicit ExternalCommunicator(const ExternalCallbacks& cb) : cb_(cb) {}

  int rank() const override { return cb_.rank; }
  int size() const override { return cb_.size; }
  std::string name() const override { return "external"; }

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
    if (st.ok() && cb_.rank == root) *all = std::move(out);
    return st;
  }

  Status Broadcast(std::string* data, int root, Millis timeout) override {
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(Op::kBroadcast, root, timeout, &call));
    std::string received;
    Status st = Finish(Guard(call, [&]() -> Status {
      const bool is_root = cb_.rank == root;
      Header h = MakeHeader(call, is_root ? data->size() : 0);
      DCKPT_RETURN_IF_ERROR(CallBroadcast(call, &h, sizeof(h), "the header"));
      if (!is_root) DCKPT_RETURN_IF_ERROR(CheckHeader(call, h, root));
      if (h.size == 0) return OkStatus();
      if (is_root) return CallBroadcast(call, &(*data)[0], data->size(), "the payload");
      received.assign(static_cast<size_t>(h.size), '\0');
      return CallBroadcast(call, &received[0], received.size(), "the payload");
    }));
    if (st.ok() && cb_.rank != root) *data = std::move(received);
    return st;
  }

  Status Barrier(Millis timeout) override {
    Call call;
    DCKPT_RETURN_IF_ERROR(Begin(Op::kBarrier, -1, timeout, &call));
    return Finish(Guard(call, [&]() -> Status {
      if (cb_.barrier != nullptr) {
        return Invoke(call, "barrier", "", [&](uint64_t ms) { return cb_.barrier(ms, cb_.user_data); });
      }
      const char one = 1;
      std::string all(static_cast<size_t>(cb_.size), '\0');
      return CallAllGather(call, &one, 1, &all[0], "the barrier byte");
    }));
  }

 private:
  Status Begin(Op op, int root, Millis timeout, Call* call) {
    call->op = op;
    call->root = root;
    if (!broken_.ok()) {
      return Status(StatusCode::kState, "external: " + OpName(static_cast<uint32_t>(op), root) + " on " + Who() +
                                            " refused: the communicator is unusable after an earlier failure: " +
                                            broken_.message());
    }
    if ((op == Op::kGather || op == Op::kBroadcast) && (root < 0 || root >= cb_.size)) {
      return InvalidArgument("external: " + std::string(op == Op::kGather ? "gather" : "broadcast") + " root " +
                             std::to_string(root) + " is not a rank of this group of " + std::to_string(cb_.size) +
                             " (on " + Who() + ")");
    }
    call->seq = ++seq_;
    call->timeout = timeout.count() < 0 ? Millis(0) : timeout;
    call->deadline = Clock::now() + call->timeout;
    return OkStatus();
  }

  // A failure leaves the ranks at different steps of the layered protocol, so the communicator cannot be reused.
  Status Finish(Status st) {
    if (!st.ok()) broken_ = st;
    return st;
  }

  template <typename F>
  Status Guard(const Call& call, F&& f) {
    try {
      return f();
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::kNoMemory, "external: " + call.Describe() + " on " + Who() + ": out of memory");
    } catch (const std::exception& e) {
      return Internal("external: " + call.Describe() + " on " + Who() + ": " + e.what());
    }
  }

  std::string Who() const { return "rank " + std::to_string(cb_.rank) + " of " + std::to_string(cb_.size); }

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
    return InvalidArgument("external: collective mismatch at " + call.Describe() + ": " + Who() + " called " +
                           OpName(static_cast<uint32_t>(call.op), call.root) + " but rank " + std::to_string(from) +
                           " sent " + OpName(h.op, h.root) + " #" + std::to_string(h.seq) +
                           " (every rank must call the same collectives in the same order, and the host's callbacks "
                           "must deliver every rank's bytes)");
  }

  // Runs one callback with what is left of the call's timeout (at least 1 ms: 0 often means "no limit").
  template <typename F>
  Status Invoke(const Call& call, const char* callback, const std::string& what, F&& f) {
    const std::string during = " on " + Who() + " during " + call.Describe() + (what.empty() ? "" : " (" + what + ")") +
                               "; timeout " + std::to_string(call.timeout.count()) + " ms";
    const auto left = std::chrono::duration_cast<Millis>(call.deadline - Clock::now());
    if (left.count() <= 0 && call.timeout.count() > 0) {
      return TimeoutError(std::string("external: out of time before the ") + callback + " callback" + during);
    }
    const uint64_t ms = static_cast<uint64_t>(std::max<int64_t>(1, left.count()));
    int rc = 0;
    try {
      rc = f(ms);
    } catch (...) {
      // A C++ host may throw through the callback; nothing may escape the communicator.
      return Status(StatusCode::kUser, std::string("external ") + callback + " callback threw an exception" + during);
    }
    if (rc != 0) {
      return Status(StatusCode::kUser,
                    std::string("external ") + callback + " callback returned " + std::to_string(rc) + during);
    }
    return OkStatus();
  }

  Status CallAllGather(const Call& call, const void* send, size_t n, void* recv, const std::string& what) {
    return Invoke(call, "allgather", what,
                  [&](uint64_t ms) { return cb_.allgather(send, n, recv, ms, cb_.user_data); });
  }

  Status CallBroadcast(const Call& call, void* buf, size_t n, const std::string& what) {
    return Invoke(call, "broadcast", what,
                  [&](uint64_t ms) { return cb_.broadcast(buf, n, call.root, ms, cb_.user_data); });
  }

  Status AllGatherBytes(const Call& call, const std::string& mine, std::vector<std::string>* out) {
    const size_t n = static_cast<size_t>(cb_.size);
    Header h = MakeHeader(call, mine.size());
    std::vector<Header> headers(n);
    DCKPT_RETURN_IF_ERROR(CallAllGather(call, &h, sizeof(h), headers.data(), "the sizes"));
    uint64_t max = 0;
    for (size_t r = 0; r < n; ++r) {
      DCKPT_RETURN_IF_ERROR(CheckHeader(call, headers[r], static_cast<int>(r)));
      max = std::max(max, headers[r].size);
    }
    out->assign(n, std::string());
    if (max == 0) return OkStatus();
    if (max > std::numeric_limits<size_t>::max() / n) {
      return Status(StatusCode::kNoMemory, "external: " + call.Describe() + " on " + Who() + ": " +
                                               std::to_string(n) + " contributions padded to " + std::to_string(max) +
                                               " bytes do not fit in memory");
    }
    std::string send(static_cast<size_t>(max), '\0');
    std::memcpy(&send[0], mine.data(), mine.size());
    std::string recv(n * static_cast<size_t>(max), '\0');
    DCKPT_RETURN_IF_ERROR(CallAllGather(call, send.data(), send.size(), &recv[0], "the payloads"));
    for (size_t r = 0; r < n; ++r) {
      (*out)[r].assign(recv.data() + r * static_cast<size_t>(max), static_cast<size_t>(headers[r].size));
    }
    return OkStatus();
  }

  const ExternalCallbacks cb_;
  uint64_t seq_ = 0;
  Status broken_;
};

}  // namespace
}  // namespace internal_external

Result<std::unique_ptr<Communicator>> NewExternalCommunicator(const ExternalCallbacks& callbacks) {
  if (callbacks.size < 1) {
    return InvalidArgument("external: size " + std::to_string(callbacks.size) + " is not positive");
  }
  if (callbacks.rank < 0 || callbacks.rank >= callbacks.size) {
    return InvalidArgument("external: rank " + std::to_string(callbacks.rank) + " is not in [0, " +
                           std::to_string(callbacks.size) + ")");
  }
  if (callbacks.allgather == nullptr) return InvalidArgument("external: the allgather callback is required (NULL)");
  if (callbacks.broadcast == nullptr) return InvalidArgument("external: the broadcast callback is required (NULL)");
  return std::unique_ptr<Communicator>(new internal_external::ExternalCommunicator(callbacks));
}

}  // namespace distckpt
