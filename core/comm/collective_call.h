// What every backend knows about the collective it is running: its kind, root, sequence number and deadline, and
// how to name it in an error. Internal to core/comm.
#ifndef DISTCKPT_CORE_COMM_COLLECTIVE_CALL_H_
#define DISTCKPT_CORE_COMM_COLLECTIVE_CALL_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace distckpt {
namespace internal_comm {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

/// Values travel in message headers: never renumber.
enum class Op : uint32_t { kAllGather = 1, kGather = 2, kBroadcast = 3, kBarrier = 4, kSendRecv = 5 };

/// "allgather", "gather to rank 2", "broadcast from rank 0", "barrier" (or "unknown collective N" for a bad header).
inline std::string OpName(uint32_t op, int root) {
  switch (static_cast<Op>(op)) {
    case Op::kAllGather:
      return "allgather";
    case Op::kGather:
      return "gather to rank " + std::to_string(root);
    case Op::kBroadcast:
      return "broadcast from rank " + std::to_string(root);
    case Op::kBarrier:
      return "barrier";
    case Op::kSendRecv:
      return "sendrecv";
  }
  return "unknown collective " + std::to_string(op);
}

/// One collective call on one rank.
struct Call {
  Op op = Op::kBarrier;
  int root = -1;
  uint64_t seq = 0;
  Millis timeout{0};
  Clock::time_point deadline;

  std::string Name() const { return OpName(static_cast<uint32_t>(op), root); }
  /// e.g. "barrier #3": the sequence number tells which of several calls failed.
  std::string Describe() const { return Name() + " #" + std::to_string(seq); }
};

/// Header sent ahead of every payload by the backends layered on fixed-size collectives (external, NCCL): all ranks
/// must agree on it, which catches ranks that are in different collectives.
struct FixedHeader {
  uint64_t seq = 0;
  uint32_t op = 0;
  int32_t root = -1;
  uint64_t size = 0;
};
static_assert(sizeof(FixedHeader) == 24, "the header is exchanged as raw bytes");

}  // namespace internal_comm
}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_COLLECTIVE_CALL_H_
