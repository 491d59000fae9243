#include "core/manager/exchange.h"

#include <algorithm>

namespace distckpt {

Status Exchange(Communicator* comm, const std::vector<int>& receivers, const std::map<int, std::string>& sends,
                std::map<int, std::string>* received, std::chrono::milliseconds timeout) {
  received->clear();
  static const std::string kEmpty;
  // Contributions carry a one-byte flag so an empty message is told from no message.
  for (int root : receivers) {
    auto it = sends.find(root);
    std::string mine = it == sends.end() ? std::string() : "\1" + it->second;
    std::vector<std::string> all;
    DCKPT_RETURN_IF_ERROR(comm->Gather(mine, root, &all, timeout));
    if (root != comm->rank()) continue;
    for (size_t s = 0; s < all.size(); ++s) {
      if (!all[s].empty()) (*received)[static_cast<int>(s)] = all[s].substr(1);
    }
  }
  for (const auto& kv : sends) {
    if (!std::binary_search(receivers.begin(), receivers.end(), kv.first)) {
      return Internal("exchange: a message for rank " + std::to_string(kv.first) + ", which is not a receiver");
    }
  }
  return OkStatus();
}

}  // namespace distckpt
