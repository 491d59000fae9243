#include "core/engine/coordinator_round.h"

#include <algorithm>

namespace distckpt {

std::chrono::milliseconds AnswerTimeout(std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  if (timeout >= milliseconds::max() / 2) return timeout;
  return timeout + std::max(timeout / 2, milliseconds(2000));
}

Result<std::string> CoordinatorRound(Communicator* comm, const std::string& mine, std::chrono::milliseconds timeout,
                                     const DecideFn& decide) {
  std::vector<std::string> reports;
  Status gathered = comm->Gather(mine, 0, &reports, timeout);
  const bool root = comm->rank() == 0;
  if (!root && !gathered.ok()) return gathered;
  std::string answer;
  if (root) answer = decide(gathered, reports);
  Status sent = comm->Broadcast(&answer, 0, root ? timeout : AnswerTimeout(timeout));
  // Rank 0 keeps its own answer even if some rank could not receive it (that rank is dead or stalled).
  if (!sent.ok() && !root) return sent;
  return answer;
}

}  // namespace distckpt
