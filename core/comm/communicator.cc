#include "core/comm/communicator.h"

#include <algorithm>
#include <cstring>

namespace distckpt {

Status Communicator::SendRecv(const std::vector<std::pair<int, std::string_view>>& sends,
                              const std::vector<std::pair<int, std::string*>>& recvs,
                              std::chrono::milliseconds timeout) {
  const int n = size(), me = rank();
  for (const auto& s : sends) {
    if (s.first < 0 || s.first >= n || s.first == me) {
      return InvalidArgument("sendrecv: rank " + std::to_string(me) + " sends to rank " + std::to_string(s.first) +
                             " of a group of " + std::to_string(n));
    }
  }
  // Who receives anything: every rank says whether it does.
  std::vector<std::string> receiving;
  DCKPT_RETURN_IF_ERROR(AllGather(std::string(1, recvs.empty() ? '\0' : '\1'), &receiving, timeout));
  for (int root = 0; root < n; ++root) {
    if (receiving[root] != std::string(1, '\1')) continue;
    std::string mine;  // Gather takes a string: the bytes for this root are copied into one
    for (const auto& s : sends) {
      if (s.first == root) mine.assign(s.second.data(), s.second.size());
    }
    std::vector<std::string> all;
    DCKPT_RETURN_IF_ERROR(Gather(mine, root, &all, timeout));
    if (root != me) continue;
    for (const auto& r : recvs) {
      if (r.first < 0 || r.first >= n) return InvalidArgument("sendrecv: no rank " + std::to_string(r.first));
      r.second->assign(all[r.first]);
    }
  }
  return OkStatus();
}

Status Communicator::SendRecvInto(const std::vector<std::pair<int, std::string_view>>& sends,
                                  const std::vector<RecvInto>& recvs, std::chrono::milliseconds timeout) {
  std::vector<std::string> got(recvs.size());
  std::vector<std::pair<int, std::string*>> into;
  into.reserve(recvs.size());
  for (size_t i = 0; i < recvs.size(); ++i) into.emplace_back(recvs[i].peer, &got[i]);
  DCKPT_RETURN_IF_ERROR(SendRecv(sends, into, timeout));
  for (size_t i = 0; i < recvs.size(); ++i) DCKPT_RETURN_IF_ERROR(CheckReceivedSize(recvs[i], got[i].size()));
  for (size_t i = 0; i < recvs.size(); ++i) {
    if (!got[i].empty()) std::memcpy(recvs[i].data, got[i].data(), got[i].size());
  }
  return OkStatus();
}

Status CheckReceivedSize(const Communicator::RecvInto& recv, uint64_t got) {
  if (got == recv.size) return OkStatus();
  return Internal("sendrecv: rank " + std::to_string(recv.peer) + " sent " + std::to_string(got) + " bytes where " +
                  std::to_string(recv.size) + " were expected");
}

}  // namespace distckpt
