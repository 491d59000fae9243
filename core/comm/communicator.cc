#include "core/comm/communicator.h"

#include <map>
#include <string>
#include <vector>

#include "core/base/wire.h"

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
  // Several messages to one peer travel as one: each message's size (a varint), then its bytes, in order.
  std::map<int, WireWriter> out;
  for (const auto& [peer, bytes] : sends) out[peer].Str(bytes);
  std::vector<std::pair<int, std::string_view>> framed_sends;
  for (auto& [peer, w] : out) framed_sends.emplace_back(peer, w.str());
  std::map<int, std::string> in;
  for (const auto& r : recvs) in[r.peer];
  std::vector<std::pair<int, std::string*>> into;
  for (auto& [peer, buf] : in) into.emplace_back(peer, &buf);
  DCKPT_RETURN_IF_ERROR(SendRecv(framed_sends, into, timeout));
  std::map<int, WireReader> readers;
  for (const auto& [peer, buf] : in) readers.emplace(peer, WireReader(buf));
  for (const auto& r : recvs) {
    WireReader& rd = readers.at(r.peer);
    uint64_t len = 0;
    if (rd.remaining() == 0) {  // the peer sent fewer messages: this one is empty
      DCKPT_RETURN_IF_ERROR(CheckReceivedSize(r, 0));
      continue;
    }
    // Count: a size the rest of the message cannot hold is refused, so the Raw below cannot run short.
    if (!rd.Count(&len)) return Internal("sendrecv: a malformed framed message from rank " + std::to_string(r.peer));
    DCKPT_RETURN_IF_ERROR(CheckReceivedSize(r, len));
    if (len) rd.Raw(r.data, len);
  }
  return OkStatus();
}

Status CheckReceivedSize(const Communicator::RecvInto& recv, uint64_t got) {
  if (got == recv.size) return OkStatus();
  return Internal("sendrecv: rank " + std::to_string(recv.peer) + " sent " + std::to_string(got) + " bytes where " +
                  std::to_string(recv.size) + " were expected");
}

}  // namespace distckpt
