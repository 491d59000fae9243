// Copies of a step's parts made again after a restore (CheckpointManager::Restore): the parts a node lost are sent
// from the tiers that still hold them to the nodes that should keep them now, file to file, in the background; the
// step is then complete on every node again, so that losing another node right after the restore is survived.
#include <algorithm>
#include <future>
#include <map>
#include <set>

#include "core/base/wire.h"
#include "core/engine/coordinator_round.h"
#include "core/format/metadata.h"
#include "core/manager/manager.h"
#include "core/manager/manager_util.h"
#include "core/manager/part.h"

namespace distckpt {

using namespace manager_internal;  // NOLINT: the package's own helpers

std::vector<CheckpointManager::PartCopy> CheckpointManager::PlanCopies(
    uint32_t ranks, const std::vector<std::vector<int>>& good) const {
  const int nodes = static_cast<int>(nodes_.size());
  const size_t want = std::min<size_t>(1 + static_cast<size_t>(options_.replicas), nodes_.size());
  std::vector<PartCopy> copies;
  for (uint32_t p = 0; p < ranks; ++p) {
    if (good[p].empty()) continue;
    std::set<int> held;
    for (int h : good[p]) held.insert(node_index_[h]);
    // The nodes after the part's own (its rank's node while that rank exists, else spread by part), in order.
    const int home = p < static_cast<uint32_t>(node_index_.size()) ? node_index_[p] : static_cast<int>(p) % nodes;
    for (int k = 0; k < nodes && held.size() < want; ++k) {
      const int n = (home + k) % nodes;
      if (held.count(n)) continue;
      const auto& on = nodes_[n];
      const int to = on[p % on.size()];
      const int from = good[p][static_cast<size_t>(to) % good[p].size()];
      copies.push_back({from, to, p});
      held.insert(n);
    }
  }
  return copies;
}

Status CheckpointManager::CopyParts(const Again& again, Status* outcome) {
  *outcome = OkStatus();
  const int me = comm_->rank();
  // Every (sender, receiver) stream: the data files of its parts, in order (the metadata is known to every rank).
  struct Piece {
    uint32_t part;
    std::string file;
    uint64_t size;
  };
  std::map<std::pair<int, int>, std::vector<Piece>> streams;
  // Verified by every rank before: the same on all, so no collective is lost when it fails.
  DCKPT_ASSIGN_OR_RETURN(std::vector<Part> parts, ParseParts(again.step, again.metadata));
  for (const PartCopy& c : again.copies) {
    for (const auto& f : parts[c.part].record.files) streams[{c.from, c.to}].push_back({c.part, f.name, f.size});
  }
  auto total = [](const std::vector<Piece>& v) {
    uint64_t t = 0;
    for (const Piece& x : v) t += x.size;
    return t;
  };
  // Receiving: each part copied here under a staging name, its files pre-sized.
  struct Incoming {
    std::string final_dir, staging_dir;
    Status st;
  };
  std::map<uint32_t, Incoming> in;
  std::map<std::pair<uint32_t, std::string>, std::unique_ptr<WritableFile>> out;
  for (const PartCopy& c : again.copies) {
    if (c.to != me) continue;
    Incoming& inc = in[c.part];
    inc.final_dir = PartDir(again.step, c.part);
    inc.staging_dir = StagingPath(inc.final_dir, NewNonce());
    inc.st = local_->CreateDir(StepDir(again.step));
    if (inc.st.code() == StatusCode::kExists) inc.st = OkStatus();
    if (inc.st.ok()) inc.st = local_->CreateDir(inc.staging_dir);
    if (inc.st.ok()) {
      inc.st = local_->WriteFileDurably(inc.staging_dir + "/" + kStagingMarkerName, StagingMarkerText(inc.final_dir));
    }
    if (inc.st.ok()) {
      inc.st = local_->WriteFileDurably(inc.staging_dir + "/" + kMetadataFileName, again.metadata[c.part]);
    }
    for (const auto& f : parts[c.part].record.files) {
      if (!inc.st.ok()) break;
      auto file = local_->CreateFile(inc.staging_dir + "/" + f.name);
      if (!file.ok()) {
        inc.st = file.status();
        break;
      }
      inc.st = file.value()->Truncate(f.size);
      out[{c.part, f.name}] = std::move(file).value();
    }
  }
  // Sending: the files asked of this rank, opened once.
  std::map<std::pair<uint32_t, std::string>, std::unique_ptr<ReadableFile>> open;
  Status send_st = OkStatus();
  const uint64_t rb = options_.exchange_round_bytes;
  uint64_t rounds = 0;
  for (const auto& kv : streams) rounds = std::max(rounds, (total(kv.second) + rb - 1) / rb);
  // A stream's bytes [lo, hi), file by file: each(piece, offset in the file, bytes, offset in the round).
  auto each_piece = [](const std::vector<Piece>& v, uint64_t lo, uint64_t hi, const auto& each) -> Status {
    uint64_t at = 0;
    for (const Piece& x : v) {
      const uint64_t s = at, e = at + x.size;
      at = e;
      if (e <= lo || s >= hi) continue;
      const uint64_t a = std::max(lo, s), b = std::min(hi, e);
      DCKPT_RETURN_IF_ERROR(each(x, a - s, b - a, a - lo));
    }
    return OkStatus();
  };
  std::map<int, std::string> outgoing;
  std::map<int, std::vector<char>> received[2];
  std::future<void> writing[2];
  auto write_round = [&](int set, uint64_t lo) {
    for (const auto& [key, v] : streams) {
      if (key.second != me || total(v) <= lo) continue;
      const std::vector<char>& got = received[set][key.first];
      (void)each_piece(v, lo, std::min(total(v), lo + rb), [&](const Piece& x, uint64_t off, uint64_t n, uint64_t at) {
        Incoming& inc = in[x.part];
        if (inc.st.ok()) inc.st = out[{x.part, x.file}]->WriteAt(off, got.data() + at, n);
        return OkStatus();
      });
    }
  };
  Status exchanged = OkStatus();
  for (uint64_t round = 0; round < rounds && exchanged.ok(); ++round) {
    const uint64_t lo = round * rb;
    const int set = static_cast<int>(round % 2);
    std::vector<std::pair<int, std::string_view>> sends;
    std::vector<Communicator::RecvInto> recvs;
    for (const auto& [key, v] : streams) {
      const uint64_t t = total(v);
      if (t <= lo) continue;
      const uint64_t n = std::min(t, lo + rb) - lo;
      if (key.second == me) {
        std::vector<char>& buf = received[set][key.first];
        if (buf.size() < n) buf.resize(n);
        recvs.push_back({key.first, buf.data(), static_cast<size_t>(n)});
      }
      if (key.first != me) continue;
      std::string& chunk = outgoing[key.second];
      chunk.clear();
      if (send_st.ok()) {
        send_st = each_piece(v, lo, lo + n, [&](const Piece& x, uint64_t off, uint64_t len, uint64_t) -> Status {
          auto& f = open[{x.part, x.file}];
          if (!f) {
            DCKPT_ASSIGN_OR_RETURN(f, local_->OpenFile(PartDir(again.step, x.part) + "/" + x.file));
          }
          return CopyRange(*f, off, len, &chunk);
        });
      }
      // A sender that cannot read sends zeros of the size announced; its outcome fails the copy everywhere.
      if (!send_st.ok()) chunk.assign(n, '\0');
      sends.emplace_back(key.second, chunk);
    }
    exchanged = comm_->SendRecvInto(sends, recvs, options_.timeout);
    if (!exchanged.ok()) break;
    if (writing[1 - set].valid()) writing[1 - set].get();
    writing[set] = std::async(std::launch::async, write_round, set, lo);
  }
  for (auto& w : writing) {
    if (w.valid()) w.get();
  }
  DCKPT_RETURN_IF_ERROR(exchanged);
  Status result = send_st.ok() ? OkStatus() : send_st.WithContext("sending parts of the restored step");
  for (auto& [p, inc] : in) {
    for (const auto& f : parts[p].record.files) {
      auto it = out.find({p, f.name});
      if (it == out.end()) continue;
      if (inc.st.ok()) inc.st = it->second->Sync();
      Status closed = it->second->Close();
      if (inc.st.ok()) inc.st = closed;
    }
    if (inc.st.ok()) inc.st = CommitReceivedPart(local_, inc.staging_dir, inc.final_dir, StepDir(again.step));
    if (!inc.st.ok()) {
      (void)local_->RemoveAll(inc.staging_dir);
      if (result.ok())
        result = inc.st.WithContext("copying rank " + std::to_string(p) + "'s part to '" + inc.final_dir + "'");
    }
  }
  *outcome = result;
  return OkStatus();
}

void CheckpointManager::ProcessAgain(const Again& again) {
  const std::string what = "checkpoint manager: copying the restored step " + std::to_string(again.step) + " again";
  PhaseTrace trace("rank " + std::to_string(comm_->rank()) + " copies of step " + std::to_string(again.step));
  Status outcome;
  Status collective = CopyParts(again, &outcome);
  auto all =
      collective.ok() ? GatherStatuses(comm_, outcome, options_.timeout) : Result<std::vector<Status>>(collective);
  trace.Mark("copy");
  if (!all.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = Status(StatusCode::kPeer, what + ": " + all.status().message());
    Fail(broken_);
    return;
  }
  Status complete = FirstFailure(all.value(), comm_->rank());
  // Every node holds the step now: each rank marks it complete (for the run that saved it) on its own node.
  if (complete.ok()) {
    complete = local_->CreateDir(StepDir(again.step));  // a node that holds no part of the step yet
    if (complete.code() == StatusCode::kExists) complete = OkStatus();
  }
  if (complete.ok()) {
    complete = local_->Publish(StepDir(again.step) + "/" + CompleteName(comm_->rank()), again.run, true);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!complete.ok()) {
    Fail(complete.WithContext(what));
    return;
  }
  if (!latest_ || *latest_ < again.step) latest_ = again.step;
  if (std::find(completed_.begin(), completed_.end(), again.step) == completed_.end()) {
    completed_.push_back(again.step);
    std::sort(completed_.begin(), completed_.end());
  }
}

}  // namespace distckpt
