#include "core/engine/coordinator_round.h"

#include <algorithm>

#include "core/base/wire.h"

namespace distckpt {

std::chrono::milliseconds AnswerTimeout(std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  if (timeout >= milliseconds::max() / 2) return timeout;
  return timeout + std::max(timeout / 2, milliseconds(2000));
}

Result<std::vector<Status>> GatherStatuses(Communicator* comm, const Status& local, std::chrono::milliseconds timeout) {
  WireWriter w;
  PutStatus(&w, local);
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm->AllGather(w.Take(), &all, timeout));
  std::vector<Status> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    WireReader in(all[r]);
    if (!GetStatus(&in, &out[r])) return Internal("rank " + std::to_string(r) + " sent a malformed status");
  }
  return out;
}

Status FirstFailure(const std::vector<Status>& all, int me) {
  if (me >= 0 && static_cast<size_t>(me) < all.size() && !all[me].ok()) return all[me];
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].ok()) return Status(StatusCode::kPeer, "rank " + std::to_string(r) + " failed: " + all[r].message());
  }
  return OkStatus();
}

Status AgreeOnStatus(Communicator* comm, const Status& local, std::chrono::milliseconds timeout) {
  DCKPT_ASSIGN_OR_RETURN(std::vector<Status> all, GatherStatuses(comm, local, timeout));
  if (!local.ok()) return local;
  return FirstFailure(all, comm->rank());
}

Result<std::string> CoordinatorRound(Communicator* comm, const Status& local, const std::string& report,
                                     std::chrono::milliseconds timeout, const DecideFn& decide) {
  DCKPT_RETURN_IF_ERROR(AgreeOnStatus(comm, local, timeout));
  std::vector<std::string> reports;
  DCKPT_RETURN_IF_ERROR(comm->Gather(report, 0, &reports, timeout));
  const bool root = comm->rank() == 0;
  std::string answer;
  if (root) answer = decide(reports);
  DCKPT_RETURN_IF_ERROR(comm->Broadcast(&answer, 0, root ? timeout : AnswerTimeout(timeout)));
  return answer;
}

}  // namespace distckpt
