// The one collective pattern save and load need: every rank reports to rank 0 (the coordinator), and rank 0 answers
// every rank. It starts with a small all-to-all exchange of statuses, so that every rank itself observes a rank that
// died or stalled (and names it), and every rank learns that some rank failed, with that rank's error.
#ifndef DISTCKPT_CORE_ENGINE_COORDINATOR_ROUND_H_
#define DISTCKPT_CORE_ENGINE_COORDINATOR_ROUND_H_

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/comm/communicator.h"

namespace distckpt {

/// On rank 0: turns every rank's report (indexed by rank) into the answer every rank receives.
using DecideFn = std::function<std::string(std::vector<std::string>& reports)>;

/// 1. All ranks exchange `local` (this rank's status so far). If a rank is missing or any status is an error, every
///    rank returns the same error ("rank R: ..." for a failed rank, the communicator's error naming a missing one).
/// 2. Every rank sends `report` to rank 0, which calls `decide` and sends its answer to every rank.
/// Returns the answer. Ranks other than 0 wait a little longer than `timeout` for it, since rank 0 may spend up to
/// `timeout` gathering.
Result<std::string> CoordinatorRound(Communicator* comm, const Status& local, const std::string& report,
                                     std::chrono::milliseconds timeout, const DecideFn& decide);

/// Every rank's status, indexed by rank, through one AllGather. Fails only as the collective does (or on a malformed
/// message), so a caller can tell a rank that failed from a group that did.
Result<std::vector<Status>> GatherStatuses(Communicator* comm, const Status& local, std::chrono::milliseconds timeout);

/// This rank's failure (all[me]), else the first other rank's as kPeer ("rank R failed: ..."), else OK.
Status FirstFailure(const std::vector<Status>& all, int me);

/// Step 1 alone: every rank learns whether every rank is alive and succeeded (GatherStatuses + FirstFailure).
Status AgreeOnStatus(Communicator* comm, const Status& local, std::chrono::milliseconds timeout);

/// How long a non-coordinator waits for an answer when the coordinator itself may wait `timeout`.
std::chrono::milliseconds AnswerTimeout(std::chrono::milliseconds timeout);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_COORDINATOR_ROUND_H_
