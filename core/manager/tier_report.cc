#include "core/manager/tier_report.h"

#include <algorithm>
#include <ctime>
#include <map>
#include <memory>
#include <set>

#include "core/foreign/json.h"
#include "core/format/metadata.h"
#include "core/manager/manager_util.h"
#include "core/manager/part.h"
#include "core/tools/leftovers.h"
#include "core/tools/staging_marker.h"

namespace distckpt {

using namespace manager_internal;  // NOLINT: the package's own helpers

namespace {

// A staging directory whose writer cannot be asked (another host) counts as abandoned after this long.
constexpr std::time_t kForeignWriterGrace = 3600;

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

TierPart DescribePart(Storage* storage, Directory* step_dir, const std::string& step_path, const std::string& name,
                      uint64_t step) {
  TierPart p;
  p.name = name;
  const std::string path = step_path + "/" + name;
  std::string final_name;
  const bool staging = ParseStagingName(name, &final_name);
  uint64_t rank = 0;
  if (ParseNumbered(staging ? final_name : name, "part-", 5, &rank)) p.rank = static_cast<int64_t>(rank);
  auto dir = step_dir->OpenSubdirectory(name);
  if (!dir.ok()) {
    p.state = "damaged";
    p.why = dir.status().message();
    p.directory = false;
    return p;
  }
  std::string odd;
  p.bytes = FilesBytes(storage, dir.value().get(), path, &odd);
  if (staging) {
    auto marker = dir.value()->OpenFile(kStagingMarkerName);
    std::string text;
    if (marker.ok() && marker.value()->size() <= 4096) {
      text.resize(marker.value()->size());
      if (!marker.value()->ReadAt(0, text.data(), text.size()).ok()) text.clear();
    }
    const StagingMarker m = ParseStagingMarker(text);
    const WriterState w = text.empty() ? WriterState::kUnknown : WriterStateOf(m);
    const auto started = StartedAt(m);
    if (w == WriterState::kRunning) {
      p.state = "in progress";
    } else if (w == WriterState::kExited) {
      p.state = "abandoned";
      p.why = "its writer (pid " + std::to_string(m.pid) + " on this host) has exited";
    } else if (started && std::time(nullptr) - *started > kForeignWriterGrace) {
      p.state = "abandoned";
      p.why = "started " + m.started_utc + " on host '" + m.host + "', over an hour ago";
    } else if (text.empty()) {
      p.state = "abandoned";
      p.why = "no readable " + std::string(kStagingMarkerName) + " marker";
    } else {
      p.state = "in progress";
    }
    return p;
  }
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
    auto inside = storage->ListDir(step_path);
    if (!inside.ok()) return inside.status();
    for (const std::string& n : inside.value()) {
      uint64_t r = 0;
      std::string final_name;
      if (ParseNumbered(n, "complete-", 5, &r)) {
        auto f = step_dir.value()->OpenFile(n);
        std::string run;
        if (f.ok() && f.value()->size() <= 64) {
          run.resize(f.value()->size());
          if (!f.value()->ReadAt(0, run.data(), run.size()).ok()) run.clear();
        }
        if (f.ok()) s.markers.emplace_back(static_cast<uint32_t>(r), run);
      } else if (ParseNumbered(n, "part-", 5, &r) ||
                 (ParseStagingName(n, &final_name) && ParseNumbered(final_name, "part-", 5, &r))) {
        s.parts.push_back(DescribePart(storage, step_dir.value().get(), step_path, n, step));
      } else {
        report.other.push_back(name + "/" + n);
      }
    }
    // Restorable here: a marked run of which every rank's part is here, complete.
    std::set<std::string> runs;
    for (const auto& m : s.markers) runs.insert(m.second);
    for (const std::string& run : runs) {
      uint32_t ranks = 0;
      std::set<int64_t> have;
      for (const TierPart& p : s.parts) {
        if (p.state == "complete" && p.run == run) ranks = std::max(ranks, p.ranks), have.insert(p.rank);
      }
      if (ranks > 0 && have.size() == ranks && *have.begin() == 0 && *have.rbegin() == ranks - 1) {
        s.restorable_run = run;
      }
    }
    report.steps.push_back(std::move(s));
  }
  std::sort(report.steps.begin(), report.steps.end(),
            [](const TierStep& a, const TierStep& b) { return a.step < b.step; });
  // A step with no marker and nothing in progress, older than a complete one here, is what the manager would have
  // removed had it lived: abandoned.
  uint64_t newest_complete = 0;
  bool any_complete = false;
  for (const TierStep& s : report.steps) {
    if (!s.markers.empty()) newest_complete = s.step, any_complete = true;
  }
  for (TierStep& s : report.steps) {
    bool busy = false;
    for (const TierPart& p : s.parts) busy = busy || p.state == "in progress";
    s.abandoned = s.markers.empty() && !busy && any_complete && s.step < newest_complete;
  }
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
           ",\"run\":" + JsonQuote(p.run) + ",\"bytes\":" + std::to_string(p.bytes) +
           ",\"state\":" + JsonQuote(p.state) + ",\"why\":" + JsonQuote(p.why) + "}";
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
  auto remove = [&](const std::string& path, bool checkpoint) -> Status {
    if (removed) DCKPT_RETURN_IF_ERROR(removed(path));
    if (dry_run) return OkStatus();
    return checkpoint ? RemoveCheckpoint(storage, path) : storage->RemoveAll(path);
  };
  for (const TierStep& s : report.steps) {
    const std::string step_path = dir + "/" + StepName(s.step);
    for (const TierPart& p : s.parts) {
      const bool staging_gone = p.state == "abandoned";
      if (!staging_gone && !s.abandoned) continue;
      if (p.state == "in progress") continue;
      if (p.state == "damaged" && !s.abandoned) continue;  // a damaged part of a live step is for a person to see
      if (!p.directory) continue;  // a link or a file named like a part: never followed, never removed
      DCKPT_RETURN_IF_ERROR(remove(step_path + "/" + p.name, p.state == "complete"));
    }
    if (s.abandoned && !dry_run) (void)storage->RemoveEmptyDir(step_path);
  }
  return OkStatus();
}

}  // namespace distckpt
