// Restore (CheckpointManager::Restore): the ranks' inventories, the choice of a step, verification of the copies, and
// the load from a scratch checkpoint built of the node's parts and bytes fetched from peers.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "core/base/box.h"
#include "core/base/wire.h"
#include "core/engine/coordinator_round.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/format/metadata.h"
#include "core/manager/manager.h"
#include "core/manager/manager_util.h"
#include "core/manager/part.h"
#include "core/plan/save_planner.h"

namespace distckpt {

using namespace manager_internal;  // NOLINT: the package's own helpers

namespace {

// Row-major byte span [lo, hi) of `inner` inside a chunk holding `outer` (inner lies inside outer).
std::pair<uint64_t, uint64_t> ByteSpan(const Box& outer, const Box& inner, uint64_t itemsize) {
  uint64_t lo = 0, hi = 0;
  for (uint32_t d = 0; d < outer.ndim; ++d) {
    lo = lo * outer.length[d] + (inner.offset[d] - outer.offset[d]);
    hi = hi * outer.length[d] + (inner.end(d) - 1 - outer.offset[d]);
  }
  return {lo * itemsize, (hi + 1) * itemsize};
}

}  // namespace

struct CheckpointManager::Inventory {
  struct Held {
    uint64_t step = 0;
    std::string run;
    uint32_t rank = 0, ranks = 0;
  };
  std::vector<std::vector<Held>> parts;                                // per rank: its node's parts
  std::vector<std::vector<std::pair<uint64_t, std::string>>> markers;  // per rank: (step, run) complete
  std::vector<uint64_t> persisted;                                     // committed steps (rank 0 looked)
};

Result<CheckpointManager::Inventory> CheckpointManager::TakeInventory(bool use_persistent) {
  const int size = comm_->size();
  WireWriter w;
  std::vector<Inventory::Held> held;
  std::vector<std::pair<uint64_t, std::string>> markers;
  auto names = local_->ListDir(options_.local_dir);
  if (names.ok()) {
    for (const std::string& n : names.value()) {
      uint64_t step;
      if (!ParseNumbered(n, "step-", 10, &step)) continue;
      const std::string dir = options_.local_dir + "/" + n;
      auto inside = local_->ListDir(dir);
      if (!inside.ok()) continue;
      for (const std::string& f : inside.value()) {
        uint64_t r;
        if (ParseNumbered(f, "complete-", 5, &r)) {
          auto run = local_->ReadFile(dir + "/" + f, 64);
          if (run.ok()) markers.emplace_back(step, run.value());
        } else if (ParseNumbered(f, "part-", 5, &r)) {
          // What the part says it is; a part whose metadata is unreadable is not held (verification reports why).
          auto bytes = local_->ReadFile(dir + "/" + f + "/" + kMetadataFileName, kMaxMetadataBytes);
          if (!bytes.ok()) continue;
          auto view = MetadataView::Parse(std::make_shared<const std::string>(std::move(bytes).value()), dir + "/" + f);
          if (!view.ok()) continue;
          auto info = PartInfoOf(view.value(), dir + "/" + f);
          auto run = view.value().FindUser("dckpt.run");
          if (!info.ok() || !run || info.value().step != step || info.value().rank != r) continue;
          held.push_back({step, std::string(*run), info.value().rank, info.value().ranks});
        }
      }
    }
  }
  std::vector<uint64_t> persisted;
  if (use_persistent && comm_->rank() == 0) {
    auto listed = persistent_->ListDir(options_.persistent_path);
    if (listed.ok()) {
      for (const std::string& n : listed.value()) {
        uint64_t step;
        if (!ParseNumbered(n, "step-", 10, &step)) continue;
        auto there = persistent_->Exists(options_.persistent_path + "/" + n + "/" + kMetadataFileName);
        if (there.ok() && there.value()) persisted.push_back(step);
      }
    }
  }
  w.Var(held.size());
  for (const auto& h : held) {
    w.Var(h.step);
    w.Str(h.run);
    w.Var(h.rank);
    w.Var(h.ranks);
  }
  w.Var(markers.size());
  for (const auto& m : markers) {
    w.Var(m.first);
    w.Str(m.second);
  }
  w.Var(persisted.size());
  for (uint64_t s : persisted) w.Var(s);
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &all, options_.timeout));
  Inventory inv;
  inv.parts.resize(size);
  inv.markers.resize(size);
  for (int r = 0; r < size; ++r) {
    WireReader rd(all[r]);
    uint64_t n = 0;
    bool ok = rd.Count(&n, 4);
    for (uint64_t i = 0; ok && i < n; ++i) {
      Inventory::Held h;
      uint64_t rank = 0, ranks = 0;
      ok = rd.Var(&h.step) && rd.Str(&h.run) && rd.Var(&rank) && rd.Var(&ranks) && rank < ranks && ranks < (1u << 24);
      h.rank = static_cast<uint32_t>(rank);
      h.ranks = static_cast<uint32_t>(ranks);
      if (ok) inv.parts[r].push_back(h);
    }
    ok = ok && rd.Count(&n, 2);
    for (uint64_t i = 0; ok && i < n; ++i) {
      uint64_t step = 0;
      std::string run;
      ok = rd.Var(&step) && rd.Str(&run);
      if (ok) inv.markers[r].emplace_back(step, run);
    }
    ok = ok && rd.Count(&n, 1);
    for (uint64_t i = 0; ok && i < n; ++i) {
      uint64_t step = 0;
      ok = rd.Var(&step);
      if (ok && r == 0) inv.persisted.push_back(step);
    }
    if (!ok) return Internal("restore: malformed inventory from rank " + std::to_string(r));
  }
  return inv;
}

Result<RestoreSummary> CheckpointManager::Restore(State& state, const RestoreOptions& ro) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    if (!broken_.ok()) return broken_;
  }
  report_.clear();
  auto note = [&](const std::string& line) { report_ += line + "\n"; };
  const int me = comm_->rank(), size = comm_->size();
  const bool use_persistent = ro.use_persistent && !options_.persistent_path.empty();
  PhaseTrace trace("rank " + std::to_string(me) + " restore");
  DCKPT_ASSIGN_OR_RETURN(Inventory inv, TakeInventory(use_persistent));
  trace.Mark("inventory");
  std::map<uint64_t, std::set<std::string>> complete;
  for (const auto& list : inv.markers) {
    for (const auto& m : list) complete[m.first].insert(m.second);
  }
  std::set<uint64_t, std::greater<uint64_t>> steps(inv.persisted.begin(), inv.persisted.end());
  for (const auto& kv : complete) steps.insert(kv.first);
  RestoreSummary summary;
  bool newest = true;
  std::string missing_newest;
  for (uint64_t step : steps) {
    const std::string what = "step " + std::to_string(step);
    for (const std::string& run : complete.count(step) ? complete[step] : std::set<std::string>{}) {
      // Which ranks' nodes hold each part of this step of this run.
      uint32_t ranks = 0;
      for (const auto& list : inv.parts) {
        for (const auto& h : list) {
          if (h.step == step && h.run == run) ranks = std::max(ranks, h.ranks);
        }
      }
      std::vector<std::vector<int>> holders(ranks);
      for (int r = 0; r < size; ++r) {
        for (const auto& h : inv.parts[r]) {
          if (h.step == step && h.run == run && h.ranks == ranks) holders[h.rank].push_back(r);
        }
      }
      std::string missing;
      for (uint32_t p = 0; p < ranks; ++p) {
        if (holders[p].empty()) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      }
      if (ranks == 0 || !missing.empty()) {
        note(what + ": not restorable from the local tiers: the parts of rank(s) " + (missing.empty() ? "?" : missing) +
             " (of " + std::to_string(ranks) + ") are on no live node");
        if (newest)
          missing_newest =
              what + ": the parts of rank(s) " + missing + " of " + std::to_string(ranks) + " are on no live node";
        continue;
      }
      bool give_up = false;  // this run of the step cannot be restored from the local tiers
      for (int pass = 0; pass < 2 && !give_up; ++pass) {
        const bool full = pass == 1;
        // Which copies to use. First pass: every copy whose metadata is this step's part (the load verifies every byte
        // it reads); should a load find a corrupt byte, second pass: one rank of each node that holds a part reads and
        // checks all of it, and copies that fail are skipped (and reported).
        std::vector<uint32_t> assigned;
        for (uint32_t p = 0; p < ranks; ++p) {
          std::map<int, std::vector<int>> by_node;
          for (int r : holders[p]) by_node[node_index_[r]].push_back(r);
          for (const auto& kv : by_node) {
            if (kv.second[p % kv.second.size()] == me) assigned.push_back(p);
          }
        }
        WireWriter w;
        w.Var(assigned.size());
        for (uint32_t p : assigned) {
          const std::string dir = PartDir(step, p);
          Status st = OkStatus();
          std::string meta;
          auto bytes = local_->ReadFile(dir + "/" + kMetadataFileName, kMaxMetadataBytes);
          if (!bytes.ok()) st = bytes.status();
          else meta = bytes.value();
          if (st.ok()) {
            auto part = ParsePart(meta, dir);
            if (!part.ok()) st = part.status();
            else if (part.value().info.step != step || part.value().info.rank != p || part.value().info.ranks != ranks)
              st = Corrupt(dir + ": the part is not rank " + std::to_string(p) + "'s of " + what);
          }
          if (st.ok() && full) {
            ReadOptions opts;
            opts.storage = local_;
            opts.share_verification = false;
            auto reader = Reader::Open(dir, nullptr, opts);
            st = reader.ok() ? reader.value()->VerifyAll(nullptr) : reader.status();
          }
          w.Var(p);
          PutStatus(&w, st);
          w.Str(st.ok() ? meta : std::string());
        }
        std::vector<std::string> all;
        DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &all, options_.timeout));
        std::vector<std::vector<int>> good(ranks);
        std::vector<std::string> metadata(ranks);
        for (int r = 0; r < size; ++r) {
          WireReader rd(all[r]);
          uint64_t n = 0;
          bool ok = rd.Count(&n, 3);
          for (uint64_t i = 0; ok && i < n; ++i) {
            uint64_t p = 0;
            std::string meta;
            Status st;
            ok = rd.Var(&p) && GetStatus(&rd, &st) && rd.Str(&meta) && p < ranks;
            if (!ok) break;
            const std::string node = node_of_[r];
            if (!st.ok()) {
              note(what + ": skipped the copy of rank " + std::to_string(p) + "'s part on node '" + node +
                   "' (verified by rank " + std::to_string(r) + "): " + st.message());
              continue;
            }
            if (metadata[p].empty()) metadata[p] = meta;
            for (int h : holders[p]) {
              if (node_index_[h] == node_index_[r]) good[p].push_back(h);
            }
          }
          if (!ok) return Internal("restore: malformed verification message from rank " + std::to_string(r));
        }
        missing.clear();
        for (uint32_t p = 0; p < ranks; ++p) {
          if (good[p].empty()) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
        }
        if (!missing.empty()) {
          note(what + ": not restorable from the local tiers: no copy of the parts of rank(s) " + missing +
               " verifies");
          if (newest)
            missing_newest =
                what + ": no copy of the parts of rank(s) " + missing + " of " + std::to_string(ranks) + " verifies";
          give_up = true;
          break;
        }
        for (auto& g : good) std::sort(g.begin(), g.end());
        summary.step = step;
        trace.Mark(full ? "verify" : "check");
        bool corrupt = false;
        Status st = RestoreFromParts(state, step, metadata, good, &summary, &corrupt);
        if (!st.ok()) {
          if (!corrupt || full) return st;
          note(what + ": a copy failed verification during the load (" + st.message() +
               "); every copy is verified and the restore runs again");
          continue;
        }
        summary.found = true;
        summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return summary;
      }
    }
    if (std::count(inv.persisted.begin(), inv.persisted.end(), step)) {
      const std::string path = options_.persistent_path + "/" + StepName(step);
      ReadOptions opts;
      opts.storage = persistent_;
      opts.timeout = options_.timeout;
      opts.copy_engine = options_.copy_engine;
      auto loaded = Load(path, state, comm_, opts);
      if (!loaded.ok()) return loaded.status().WithContext("restoring " + what + " from persistent storage");
      note(what + ": loaded from persistent storage '" + path + "'");
      summary.found = true;
      summary.step = step;
      summary.tier = Tier::kPersistent;
      summary.bytes_from_persistent = loaded.value().io.bytes_read + loaded.value().io.bytes_mapped;
      summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return summary;
    }
    if (newest && !ro.fallback) {
      return NotFound("restore: the newest complete " + missing_newest +
                      " (and it was not persisted); fallback to an older step is off");
    }
    newest = false;
  }
  note("nothing to restore: no complete step in any tier");
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

// Each rank builds a checkpoint of the step in a scratch directory of its node: the merged metadata, hard links to
// the data files of parts its node holds, and sparse files holding the byte ranges it needs of the others, fetched
// from a node that holds them. Then it loads from there (verifying every byte it reads), and the ranks agree.
Status CheckpointManager::RestoreFromParts(State& state, uint64_t step, const std::vector<std::string>& part_metadata,
                                           const std::vector<std::vector<int>>& good_holders, RestoreSummary* summary,
                                           bool* corrupt) {
  *corrupt = false;
  const int me = comm_->rank(), size = comm_->size();
  PhaseTrace trace("rank " + std::to_string(me) + " restore of step " + std::to_string(step));
  const int my_node = node_index_[me];
  const std::string what = "step " + std::to_string(step);
  const uint32_t ranks = static_cast<uint32_t>(part_metadata.size());
  const std::string scratch = options_.local_dir + "/restore-r" + std::to_string(me) + "." + NewNonce();
  Status st = OkStatus();
  std::vector<Part> parts;
  for (uint32_t p = 0; p < ranks && st.ok(); ++p) {
    auto part = ParsePart(part_metadata[p], PartDir(step, p));
    if (!part.ok()) st = part.status();
    else parts.push_back(std::move(part).value());
  }
  std::string merged;
  if (st.ok()) {
    auto m = MergeParts(parts, options_.local_dir + "/" + StepName(step));
    if (!m.ok()) st = m.status();
    else merged = std::move(m).value();
  }
  // Which part and file each merged data file is (MergeParts numbers them in rank order), and back.
  std::vector<std::pair<uint32_t, std::string>> file_of;
  std::map<std::pair<uint32_t, std::string>, uint32_t> file_index;
  std::vector<uint32_t> file_base(ranks, 0);
  std::vector<bool> here(ranks, false);
  for (uint32_t p = 0; p < ranks && st.ok(); ++p) {
    file_base[p] = static_cast<uint32_t>(file_of.size());
    for (const auto& f : parts[p].record.files) {
      file_index[{p, f.name}] = static_cast<uint32_t>(file_of.size());
      file_of.emplace_back(p, f.name);
    }
    for (int h : good_holders[p]) here[p] = here[p] || node_index_[h] == my_node;
  }
  trace.Mark("merge");
  if (st.ok()) st = local_->CreateDir(scratch);
  if (st.ok()) st = local_->WriteFileDurably(scratch + "/" + kMetadataFileName, merged);
  // The files of parts fetched from peers: sparse, of their full size (the holes are never read), open until fetched.
  std::map<std::string, std::unique_ptr<WritableFile>> fetched;
  for (uint32_t p = 0; p < ranks && st.ok(); ++p) {
    for (const auto& f : parts[p].record.files) {
      const std::string dst = scratch + "/" + DataFileName(file_index.at({p, f.name}));
      if (here[p]) {
        // linkat without AT_SYMLINK_FOLLOW: a planted link is linked as a link, and the reader refuses it.
        const std::string src = PartDir(step, p) + "/" + f.name;
        if (::linkat(AT_FDCWD, src.c_str(), AT_FDCWD, dst.c_str(), 0) != 0) {
          st = ErrnoError(errno, "linking '" + src + "' to '" + dst + "'");
          break;
        }
      } else {
        auto out = local_->CreateFile(dst);
        st = out.ok() ? out.value()->Truncate(f.size) : out.status();
        if (!st.ok()) break;
        fetched[dst] = std::move(out).value();
      }
    }
  }
  // The byte ranges this rank needs of parts its node lacks: for each chunk that meets one of its pieces, the span
  // of the chunk that holds the overlap, widened to whole checksum blocks (what a verified read hashes).
  struct Need {
    uint32_t part;
    std::string file;
    uint64_t lo, hi;
  };
  std::vector<Need> needs;
  if (st.ok()) {
    auto view = MetadataView::Parse(std::make_shared<const std::string>(merged), scratch);
    if (!view.ok()) st = view.status();
    const uint64_t bs = st.ok() ? view.value().checksum_block_size() : 1;
    auto need_chunk = [&](const EntryView& e, size_t c, uint64_t lo, uint64_t hi) {
      const ChunkLocation loc = e.chunk(c);
      const auto& [p, name] = file_of.at(loc.file);
      if (here[p]) return;
      if (loc.first_block != kNoBlockTable) {
        lo = lo / bs * bs;
        hi = std::min(loc.length, (hi + bs - 1) / bs * bs);
      } else {
        lo = 0, hi = loc.length;
      }
      if (hi > lo) needs.push_back({p, name, loc.offset + lo, loc.offset + hi});
    };
    for (const TensorEntry& t : state.tensors()) {
      if (!st.ok()) break;
      auto idx = view.value().Find(t.name);
      if (!idx) continue;  // the load names it
      EntryView e = view.value().entry(*idx);
      if (e.kind != EntryKind::kTensor || e.dtype != t.dtype) continue;
      for (size_t c = 0; c < e.num_chunks; ++c) {
        const Box chunk = e.chunk_box(c);
        for (const TensorPiece& piece : t.pieces) {
          Box overlap;
          if (piece.box.ndim != chunk.ndim || !Intersect(chunk, piece.box, &overlap) || overlap.volume() == 0) continue;
          auto [lo, hi] = ByteSpan(chunk, overlap, DTypeSize(t.dtype));
          need_chunk(e, c, lo, hi);
        }
      }
    }
    for (const BytesEntry& b : state.bytes()) {
      if (!st.ok()) break;
      auto idx = view.value().Find(b.name);
      if (!idx || view.value().entry(*idx).kind != EntryKind::kBytes) continue;
      EntryView e = view.value().entry(*idx);
      need_chunk(e, 0, 0, e.chunk(0).length);
    }
  }
  std::sort(needs.begin(), needs.end(), [](const Need& a, const Need& b) {
    return std::tie(a.part, a.file, a.lo) < std::tie(b.part, b.file, b.lo);
  });
  std::vector<Need> merged_needs;
  for (const Need& n : needs) {
    if (!merged_needs.empty() && merged_needs.back().part == n.part && merged_needs.back().file == n.file &&
        n.lo <= merged_needs.back().hi) {
      merged_needs.back().hi = std::max(merged_needs.back().hi, n.hi);
    } else {
      merged_needs.push_back(n);
    }
  }
  trace.Mark("scratch");
  // Requests to servers: for a part, one of the nodes that hold a good copy, spread by the requester's rank.
  WireWriter w;
  PutStatus(&w, st);
  w.Var(st.ok() ? merged_needs.size() : 0);
  for (size_t i = 0; st.ok() && i < merged_needs.size(); ++i) {
    const Need& n = merged_needs[i];
    const auto& g = good_holders[n.part];
    w.Var(static_cast<uint64_t>(g[static_cast<size_t>(me) % g.size()]));
    w.Var(n.part);
    w.Str(n.file);
    w.Var(n.lo);
    w.Var(n.hi);
  }
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &all, options_.timeout));
  struct Request {
    uint32_t part;
    std::string file;
    uint64_t lo, hi;
  };
  std::map<std::pair<int, int>, std::vector<Request>> pairs;  // (server, requester) -> ranges, in order
  std::vector<Status> prepared(size);
  for (int q = 0; q < size; ++q) {
    WireReader rd(all[q]);
    uint64_t n = 0;
    bool ok = GetStatus(&rd, &prepared[q]) && rd.Count(&n, 5);
    for (uint64_t i = 0; ok && i < n; ++i) {
      uint64_t server = 0, part = 0;
      Request r;
      ok = rd.Var(&server) && rd.Var(&part) && rd.Str(&r.file) && rd.Var(&r.lo) && rd.Var(&r.hi) &&
           server < static_cast<uint64_t>(size) && part < ranks && r.hi >= r.lo && IsValidFileName(r.file);
      r.part = static_cast<uint32_t>(part);
      if (ok) pairs[{static_cast<int>(server), q}].push_back(r);
    }
    if (!ok) return Internal("restore: malformed request from rank " + std::to_string(q));
  }
  // Serving: the files asked of this rank, opened once.
  std::map<std::string, std::unique_ptr<ReadableFile>> open;
  Status serve_st = OkStatus();
  auto stream_total = [](const std::vector<Request>& v) {
    uint64_t t = 0;
    for (const Request& r : v) t += r.hi - r.lo;
    return t;
  };
  const uint64_t rb = options_.exchange_round_bytes;
  uint64_t rounds = 0;
  for (const auto& kv : pairs) rounds = std::max(rounds, (stream_total(kv.second) + rb - 1) / rb);
  auto stream_io = [&](const std::vector<Request>& v, uint64_t lo, uint64_t hi,
                       const std::function<Status(const Request&, uint64_t, uint64_t, uint64_t)>& each) -> Status {
    uint64_t at = 0;
    for (const Request& r : v) {
      const uint64_t rs = at, re = at + (r.hi - r.lo);
      at = re;
      if (re <= lo || rs >= hi) continue;
      const uint64_t a = std::max(lo, rs), b = std::min(hi, re);
      DCKPT_RETURN_IF_ERROR(each(r, r.lo + (a - rs), b - a, a - lo));
    }
    return OkStatus();
  };
  uint64_t from_peers = 0;
  // Buffers kept across rounds (one per peer each way): a round allocates nothing once the first has run.
  trace.Mark("requests");
  std::map<int, std::string> outgoing, incoming;
  for (uint64_t round = 0; round < rounds; ++round) {
    const uint64_t lo = round * rb;
    std::vector<std::pair<int, std::string_view>> sends;
    std::vector<std::pair<int, std::string*>> recvs;
    for (const auto& kv : pairs) {
      const auto [server, requester] = kv.first;
      const uint64_t total = stream_total(kv.second);
      if (total <= lo) continue;
      if (requester == me) recvs.emplace_back(server, &incoming[server]);
      if (server != me) continue;
      std::string& chunk = outgoing[requester];
      chunk.clear();
      // The round's bytes from one range of a file that maps go straight from the mapping; others through `chunk`.
      std::string_view view;
      int pieces = 0;
      if (serve_st.ok()) {
        serve_st = stream_io(kv.second, lo, std::min(total, lo + rb),
                             [&](const Request& r, uint64_t off, uint64_t n, uint64_t) -> Status {
                               const std::string path = PartDir(step, r.part) + "/" + r.file;
                               auto& f = open[path];
                               if (!f) {
                                 DCKPT_ASSIGN_OR_RETURN(f, local_->OpenFile(path));
                               }
                               const char* base =
                                   ++pieces == 1 && n == std::min(total, lo + rb) - lo ? f->Map() : nullptr;
                               if (base && f->Populate(off, n).ok()) {
                                 view = std::string_view(base + off, n);
                                 return OkStatus();
                               }
                               return CopyRange(*f, off, n, &chunk);
                             });
      }
      if (view.data() == nullptr) view = chunk;
      if (!serve_st.ok()) view = std::string_view();  // the requester sees a short message and says so
      sends.emplace_back(requester, view);
    }
    DCKPT_RETURN_IF_ERROR(comm_->SendRecv(sends, recvs, options_.timeout));
    for (const auto& kv : pairs) {
      if (kv.first.second != me || !st.ok()) continue;
      const int server = kv.first.first;
      const uint64_t total = stream_total(kv.second), hi = std::min(total, lo + rb);
      if (total <= lo) continue;
      const std::string& got = incoming[server];
      if (got.size() != hi - lo) {
        st = IoError("rank " + std::to_string(server) + " on node '" + node_of_[server] +
                     "' did not send the bytes asked of it");
        continue;
      }
      from_peers += hi - lo;
      st = stream_io(kv.second, lo, hi, [&](const Request& r, uint64_t off, uint64_t n, uint64_t at) -> Status {
        const std::string path = scratch + "/" + DataFileName(file_index.at({r.part, r.file}));
        const auto& f = fetched.at(path);
        return f->WriteAt(off, got.data() + at, n);
      });
    }
  }
  for (auto& kv : fetched) {
    Status closed = kv.second->Close();
    if (st.ok()) st = closed;
  }
  if (st.ok() && !serve_st.ok()) st = serve_st.WithContext("serving other ranks' restore");
  if (st.ok()) {
    for (int q = 0; q < size; ++q) {
      if (!prepared[q].ok() && q != me)
        st = Status(StatusCode::kPeer, "rank " + std::to_string(q) + ": " + prepared[q].message());
    }
  }
  trace.Mark("fetch");
  IoStats io;
  if (st.ok()) {
    ReadOptions opts;
    opts.storage = local_;
    opts.copy_engine = options_.copy_engine;
    opts.share_verification = false;
    auto loaded = Load(scratch, state, nullptr, opts);
    if (!loaded.ok()) st = loaded.status();
    else io = loaded.value().io;
  }
  trace.Mark("load");
  (void)local_->RemoveAll(scratch);
  DCKPT_ASSIGN_OR_RETURN(std::vector<Status> outcome, GatherStatuses(comm_, st, options_.timeout));
  trace.Mark("agree");
  for (const Status& o : outcome) *corrupt = *corrupt || o.code() == StatusCode::kCorrupt;
  DCKPT_RETURN_IF_ERROR(FirstFailure(outcome, me).WithContext("restore: restoring " + what));
  summary->bytes_from_peers = from_peers;
  const uint64_t read = io.bytes_read + io.bytes_mapped;
  summary->bytes_local = read > from_peers ? read - from_peers : 0;
  summary->tier = from_peers ? Tier::kPeer : Tier::kLocal;
  std::string served;
  for (uint32_t p = 0; p < ranks; ++p) {
    const auto& g = good_holders[p];
    served += (p ? ", " : "") + std::to_string(p) +
              (here[p] ? " here" : " from node '" + node_of_[g[static_cast<size_t>(me) % g.size()]] + "'");
  }
  report_ += what + ": restored on rank " + std::to_string(me) + " (node '" + node_of_[me] + "') from the parts of " +
             std::to_string(ranks) + " rank(s): " + served + "; " + std::to_string(from_peers) + " bytes from peers\n";
  return OkStatus();
}

}  // namespace distckpt
