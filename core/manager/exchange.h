// Point-to-point exchange over a collective communicator: each rank sends a message to some ranks and receives from
// the ranks that send to it. Every rank of the group calls it with the same `receivers` (who receives anything this
// round), so each rank's share of the traffic is only its own messages.
#ifndef DISTCKPT_CORE_MANAGER_EXCHANGE_H_
#define DISTCKPT_CORE_MANAGER_EXCHANGE_H_

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/comm/communicator.h"

namespace distckpt {

/// Sends sends[r] to rank r; *received[s] is what rank s sent to this rank (ranks that sent nothing are absent).
/// `receivers`: the ranks that receive something this round, the same on every rank (sorted); one Gather per
/// receiver (a rank with nothing for it sends an empty contribution). Fails like the collectives it runs.
Status Exchange(Communicator* comm, const std::vector<int>& receivers, const std::map<int, std::string>& sends,
                std::map<int, std::string>* received, std::chrono::milliseconds timeout);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_MANAGER_EXCHANGE_H_
