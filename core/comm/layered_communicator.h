// A communicator whose variable-size collectives are layered on two fixed-size primitives supplied by a backend:
// an allgather of n bytes per rank and a broadcast of n bytes. The external (host callbacks) and NCCL backends are
// built this way. Every payload is preceded by a header all ranks must agree on, which catches ranks that are in
// different collectives. Internal to core/comm.
#ifndef DISTCKPT_CORE_COMM_LAYERED_COMMUNICATOR_H_
#define DISTCKPT_CORE_COMM_LAYERED_COMMUNICATOR_H_

#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/comm/collective_call.h"
#include "core/comm/communicator.h"

namespace distckpt {
namespace internal_comm {

class LayeredCommunicator : public Communicator {
 public:
  /// `backend` names the backend in every error ("external", "nccl").
  LayeredCommunicator(std::string backend, int rank, int size)
      : backend_(std::move(backend)), rank_(rank), size_(size) {}

  int rank() const final { return rank_; }
  int size() const final { return size_; }
  std::string name() const final { return backend_; }

  Status AllGather(const std::string& mine, std::vector<std::string>* all, Millis timeout) final;
  Status Gather(const std::string& mine, int root, std::vector<std::string>* all, Millis timeout) final;
  Status Broadcast(std::string* data, int root, Millis timeout) final;
  Status Barrier(Millis timeout) final;

 protected:
  /// Every rank contributes `n` bytes at `send` (the same n on every rank); `recv` (size() * n bytes) receives them
  /// in rank order. `what` says which part of the collective this is, for error messages.
  virtual Status RawAllGather(const Call& call, const void* send, size_t n, void* recv, const std::string& what) = 0;
  /// `n` bytes of `buf` travel from call.root to every other rank.
  virtual Status RawBroadcast(const Call& call, void* buf, size_t n, const std::string& what) = 0;
  /// Default: an allgather of one byte.
  virtual Status RawBarrier(const Call& call);
  /// Called at the start of every collective, after the checks (NCCL selects its device here).
  virtual void OnBegin() {}

  /// "rank R of N".
  std::string Who() const { return "rank " + std::to_string(rank_) + " of " + std::to_string(size_); }
  const std::string& backend() const { return backend_; }
  /// True once a collective has failed (every later one is refused with kState): the ranks may be at different steps,
  /// so a backend tears down without waiting on its peers (NCCL aborts instead of finalizing).
  bool broken() const { return !broken_.ok(); }

 private:
  Status Begin(Op op, int root, Millis timeout, Call* call);
  // A failure leaves the ranks at different steps of the layered protocol, so the communicator cannot be reused.
  Status Finish(Status st);
  template <typename F>
  Status Guard(const Call& call, F&& f);
  FixedHeader MakeHeader(const Call& call, size_t size) const;
  Status CheckHeader(const Call& call, const FixedHeader& h, int from) const;
  Status AllGatherBytes(const Call& call, const std::string& mine, std::vector<std::string>* out);

  const std::string backend_;
  const int rank_;
  const int size_;
  uint64_t seq_ = 0;
  Status broken_;
};

}  // namespace internal_comm
}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_LAYERED_COMMUNICATOR_H_
