// Restore (CheckpointManager::Restore): the ranks' inventories, the choice of a step, verification of the copies, and
// the load from the node's parts and the bytes peers send, as they arrive.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>

#include "core/base/box.h"
#include "core/base/wire.h"
#include "core/engine/coordinator_round.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/format/checksum.h"
#include "core/format/metadata.h"
#include "core/manager/manager.h"
#include "core/manager/manager_util.h"
#include "core/manager/part.h"
#include "core/manager/restore_source.h"
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
  struct Damaged {
    uint64_t step = 0;
    uint32_t rank = 0;  // the part's, from its directory name
    std::string why;
  };
  std::vector<std::vector<Damaged>> damaged;  // per rank: parts its node holds that it could not read as parts
};

Result<CheckpointManager::Inventory> CheckpointManager::TakeInventory(bool use_persistent) {
  const int size = comm_->size();
  WireWriter w;
  std::vector<Inventory::Held> held;
  std::vector<Inventory::Damaged> damaged;
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
          // What the part says it is; a part whose metadata is unreadable is not held (the report says why).
          const std::string part_dir = dir + "/" + f;
          auto bytes = local_->ReadFile(part_dir + "/" + kMetadataFileName, kMaxMetadataBytes);
          if (!bytes.ok()) {
            damaged.push_back({step, static_cast<uint32_t>(r), bytes.status().message()});
            continue;
          }
          auto view = MetadataView::Parse(std::make_shared<const std::string>(std::move(bytes).value()), part_dir);
          if (!view.ok()) {
            damaged.push_back({step, static_cast<uint32_t>(r), view.status().message()});
            continue;
          }
          auto info = PartInfoOf(view.value(), part_dir);
          auto run = view.value().FindUser("dckpt.run");
          if (!info.ok() || !run || info.value().step != step || info.value().rank != r) {
            damaged.push_back(
                {step, static_cast<uint32_t>(r),
                 "'" + part_dir + "' is not rank " + std::to_string(r) + "'s part of step " + std::to_string(step) +
                     (info.ok() ? std::string(run ? "" : " (no run id)") : ": " + info.status().message())});
            continue;
          }
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
  w.Var(damaged.size());
  for (const auto& d : damaged) {
    w.Var(d.step);
    w.Var(d.rank);
    w.Str(d.why);
  }
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &all, options_.timeout));
  Inventory inv;
  inv.parts.resize(size);
  inv.markers.resize(size);
  inv.damaged.resize(size);
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
    ok = ok && rd.Count(&n, 3);
    for (uint64_t i = 0; ok && i < n; ++i) {
      Inventory::Damaged d;
      uint64_t rank = 0;
      ok = rd.Var(&d.step) && rd.Var(&rank) && rd.Str(&d.why) && rank < (1u << 24);
      d.rank = static_cast<uint32_t>(rank);
      if (ok) inv.damaged[r].push_back(std::move(d));
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
  report_ = setup_note_;
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
        // Parts of this step some node holds but could not read (damaged metadata), each with its node and why.
        std::set<std::string> said;  // the ranks of one node see the same copies
        std::string damaged;
        for (int r = 0; r < size; ++r) {
          for (const auto& d : inv.damaged[r]) {
            const std::string line = "; the copy of rank " + std::to_string(d.rank) + "'s part on node '" +
                                     node_of_[r] + "' is unreadable: " + d.why;
            if (d.step == step && said.insert(line).second) damaged += line;
          }
        }
        const std::string lost =
            ranks == 0 ? "no readable part of this run is on any live node"
                       : "the parts of rank(s) " + missing + " of " + std::to_string(ranks) + " are on no live node";
        note(what + ": not restorable from the local tiers: " + lost + damaged);
        if (newest) missing_newest = what + ": " + lost + damaged;
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
        // Parts on fewer nodes than the manager keeps are copied again at once, in the background.
        auto again = std::make_unique<Again>();
        again->copies = PlanCopies(ranks, good);
        if (!again->copies.empty()) {
          again->step = step;
          again->run = run;
          again->metadata = metadata;
          summary.copies_made = static_cast<uint32_t>(again->copies.size());
          note(what + ": " + std::to_string(again->copies.size()) +
               " part copies lost with a node are made again from the tiers that hold them (in the background)");
          QueueCopies(std::move(again));
        }
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

// Each rank loads the step from the parts its node holds, read where they are, and the byte ranges it needs of the
// others, which nodes that hold them send straight into memory laid out as their files (restore_source.h); each entry
// of the state is loaded (every byte verified) as soon as its bytes are in, beside the exchange. Then the ranks agree.
Status CheckpointManager::RestoreFromParts(State& state, uint64_t step, const std::vector<std::string>& part_metadata,
                                           const std::vector<std::vector<int>>& good_holders, RestoreSummary* summary,
                                           bool* corrupt) {
  *corrupt = false;
  const int me = comm_->rank(), size = comm_->size();
  PhaseTrace trace("rank " + std::to_string(me) + " restore of step " + std::to_string(step));
  const int my_node = node_index_[me];
  const std::string what = "step " + std::to_string(step);
  const uint32_t ranks = static_cast<uint32_t>(part_metadata.size());
  Status st = OkStatus();
  std::vector<Part> parts;
  auto parsed = ParseParts(step, part_metadata);
  if (parsed.ok()) parts = std::move(parsed).value();
  else st = parsed.status();
  std::string merged;
  if (st.ok()) {
    auto m = MergeParts(parts, options_.local_dir + "/" + StepName(step));
    if (!m.ok()) st = m.status();
    else merged = std::move(m).value();
  }
  // Which part and file each merged data file is (MergeParts numbers them in rank order).
  std::vector<std::pair<uint32_t, std::string>> file_of;
  std::vector<bool> here(ranks, false);
  for (uint32_t p = 0; p < ranks && st.ok(); ++p) {
    for (const auto& f : parts[p].record.files) file_of.emplace_back(p, f.name);
    for (int h : good_holders[p]) here[p] = here[p] || node_index_[h] == my_node;
  }
  trace.Mark("merge");
  // The checkpoint the load reads: this node's parts where they are, other parts' bytes as they arrive.
  const std::string source_path =
      options_.local_dir + "/" + StepName(step) + " (restore of rank " + std::to_string(me) + ")";
  std::vector<RestoreSource::File> files(file_of.size());
  std::map<uint32_t, std::shared_ptr<Directory>> part_dirs;
  for (uint32_t k = 0; k < file_of.size() && st.ok(); ++k) {
    const auto& [p, name] = file_of[k];
    files[k].name = name;
    if (here[p]) {
      auto& dir = part_dirs[p];
      if (!dir) {
        auto opened = local_->OpenDirectory(PartDir(step, p));
        if (!opened.ok()) {
          st = opened.status();
          break;
        }
        dir = std::move(opened).value();
      }
      files[k].part_dir = dir;
      continue;
    }
    uint64_t size = 0;
    for (const auto& f : parts[p].record.files) {
      if (f.name == name) size = f.size;
    }
    auto fetched = FetchedFile::Create(PartDir(step, p) + "/" + name, size);
    if (!fetched.ok()) st = fetched.status();
    else files[k].fetched = std::move(fetched).value();
  }
  // The byte ranges this rank needs of parts its node lacks: for each chunk that meets one of its pieces, the span
  // of the chunk that holds the overlap, widened to whole checksum blocks (what a verified read hashes); each need
  // remembers its entry (tensors first, then bytes entries), which can be loaded once all its needs are in.
  struct Need {
    uint32_t file;
    uint64_t lo, hi;
    uint32_t entry;
  };
  const size_t n_tensors = state.tensors().size(), n_entries = n_tensors + state.bytes().size();
  std::vector<Need> needs;
  struct Direct {
    uint32_t entry, meta_entry, chunk, file;
    uint64_t lo, length;
    char* dest;
  };
  std::vector<Direct> directs;
  std::vector<char> is_direct(n_entries, 0);
  std::optional<MetadataView> merged_view;
  if (st.ok()) {
    auto view = MetadataView::Parse(std::make_shared<const std::string>(merged), source_path);
    if (!view.ok()) st = view.status();
    else merged_view = view.value();
    const uint64_t bs = st.ok() ? view.value().checksum_block_size() : 1;
    auto need_chunk = [&](const EntryView& e, size_t c, uint64_t lo, uint64_t hi, uint32_t entry) {
      const ChunkLocation loc = e.chunk(c);
      if (here[file_of.at(loc.file).first]) return;
      if (loc.first_block != kNoBlockTable) {
        lo = lo / bs * bs;
        hi = std::min(loc.length, (hi + bs - 1) / bs * bs);
      } else {
        lo = 0, hi = loc.length;
      }
      if (hi > lo) needs.push_back({loc.file, loc.offset + lo, loc.offset + hi, entry});
    };
    for (size_t i = 0; i < n_tensors && st.ok(); ++i) {
      const TensorEntry& t = state.tensors()[i];
      auto idx = view.value().Find(t.name);
      if (!idx) continue;  // the load names it
      EntryView e = view.value().entry(*idx);
      if (e.kind != EntryKind::kTensor || e.dtype != t.dtype) continue;
      // Each piece (in host memory) is exactly a chunk another node holds: the chunk's bytes are received straight
      // into the piece and verified there, with no copy (a restore on the sharding that saved the step).
      std::vector<Direct> direct;
      for (const TensorPiece& piece : t.pieces) {
        if (!piece.memory.is_host() || piece.read_only || piece.data == nullptr) break;
        for (size_t c = 0; c < e.num_chunks; ++c) {
          const Box chunk = e.chunk_box(c);
          if (!(chunk == piece.box)) continue;
          const ChunkLocation loc = e.chunk(c);
          if (!here[file_of.at(loc.file).first] && loc.length == piece.box.volume() * DTypeSize(t.dtype)) {
            direct.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(*idx), static_cast<uint32_t>(c), loc.file,
                              loc.offset, loc.length, static_cast<char*>(piece.data)});
          }
          break;
        }
        if (direct.size() != static_cast<size_t>(&piece - t.pieces.data()) + 1) break;
      }
      if (!t.pieces.empty() && direct.size() == t.pieces.size()) {
        is_direct[i] = 1;
        directs.insert(directs.end(), direct.begin(), direct.end());
        continue;
      }
      for (size_t c = 0; c < e.num_chunks; ++c) {
        const Box chunk = e.chunk_box(c);
        for (const TensorPiece& piece : t.pieces) {
          Box overlap;
          if (piece.box.ndim != chunk.ndim || !Intersect(chunk, piece.box, &overlap) || overlap.volume() == 0) continue;
          auto [lo, hi] = ByteSpan(chunk, overlap, DTypeSize(t.dtype));
          need_chunk(e, c, lo, hi, static_cast<uint32_t>(i));
        }
      }
    }
    for (size_t i = n_tensors; i < n_entries && st.ok(); ++i) {
      auto idx = view.value().Find(state.bytes()[i - n_tensors].name);
      if (!idx || view.value().entry(*idx).kind != EntryKind::kBytes) continue;
      EntryView e = view.value().entry(*idx);
      need_chunk(e, 0, 0, e.chunk(0).length, static_cast<uint32_t>(i));
    }
  }
  // Needs merged into ranges of one file; ranges a few pages apart become one (the gap costs less than a round).
  constexpr uint64_t kGap = 64 << 10;
  std::sort(needs.begin(), needs.end(),
            [](const Need& a, const Need& b) { return std::tie(a.file, a.lo) < std::tie(b.file, b.lo); });
  struct Range {
    uint32_t file;
    uint64_t lo, hi;
    std::vector<uint32_t> entries;
    char* dest = nullptr;  // where [lo, hi) is received: a piece (Direct), or else the fetched file's memory
    uint64_t missing = 0;  // bytes not yet received
    size_t unloaded = 0;   // entries of `entries` not yet loaded
  };
  std::vector<Range> ranges;
  for (const Need& n : needs) {
    if (!ranges.empty() && ranges.back().file == n.file && n.lo <= ranges.back().hi + kGap) {
      ranges.back().hi = std::max(ranges.back().hi, n.hi);
    } else {
      ranges.push_back({n.file, n.lo, n.hi, {}, nullptr, 0, 0});
    }
    auto& es = ranges.back().entries;
    if (std::find(es.begin(), es.end(), n.entry) == es.end()) es.push_back(n.entry);
  }
  for (const Direct& d : directs) ranges.push_back({d.file, d.lo, d.lo + d.length, {d.entry}, d.dest, 0, 0});
  std::vector<uint32_t> pending(n_entries, 0);  // ranges each entry waits for
  for (Range& r : ranges) {
    r.missing = r.hi - r.lo;
    r.unloaded = r.entries.size();
    for (uint32_t e : r.entries) ++pending[e];
  }
  trace.Mark("plan");
  // Requests to servers: for a part, one of the nodes that hold a good copy, spread by the requester's rank.
  WireWriter w;
  PutStatus(&w, st);
  w.Var(st.ok() ? ranges.size() : 0);
  for (size_t i = 0; st.ok() && i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    const auto& [p, name] = file_of[r.file];
    const auto& g = good_holders[p];
    w.Var(static_cast<uint64_t>(g[static_cast<size_t>(me) % g.size()]));
    w.Var(p);
    w.Str(name);
    w.Var(r.lo);
    w.Var(r.hi);
  }
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm_->AllGather(w.Take(), &all, options_.timeout));
  // Each (server, requester) stream: its requests in the requester's order, cut into segments of at most
  // exchange_round_bytes, and the segments into rounds of at most that many bytes per stream (at least one segment):
  // the segments of a round are all in flight at once, each received in place.
  struct Segment {
    uint32_t part;
    std::string file;
    uint64_t lo, n;
    size_t range;  // the requester's range it fills
  };
  const uint64_t rb = options_.exchange_round_bytes;
  // (server, requester) -> rounds of segments, in order
  std::map<std::pair<int, int>, std::vector<std::vector<Segment>>> pairs;
  std::vector<Status> prepared(size);
  for (int q = 0; q < size; ++q) {
    WireReader rd(all[q]);
    uint64_t n = 0;
    bool ok = GetStatus(&rd, &prepared[q]) && rd.Count(&n, 5);
    for (uint64_t i = 0; ok && i < n; ++i) {
      uint64_t server = 0, part = 0, lo = 0, hi = 0;
      std::string file;
      ok = rd.Var(&server) && rd.Var(&part) && rd.Str(&file) && rd.Var(&lo) && rd.Var(&hi) &&
           server < static_cast<uint64_t>(size) && static_cast<int>(server) != q && part < ranks && hi >= lo &&
           IsValidFileName(file);
      auto& stream = pairs[{static_cast<int>(server), q}];
      for (uint64_t at = lo; ok && at < hi; at += rb) {
        const uint64_t len = std::min(rb, hi - at);
        uint64_t in_round = 0;
        for (const Segment& s : stream.empty() ? std::vector<Segment>{} : stream.back()) in_round += s.n;
        if (stream.empty() || in_round + len > rb) stream.emplace_back();
        stream.back().push_back({static_cast<uint32_t>(part), file, at, len, static_cast<size_t>(i)});
      }
    }
    if (!ok) return Internal("restore: malformed request from rank " + std::to_string(q));
  }
  size_t rounds = 0;
  for (const auto& kv : pairs) rounds = std::max(rounds, kv.second.size());
  trace.Mark("requests");

  // Loading runs beside the exchange: first every entry this node holds all of, then each entry as the last of its
  // bytes arrives. What was received and not yet loaded stays within two rounds' bytes (one arriving, one loading):
  // a round waits for the loads before it when more is held (unless nothing is left to load: one entry larger than
  // that is fetched whole).
  struct Loader {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::vector<uint32_t>> batches;
    bool done = false, busy = false;
    uint64_t held = 0;  // received bytes not yet released
    Status st;
    IoStats io;
  } ld;
  auto source = std::make_unique<RestoreSource>(source_path, merged, files);
  // A chunk received into its piece is checked there, as a load checks what it reads.
  auto verify_direct = [&](const Direct& d) -> Status {
    const MetadataView& view = *merged_view;
    EntryView e = view.entry(d.meta_entry);
    const ChunkLocation loc = e.chunk(d.chunk);
    const uint64_t computed = ChunkChecksum(d.dest, d.length, view.checksum_block_size(), nullptr);
    if (computed == loc.checksum) return OkStatus();
    char hex[64];
    std::snprintf(hex, sizeof hex, "stored %016llx, computed %016llx", static_cast<unsigned long long>(loc.checksum),
                  static_cast<unsigned long long>(computed));
    return Corrupt("checkpoint '" + source_path + "': entry '" + std::string(e.name) + "' chunk #" +
                   std::to_string(d.chunk) + ": checksum mismatch in data file '" + files[d.file].fetched->path() +
                   "' bytes " + std::to_string(d.lo) + ".." + std::to_string(d.lo + d.length) + " as received (" + hex +
                   "); the copy is corrupt");
  };
  auto load_batch = [&](const std::vector<uint32_t>& entries) -> Status {
    State sub;
    std::vector<uint32_t> bytes_entries;
    for (uint32_t i : entries) {
      if (i < n_tensors && is_direct[i]) continue;
      if (i < n_tensors) {
        const TensorEntry& t = state.tensors()[i];
        DCKPT_RETURN_IF_ERROR(sub.AddTensor(t.name, t.dtype, t.shape));
        for (const TensorPiece& piece : t.pieces) {
          std::vector<uint64_t> offsets(piece.box.offset, piece.box.offset + piece.box.ndim);
          std::vector<uint64_t> lengths(piece.box.length, piece.box.length + piece.box.ndim);
          DCKPT_RETURN_IF_ERROR(piece.read_only ? sub.AddConstPiece(t.name, offsets, lengths, piece.data)
                                                : sub.AddPieceIn(t.name, offsets, lengths, piece.data, piece.memory));
        }
      } else {
        const BytesEntry& b = state.bytes()[i - n_tensors];
        DCKPT_RETURN_IF_ERROR(b.read_only ? sub.AddConstBytes(b.name, b.data, b.size)
                                          : sub.AddBytes(b.name, b.data, b.size));
        bytes_entries.push_back(i);
      }
    }
    if (sub.tensors().empty() && sub.bytes().empty()) return OkStatus();
    ReadOptions opts;
    opts.storage = source.get();
    opts.copy_engine = options_.copy_engine;
    opts.share_verification = false;
    DCKPT_ASSIGN_OR_RETURN(LoadSummary loaded, Load(source_path, sub, nullptr, opts));
    for (size_t j = 0; j < bytes_entries.size(); ++j) {
      state.bytes()[bytes_entries[j] - n_tensors].loaded_size = sub.bytes()[j].loaded_size;
    }
    std::lock_guard<std::mutex> lock(ld.mu);
    ld.io.bytes_read += loaded.io.bytes_read;
    ld.io.bytes_mapped += loaded.io.bytes_mapped;
    return OkStatus();
  };
  std::vector<char> loaded_entry(n_entries, 0);
  std::thread loader([&] {
    while (true) {
      std::vector<uint32_t> batch;
      {
        std::unique_lock<std::mutex> lock(ld.mu);
        ld.cv.wait(lock, [&] { return ld.done || !ld.batches.empty(); });
        if (ld.batches.empty()) return;
        batch = std::move(ld.batches.front());
        ld.batches.pop_front();
        ld.busy = true;
      }
      auto t_load = std::chrono::steady_clock::now();
      Status loaded = ld.st.ok() ? load_batch(batch) : OkStatus();  // after a failure the rest is not loaded
      trace.Add("load", t_load);
      t_load = std::chrono::steady_clock::now();
      for (size_t j = 0; j < directs.size() && loaded.ok(); ++j) {
        if (std::find(batch.begin(), batch.end(), directs[j].entry) != batch.end()) loaded = verify_direct(directs[j]);
      }
      trace.Add("verify", t_load);
      std::lock_guard<std::mutex> lock(ld.mu);
      if (ld.st.ok() && !loaded.ok()) ld.st = loaded;
      // Ranges whose every entry is loaded give their memory back.
      for (uint32_t e : batch) loaded_entry[e] = 1;
      for (Range& r : ranges) {
        if (r.unloaded == 0 || r.missing != 0) continue;
        size_t left = 0;
        for (uint32_t e : r.entries) left += loaded_entry[e] ? 0 : 1;
        r.unloaded = left;
        if (left == 0 && r.dest == nullptr) {
          files[r.file].fetched->Release(r.lo, r.hi);
          ld.held -= r.hi - r.lo;
        }
      }
      ld.busy = false;
      ld.cv.notify_all();
    }
  });
  {
    std::vector<uint32_t> local_entries;
    for (uint32_t e = 0; e < n_entries; ++e) {
      if (pending[e] == 0) local_entries.push_back(e);
    }
    std::lock_guard<std::mutex> lock(ld.mu);
    if (!st.ok()) ld.st = st;
    if (!local_entries.empty()) ld.batches.push_back(std::move(local_entries));
  }
  ld.cv.notify_all();
  const uint64_t hold_limit = 2 * rb;
  uint64_t from_peers = 0, direct_bytes = 0;
  // Serving: the files asked of this rank, opened once; a range it cannot read is sent as zeros (the requester's
  // verification refuses them, and the restore fails naming this rank's error).
  std::map<std::string, std::unique_ptr<ReadableFile>> open;
  Status serve_st = OkStatus();
  Status fetch_st = OkStatus();
  for (size_t round = 0; round < rounds && fetch_st.ok(); ++round) {
    std::vector<std::pair<int, std::string_view>> sends;
    std::vector<Communicator::RecvInto> recvs;
    std::vector<const Segment*> mine;
    std::deque<std::string> outgoing;  // bytes a segment is sent from when the file cannot be mapped
    uint64_t incoming = 0;
    for (const auto& [key, stream] : pairs) {
      if (round >= stream.size()) continue;
      const auto [server, requester] = key;
      for (const Segment& seg : stream[round]) {
        if (requester == me) {
          const Range& r = ranges[seg.range];
          char* at = r.dest ? r.dest + (seg.lo - r.lo) : files[r.file].fetched->data() + seg.lo;
          recvs.push_back({server, at, static_cast<size_t>(seg.n)});
          mine.push_back(&seg);
          if (!r.dest) incoming += seg.n;
        }
        if (server != me) continue;
        std::string_view view;
        std::string& chunk = outgoing.emplace_back();
        if (serve_st.ok()) {
          const std::string path = PartDir(step, seg.part) + "/" + seg.file;
          auto& f = open[path];
          if (!f) {
            auto opened = local_->OpenFile(path);
            if (opened.ok()) f = std::move(opened).value();
            else serve_st = opened.status();
          }
          if (f && seg.lo <= f->size() && seg.n <= f->size() - seg.lo) {
            const char* base = f->Map();
            const auto t_populate = std::chrono::steady_clock::now();
            const bool populated = base && f->Populate(seg.lo, seg.n).ok();
            trace.Add("populate", t_populate);
            if (populated) {
              view = std::string_view(base + seg.lo, seg.n);
            } else {
              chunk.clear();
              serve_st = CopyRange(*f, seg.lo, seg.n, &chunk);
              view = chunk;
            }
          } else if (f) {
            serve_st = Corrupt("'" + path + "' is " + std::to_string(f->size()) + " bytes, shorter than the " +
                               std::to_string(seg.lo + seg.n) + " asked of it");
          }
        }
        if (!serve_st.ok()) {
          chunk.assign(seg.n, '\0');
          view = chunk;
        }
        sends.emplace_back(requester, view);
      }
    }
    {
      // Back-pressure on this rank's own fetching: wait for the loads of earlier rounds while too much is held.
      const auto t_wait = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(ld.mu);
      ld.cv.wait(lock,
                 [&] { return ld.held + incoming <= hold_limit || (ld.batches.empty() && !ld.busy) || !ld.st.ok(); });
      ld.held += incoming;
      trace.Add("wait-loads", t_wait);
    }
    const auto t_exchange = std::chrono::steady_clock::now();
    fetch_st = comm_->SendRecvInto(sends, recvs, options_.timeout);
    trace.Add(recvs.empty() ? "send" : sends.empty() ? "receive" : "send+receive", t_exchange);
    if (!fetch_st.ok()) break;
    // What was sent from a part file's mapping leaves this process's resident set (the pages stay cached).
    for (const auto& [key, stream] : pairs) {
      if (key.first != me || round >= stream.size()) continue;
      for (const Segment& seg : stream[round]) {
        auto it = open.find(PartDir(step, seg.part) + "/" + seg.file);
        if (it != open.end() && it->second) it->second->ReleaseMapped(seg.lo, seg.n);
      }
    }
    {
      std::lock_guard<std::mutex> lock(ld.mu);
      std::vector<uint32_t> ready;
      for (const Segment* seg : mine) {
        Range& r = ranges[seg->range];
        if (!r.dest) files[r.file].fetched->MarkReceived(seg->lo, seg->lo + seg->n);
        else direct_bytes += seg->n;
        from_peers += seg->n;
        r.missing -= seg->n;
        if (r.missing != 0) continue;
        for (uint32_t e : r.entries) {
          if (--pending[e] == 0) ready.push_back(e);
        }
      }
      if (!ready.empty()) ld.batches.push_back(std::move(ready));
    }
    ld.cv.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(ld.mu);
    ld.done = true;
  }
  ld.cv.notify_all();
  const auto t_join = std::chrono::steady_clock::now();
  loader.join();
  trace.Add("join-loader", t_join);
  DCKPT_RETURN_IF_ERROR(fetch_st);  // the communicator failed: the ranks cannot agree on anything more
  trace.Mark("fetch+load");
  if (st.ok()) st = ld.st;
  if (st.ok() && !serve_st.ok()) st = serve_st.WithContext("serving other ranks' restore");
  if (st.ok()) {
    for (int q = 0; q < size; ++q) {
      if (!prepared[q].ok() && q != me)
        st = Status(StatusCode::kPeer, "rank " + std::to_string(q) + ": " + prepared[q].message());
    }
  }
  IoStats io = ld.io;
  DCKPT_ASSIGN_OR_RETURN(std::vector<Status> outcome, GatherStatuses(comm_, st, options_.timeout));
  trace.Mark("agree");
  for (const Status& o : outcome) *corrupt = *corrupt || o.code() == StatusCode::kCorrupt;
  DCKPT_RETURN_IF_ERROR(FirstFailure(outcome, me).WithContext("restore: restoring " + what));
  summary->bytes_from_peers = from_peers;
  const uint64_t read = io.bytes_read + io.bytes_mapped;
  const uint64_t through_loads = from_peers - direct_bytes;  // peers' bytes the loads read again (from memory)
  summary->bytes_local = read > through_loads ? read - through_loads : 0;
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
