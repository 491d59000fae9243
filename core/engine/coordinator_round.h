// The one collective pattern save and load need: every rank reports to rank 0 (the coordinator), and rank 0 answers
// every rank. Failures are reported consistently: if a rank dies or stalls, rank 0's gather names it, and rank 0
// still answers the live ranks with that error, so every rank learns which rank was missing.
#ifndef DISTCKPT_CORE_ENGINE_COORDINATOR_ROUND_H_
#define DISTCKPT_CORE_ENGINE_COORDINATOR_ROUND_H_

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/comm/communicator.h"

namespace distckpt {

/// On rank 0, turns the gather's outcome (OK with every rank's report, or the gather error) into the answer for all.
using DecideFn = std::function<std::string(const Status& gathered, std::vector<std::string>& reports)>;

/// Sends `mine` to rank 0 and returns rank 0's answer. Ranks other than 0 wait for the answer a little longer than
/// `timeout` (rank 0 may spend the whole timeout waiting for a missing rank before it answers). Fails only if this
/// rank cannot hear from rank 0; a failure elsewhere arrives inside the answer, as `decide` encoded it.
Result<std::string> CoordinatorRound(Communicator* comm, const std::string& mine, std::chrono::milliseconds timeout,
                                     const DecideFn& decide);

/// How long a non-coordinator waits for an answer when the coordinator itself may wait `timeout`.
std::chrono::milliseconds AnswerTimeout(std::chrono::milliseconds timeout);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_COORDINATOR_ROUND_H_
