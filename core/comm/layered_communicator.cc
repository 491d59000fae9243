#include "core/comm/layered_communicator.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <new>

namespace distckpt {
namespace internal_comm {

Status LayeredCommunicator::AllGather(const std::string& mine, std::vector<std::string>* all, Millis timeout) {
  all->clear();
  Call call;
  DCKPT_RETURN_IF_ERROR(Begin(Op::kAllGather, -1, timeout, &call));
  std::vector<std::string> out;
  Status st = Finish(Guard(call, [&] { return AllGatherBytes(call, mine, &out); }));
  if (st.ok()) *all = std::move(out);
  return st;
}

Status LayeredCommunicator::Gather(const std::string& mine, int root, std::vector<std::string>* all,
                                   Millis timeout) {
  all->clear();
  Call call;
  DCKPT_RETURN_IF_ERROR(Begin(Op::kGather, root, timeout, &call));
  std::vector<std::string> out;
  Status st = Finish(Guard(call, [&] { return AllGatherBytes(call, mine, &out); }));
  if (st.ok() && rank_ == root) *all = std::move(out);
  return st;
}

Status LayeredCommunicator::Broadcast(std::string* data, int root, Millis timeout) {
  Call call;
  DCKPT_RETURN_IF_ERROR(Begin(Op::kBroadcast, root, timeout, &call));
  std::string received;
  Status st = Finish(Guard(call, [&]() -> Status {
    const bool is_root = rank_ == root;
    FixedHeader h = MakeHeader(call, is_root ? data->size() : 0);
    DCKPT_RETURN_IF_ERROR(RawBroadcast(call, &h, sizeof(h), "the header"));
    if (!is_root) DCKPT_RETURN_IF_ERROR(CheckHeader(call, h, root));
    if (h.size == 0) return OkStatus();
    if (is_root) return RawBroadcast(call, &(*data)[0], data->size(), "the payload");
    received.assign(static_cast<size_t>(h.size), '\0');
    return RawBroadcast(call, &received[0], received.size(), "the payload");
  }));
  if (st.ok() && rank_ != root) *data = std::move(received);
  return st;
}

Status LayeredCommunicator::Barrier(Millis timeout) {
  Call call;
  DCKPT_RETURN_IF_ERROR(Begin(Op::kBarrier, -1, timeout, &call));
  return Finish(Guard(call, [&] { return RawBarrier(call); }));
}

Status LayeredCommunicator::RawBarrier(const Call& call) {
  const char one = 1;
  std::string all(static_cast<size_t>(size_), '\0');
  return RawAllGather(call, &one, 1, &all[0], "the barrier byte");
}

Status LayeredCommunicator::Begin(Op op, int root, Millis timeout, Call* call) {
  call->op = op;
  call->root = root;
  if (!broken_.ok()) {
    return Status(StatusCode::kState, backend_ + ": " + OpName(static_cast<uint32_t>(op), root) + " on " + Who() +
                                          " refused: the communicator is unusable after an earlier failure: " +
                                          broken_.message());
  }
  if ((op == Op::kGather || op == Op::kBroadcast) && (root < 0 || root >= size_)) {
    return InvalidArgument(backend_ + ": " + std::string(op == Op::kGather ? "gather" : "broadcast") + " root " +
                           std::to_string(root) + " is not a rank of this group of " + std::to_string(size_) +
                           " (on " + Who() + ")");
  }
  call->seq = ++seq_;
  call->timeout = timeout.count() < 0 ? Millis(0) : timeout;
  call->deadline = Clock::now() + call->timeout;
  OnBegin();
  return OkStatus();
}

Status LayeredCommunicator::Finish(Status st) {
  if (!st.ok()) broken_ = st;
  return st;
}

template <typename F>
Status LayeredCommunicator::Guard(const Call& call, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kNoMemory, backend_ + ": " + call.Describe() + " on " + Who() + ": out of memory");
  } catch (const std::exception& e) {
    return Internal(backend_ + ": " + call.Describe() + " on " + Who() + ": " + e.what());
  }
}

FixedHeader LayeredCommunicator::MakeHeader(const Call& call, size_t size) const {
  FixedHeader h;
  h.seq = call.seq;
  h.op = static_cast<uint32_t>(call.op);
  h.root = call.root;
  h.size = size;
  return h;
}

Status LayeredCommunicator::CheckHeader(const Call& call, const FixedHeader& h, int from) const {
  if (h.seq == call.seq && h.op == static_cast<uint32_t>(call.op) && h.root == call.root) return OkStatus();
  return InvalidArgument(backend_ + ": collective mismatch at " + call.Describe() + ": " + Who() + " called " +
                         OpName(static_cast<uint32_t>(call.op), call.root) + " but rank " + std::to_string(from) +
                         " sent " + OpName(h.op, h.root) + " #" + std::to_string(h.seq) +
                         " (every rank must call the same collectives in the same order, and the transport must "
                         "deliver every rank's bytes)");
}

Status LayeredCommunicator::AllGatherBytes(const Call& call, const std::string& mine, std::vector<std::string>* out) {
  const size_t n = static_cast<size_t>(size_);
  FixedHeader h = MakeHeader(call, mine.size());
  std::vector<FixedHeader> headers(n);
  DCKPT_RETURN_IF_ERROR(RawAllGather(call, &h, sizeof(h), headers.data(), "the sizes"));
  uint64_t max = 0;
  for (size_t r = 0; r < n; ++r) {
    DCKPT_RETURN_IF_ERROR(CheckHeader(call, headers[r], static_cast<int>(r)));
    max = std::max(max, headers[r].size);
  }
  out->assign(n, std::string());
  if (max == 0) return OkStatus();
  if (max > std::numeric_limits<size_t>::max() / n) {
    return Status(StatusCode::kNoMemory, backend_ + ": " + call.Describe() + " on " + Who() + ": " +
                                             std::to_string(n) + " contributions padded to " + std::to_string(max) +
                                             " bytes do not fit in memory");
  }
  // Padded to the largest contribution: the primitive moves the same number of bytes on every rank.
  std::string send(static_cast<size_t>(max), '\0');
  std::memcpy(&send[0], mine.data(), mine.size());
  std::string recv(n * static_cast<size_t>(max), '\0');
  DCKPT_RETURN_IF_ERROR(RawAllGather(call, send.data(), send.size(), &recv[0], "the payloads"));
  for (size_t r = 0; r < n; ++r) {
    (*out)[r].assign(recv.data() + r * static_cast<size_t>(max), static_cast<size_t>(headers[r].size));
  }
  return OkStatus();
}

}  // namespace internal_comm
}  // namespace distckpt
