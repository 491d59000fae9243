#include "core/manager/tier_report.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "core/foreign/json.h"
#include "core/format/metadata.h"
#include "core/manager/manager_util.h"
#include "core/manager/part.h"
#include "core/tools/leftovers.h"
#include "core/tools/rename_leftovers.h"

namespace distckpt {

using namespace manager_internal;  // NOLINT: the package's own helpers

namespace {

// A staging directory whose writer cannot be asked (another host, or another PID namespace sharing the tier) counts
// as abandoned once it has been idle this long; one whose writer, on this host, has exited, at once.
constexpr std::chrono::seconds kForeignWriterGrace(3600);

// The files directly inside `dir` and their total size (links and directories inside are not the manager's: named).
uint64_t FilesBytes(Storage* storage, Directory* dir, const std::string& path, std::string* odd) {
  uint64_t total = 0;
  auto names = storage->ListDir(path);
  if (!names.ok()) return 0;
  for (const std::string& n : names.value()) {
    auto f = dir->OpenFile(n);
    if (f.ok()) total += f.value()->size();
    else if (odd->empty()) *odd = "'" + path + "/" + n + "': " + f.status().message();
  }
  return total;
}

// A leftover directory of a part (being written or received, or left by a writer that died), as the leftovers logic
// judges it.
TierPart DescribeLeftover(const RenameLeftover& l) {
  TierPart p;
  p.name = l.name;
  uint64_t rank = 0;
  if (ParseNumbered(l.final_name, "part-", 5, &rank)) p.rank = static_cast<int64_t>(rank);
  p.bytes = l.bytes;
  p.leftover = true;
  // The judge's reasons start with "abandoned: " where they say so; the state says it here.
  const std::string prefix = "abandoned: ";
  p.why = l.reason.compare(0, prefix.size(), prefix) == 0 ? l.reason.substr(prefix.size()) : l.reason;
  if (l.writer == WriterState::kExited) {
    p.state = "abandoned";
    p.why = "writer pid " + std::to_string(l.marker.pid) + " on this host has exited";
    p.prune_grace = std::chrono::seconds(0);
  } else if (l.garbage) {
    p.state = "abandoned";
    p.prune_grace = kForeignWriterGrace;
  } else {
    p.state = "in progress";
  }
  return p;
}

TierPart DescribePart(Storage* storage, Directory* step_dir, const std::string& step_path, const std::string& name,
                      uint64_t step) {
  TierPart p;
  p.name = name;
  const std::string path = step_path + "/" + name;
  uint64_t rank = 0;
  if (ParseNumbered(name, "part-", 5, &rank)) p.rank = static_cast<int64_t>(rank);
  auto dir = step_dir->OpenSubdirectory(name);
  if (!dir.ok()) {
    p.state = "damaged";
    p.why = dir.status().message() + " (left alone)";
    p.directory = false;
    return p;
  }
  std::string odd;
  p.bytes = FilesBytes(storage, dir.value().get(), path, &odd);
  auto meta = dir.value()->OpenFile(kMetadataFileName);
  Status st = meta.status();
  std::string bytes;
  if (st.ok()) {
    if (meta.value()->size() > kMaxMetadataBytes) {
      st = Corrupt("'" + path + "/" + kMetadataFileName + "' is over the metadata limit");
    } else {
      bytes.resize(meta.value()->size());
      st = meta.value()->ReadAt(0, bytes.data(), bytes.size());
    }
  }
  Result<MetadataView> view =
      st.ok() ? MetadataView::Parse(std::make_shared<const std::string>(bytes), path) : Result<MetadataView>(st);
  Result<PartInfo> info = view.ok() ? PartInfoOf(view.value(), path) : Result<PartInfo>(view.status());
  if (!info.ok()) {
    p.state = "damaged";
    p.why = info.status().message();
    return p;
  }
  if (info.value().step != step || static_cast<int64_t>(info.value().rank) != p.rank) {
    p.state = "damaged";
    p.why = "'" + path + "' holds rank " + std::to_string(info.value().rank) + "'s part of step " +
            std::to_string(info.value().step);
    return p;
  }
  p.ranks = info.value().ranks;
  if (auto run = view.value().FindUser("dckpt.run")) p.run = std::string(*run);
  if (!odd.empty()) {
    p.state = "damaged";
    p.why = odd;
    return p;
  }
  p.state = "complete";
  return p;
}

// The run a marker names: its text ("" if unreadable or longer than a run id).
std::string MarkerRun(Directory* step_dir, const std::string& name) {
  auto f = step_dir->OpenFile(name);
  std::string run;
  if (f.ok() && f.value()->size() <= 64) {
    run.resize(f.value()->size());
    if (!f.value()->ReadAt(0, run.data(), run.size()).ok()) run.clear();
  }
  return run;
}

// Restorable here: a marked run of which every rank's part is here, complete.
std::string RestorableRun(const TierStep& s) {
  std::set<std::string> runs;
  for (const auto& m : s.markers) runs.insert(m.second);
  std::string found;
  for (const std::string& run : runs) {
    uint32_t ranks = 0;
    std::set<int64_t> have;
    for (const TierPart& p : s.parts) {
      if (p.state == "complete" && p.run == run) ranks = std::max(ranks, p.ranks), have.insert(p.rank);
    }
    if (ranks > 0 && have.size() == ranks && *have.begin() == 0 && *have.rbegin() == ranks - 1) found = run;
  }
  return found;
}

// A step with no marker and nothing in progress is what its run's manager would have removed once that run marked a
// newer step complete (manager.cc's Prune). Another run's newer step proves nothing: a job restored from an older
// step writes steps below the ones an earlier run left. With no part naming its run, every run marked here must have
// moved past it.
void MarkAbandoned(std::vector<TierStep>* steps) {
  std::map<std::string, uint64_t> newest;  // run -> its newest marked step here
  for (const TierStep& s : *steps) {
    for (const auto& m : s.markers) newest[m.second] = std::max(newest[m.second], s.step);
  }
  for (TierStep& s : *steps) {
    std::set<std::string> runs;
    bool busy = false;
    for (const TierPart& p : s.parts) {
      busy = busy || p.state == "in progress";
      if (!p.run.empty()) runs.insert(p.run);
    }
    if (!s.markers.empty() || busy || newest.empty()) continue;
    bool superseded = true;
    if (runs.empty()) {
      for (const auto& [run, step] : newest) superseded = superseded && step > s.step;
    } else {
      for (const std::string& run : runs) superseded = superseded && newest.count(run) && newest[run] > s.step;
    }
    s.abandoned = superseded;
  }
}

}  // namespace

Result<TierReport> DescribeTier(Storage* storage, const std::string& dir) {
  auto root = storage->OpenDirectory(dir);
  if (!root.ok()) return root.status().WithContext("tiers: '" + dir + "'");
  DCKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, storage->ListDir(dir));
  TierReport report;
  report.dir = dir;
  for (const std::string& name : names) {
    uint64_t step = 0;
    if (!ParseNumbered(name, "step-", 10, &step)) {
      report.other.push_back(name);
      continue;
    }
    auto step_dir = root.value()->OpenSubdirectory(name);
    if (!step_dir.ok()) {
      report.other.push_back(name);  // a link or a file named like a step: not the manager's
      continue;
    }
    TierStep s;
    s.step = step;
    const std::string step_path = dir + "/" + name;
    DCKPT_ASSIGN_OR_RETURN(std::vector<std::string> inside, storage->ListDir(step_path));
    // Staging directories of parts (and what an interrupted removal left) are judged by the leftovers logic.
    DCKPT_ASSIGN_OR_RETURN(std::vector<RenameLeftover> leftovers, ScanRenameLeftovers(step_path, kForeignWriterGrace));
    std::map<std::string, const RenameLeftover*> leftover_named;
    for (const RenameLeftover& l : leftovers) leftover_named[l.name] = &l;
    for (const std::string& n : inside) {
      uint64_t r = 0;
      if (ParseNumbered(n, "complete-", 5, &r)) {
        if (step_dir.value()->OpenFile(n).ok())
          s.markers.emplace_back(static_cast<uint32_t>(r), MarkerRun(step_dir.value().get(), n));
        else report.other.push_back(name + "/" + n);  // a link or a directory named like a marker
      } else if (ParseNumbered(n, "part-", 5, &r)) {
        s.parts.push_back(DescribePart(storage, step_dir.value().get(), step_path, n, step));
      } else if (auto l = leftover_named.find(n);
                 l != leftover_named.end() && ParseNumbered(l->second->final_name, "part-", 5, &r)) {
        s.parts.push_back(DescribeLeftover(*l->second));
      } else {
        report.other.push_back(name + "/" + n);  // includes links and files named like a staging directory
      }
    }
    std::set<int64_t> marked;
    for (const auto& m : s.markers) marked.insert(m.first);
    for (TierPart& p : s.parts) {
      if (!marked.empty() && p.rank >= 0) p.replica = !marked.count(p.rank);
    }
    s.restorable_run = RestorableRun(s);
    report.steps.push_back(std::move(s));
  }
  std::sort(report.steps.begin(), report.steps.end(),
            [](const TierStep& a, const TierStep& b) { return a.step < b.step; });
  MarkAbandoned(&report.steps);
  if (report.steps.empty() && report.other.size() == names.size() && !names.empty()) {
    return InvalidArgument("tiers: '" + dir + "' is not a checkpoint manager's local tier (no step-<10 digits> " +
                           "directory in it)");
  }
  return report;
}

std::string TierReportJson(const TierReport& report) {
  std::string j = "{\"dir\":" + JsonQuote(report.dir) + ",\"steps\":[";
  for (size_t i = 0; i < report.steps.size(); ++i) {
    const TierStep& s = report.steps[i];
    j += (i ? "," : "") + std::string("{\"step\":") + std::to_string(s.step) +
         ",\"complete\":" + (s.markers.empty() ? "false" : "true") +
         ",\"restorable_here\":" + (s.restorable_run.empty() ? "false" : "true") +
         ",\"restorable_run\":" + JsonQuote(s.restorable_run) + ",\"abandoned\":" + (s.abandoned ? "true" : "false") +
         ",\"markers\":[";
    for (size_t k = 0; k < s.markers.size(); ++k) {
      j += (k ? "," : "") + std::string("{\"rank\":") + std::to_string(s.markers[k].first) +
           ",\"run\":" + JsonQuote(s.markers[k].second) + "}";
    }
    j += "],\"parts\":[";
    for (size_t k = 0; k < s.parts.size(); ++k) {
      const TierPart& p = s.parts[k];
      j += (k ? "," : "") + std::string("{\"name\":") + JsonQuote(p.name) +
           ",\"rank\":" + (p.rank < 0 ? "null" : std::to_string(p.rank)) + ",\"ranks\":" + std::to_string(p.ranks) +
           ",\"replica\":" + (p.replica ? (*p.replica ? "true" : "false") : "null") + ",\"run\":" + JsonQuote(p.run) +
           ",\"bytes\":" + std::to_string(p.bytes) + ",\"state\":" + JsonQuote(p.state) +
           ",\"why\":" + JsonQuote(p.why) + "}";
    }
    j += "]}";
  }
  j += "],\"other\":[";
  for (size_t i = 0; i < report.other.size(); ++i) j += (i ? "," : "") + JsonQuote(report.other[i]);
  return j + "]}";
}

Status PruneAbandonedTier(Storage* storage, const std::string& dir, bool dry_run,
                          const std::function<Status(const std::string&)>& removed) {
  DCKPT_ASSIGN_OR_RETURN(TierReport report, DescribeTier(storage, dir));
  for (const TierStep& s : report.steps) {
    const std::string step_path = dir + "/" + StepName(s.step);
    for (const TierPart& p : s.parts) {
      // A leftover goes when it is abandoned; anything else only with its whole step. A damaged part of a step that is
      // not abandoned is for a person to look at; a link or a file named like a part is never followed or removed.
      if (p.leftover ? p.state != "abandoned" : !s.abandoned || !p.directory) continue;
      const std::string path = step_path + "/" + p.name;
      if (removed) DCKPT_RETURN_IF_ERROR(removed(path));
      if (dry_run) continue;
      if (p.leftover) {
        // Judged again, moved aside and checked to be the same directory before it is removed.
        Status st = RemoveRenameLeftover(path, p.prune_grace);
        if (!st.ok() && st.code() != StatusCode::kNotFound) return st.WithContext("pruning the tier '" + dir + "'");
      } else if (p.state == "complete") {
        DCKPT_RETURN_IF_ERROR(RemoveCheckpoint(storage, path).WithContext("pruning the tier '" + dir + "'"));
      } else {
        DCKPT_RETURN_IF_ERROR(storage->RemoveAll(path).WithContext("pruning the tier '" + dir + "'"));
      }
    }
    if (s.abandoned && !dry_run) (void)storage->RemoveEmptyDir(step_path);
  }
  return OkStatus();
}

}  // namespace distckpt
