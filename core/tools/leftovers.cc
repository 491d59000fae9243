#include "core/tools/leftovers.h"

#include <ctime>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "core/engine/base_checkpoint.h"
#include "core/format/metadata.h"
#include "core/tools/rename_leftovers.h"
#include "core/tools/staging_marker.h"

namespace distckpt {
namespace {

// A marker's save is abandoned when its writer, on this host, has exited, or, when nobody can tell whether it runs (a
// writer on another host), when it started longer than `grace` ago. A writer of this host that still runs is never
// abandoned, however long its save takes (the rename layout judges it so too): RemoveCheckpoint's grace of 0 removed
// the files of a save running beside it once a second had passed since it started.
bool MarkerIsStale(const std::string& text, const std::string& nonce, std::chrono::seconds grace) {
  const StagingMarker marker = ParseStagingMarker(text);
  const WriterState writer = WriterStateOf(marker, nonce);
  if (writer == WriterState::kExited) return true;
  if (writer == WriterState::kRunning) return false;
  const std::optional<std::time_t> started = StartedAt(marker);
  if (!started) return false;  // unknown age: keep
  return std::time(nullptr) - *started > grace.count();
}

// "data-<digits>.bin": a data file as the rename protocol names it (a checkpoint copied from a file system).
bool IsPlainDataFileName(const std::string& name) {
  const std::string prefix = "data-", suffix = ".bin";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  for (size_t i = prefix.size(); i < name.size() - suffix.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return true;
}

struct Judged {
  CheckpointScan scan;
  bool has_metadata = false;
  std::vector<std::string> committed;  // metadata first, then data files
};

Result<Judged> Judge(Storage* storage, const std::string& path, std::chrono::seconds grace) {
  Judged j;
  auto listed = storage->ListDir(path);
  if (!listed.ok()) {
    if (listed.status().code() == StatusCode::kNotFound) return j;
    return listed.status();
  }
  std::set<std::string> referenced;
  std::set<std::string> committed_nonces;
  std::map<std::string, uint64_t> sizes;
  for (const std::string& name : *listed) {
    if (name != kMetadataFileName && !ParseObjectMarkerName(name, nullptr) && !ParseNoncedFileName(name, nullptr)) {
      continue;  // not distckpt's: never counted, never removed
    }
    auto size = storage->FileSize(path + "/" + name);
    if (!size.ok()) {
      if (size.status().code() == StatusCode::kNotFound) continue;  // removed meanwhile
      return size.status();
    }
    sizes[name] = *size;
  }
  if (sizes.count(kMetadataFileName)) {
    j.has_metadata = true;
    auto bytes = storage->ReadFile(path + "/metadata.dckpt", kMaxMetadataBytes - 1);
    if (!bytes.ok()) return bytes.status();
    auto view = MetadataView::Parse(std::make_shared<const std::string>(std::move(bytes).value()), path);
    if (!view.ok()) {
      return Status(StatusCode::kCorrupt, "the metadata of checkpoint '" + path + "' cannot be read (" +
                                              view.status().message() +
                                              "), so nothing there can be judged unreferenced; nothing was removed");
    }
    j.committed.push_back(kMetadataFileName);
    for (size_t i = 0; i < view->num_files(); ++i) {
      const std::string name(view->file_name(i));
      referenced.insert(name);
      // Only names distckpt writes are ever removed: metadata may name any file (a checkpoint copied from a file
      // system has "data-00000.bin"; a hostile one could name a neighbour's "notes.txt").
      if (ParseNoncedFileName(name, nullptr) || IsPlainDataFileName(name)) j.committed.push_back(name);
      std::string nonce;
      if (ParseNoncedFileName(name, &nonce)) committed_nonces.insert(nonce);
    }
  }
  // Markers: a committed save's is garbage; a stale one's save is abandoned; the rest are saves in progress.
  std::set<std::string> live;
  std::vector<std::string> dead_markers;
  for (const auto& [name, size] : sizes) {
    std::string nonce;
    if (!ParseObjectMarkerName(name, &nonce)) continue;
    if (!committed_nonces.count(nonce)) {
      auto text = storage->ReadFile(path + "/" + name, 1 << 16);
      if (!text.ok() && text.status().code() == StatusCode::kNotFound) continue;
      if (!text.ok() || !MarkerIsStale(*text, nonce, grace)) {
        live.insert(nonce);
        continue;
      }
    }
    dead_markers.push_back(name);
  }
  for (const auto& [name, size] : sizes) {
    ++j.scan.files;
    j.scan.bytes += size;
    std::string nonce;
    if (name == kMetadataFileName || referenced.count(name)) continue;
    if (ParseNoncedFileName(name, &nonce) && live.count(nonce)) continue;
    if (ParseObjectMarkerName(name, &nonce)) continue;  // counted below
    ++j.scan.leftover_files;
    j.scan.leftover_bytes += size;
    j.scan.leftovers.push_back(name);
  }
  for (const std::string& m : dead_markers) {
    ++j.scan.leftover_files;
    j.scan.leftover_bytes += sizes[m];
    j.scan.leftovers.push_back(m);  // markers last: while one exists, its save's files stay recognisable
  }
  j.scan.saves_in_progress = static_cast<unsigned>(live.size());
  j.scan.kind = j.has_metadata  ? CheckpointScan::Kind::kCheckpoint
                : sizes.empty() ? CheckpointScan::Kind::kNone
                                : CheckpointScan::Kind::kIncomplete;
  return j;
}

// Removes `names` below `path`; a data file only while its save still has no marker that is not stale (asked again
// right before, so that a save starting meanwhile keeps its files).
Status RemoveNames(Storage* storage, const std::string& path, const std::vector<std::string>& names,
                   const std::set<std::string>& stale_markers, bool dry_run,
                   const std::function<Status(const std::string&)>& removed) {
  for (const std::string& name : names) {
    std::string nonce;
    if (ParseNoncedFileName(name, &nonce) && !stale_markers.count(ObjectMarkerName(nonce))) {
      DCKPT_ASSIGN_OR_RETURN(bool marker, storage->Exists(path + "/" + ObjectMarkerName(nonce)));
      if (marker) continue;
    }
    const std::string full = path + "/" + name;
    if (removed) DCKPT_RETURN_IF_ERROR(removed(full));
    if (!dry_run) DCKPT_RETURN_IF_ERROR(storage->RemoveAll(full));
  }
  return OkStatus();
}

std::set<std::string> Markers(const std::vector<std::string>& names) {
  std::set<std::string> out;
  for (const std::string& n : names) {
    if (ParseObjectMarkerName(n, nullptr)) out.insert(n);
  }
  return out;
}

// On a file system, the directories unfinished saves, overwrites and prunes left beside `path` (FORMAT.md 6.1).
Result<std::vector<RenameLeftover>> RenameLeftoversOf(Storage* storage, const std::string& path,
                                                      std::chrono::seconds grace) {
  if (storage->name() != "posix") return std::vector<RenameLeftover>();
  return RenameLeftoversBeside(path, grace);
}

}  // namespace

Result<CheckpointScan> ScanCheckpointPath(Storage* storage, const std::string& path, std::chrono::seconds grace) {
  auto j = Judge(storage, path, grace);
  if (!j.ok()) return j.status().WithContext("looking at '" + path + "'");
  auto beside = RenameLeftoversOf(storage, path, grace);
  if (!beside.ok()) return beside.status().WithContext("looking at '" + path + "'");
  CheckpointScan scan = std::move(j)->scan;
  for (const RenameLeftover& l : *beside) {  // each directory counts as one file
    ++scan.files;
    scan.bytes += l.bytes;
    if (l.garbage) {
      ++scan.leftover_files;
      scan.leftover_bytes += l.bytes;
    } else if (l.kind == RenameLeftover::Kind::kStaging || l.kind == RenameLeftover::Kind::kCompleteUnrenamed) {
      ++scan.saves_in_progress;
    }
  }
  if (scan.kind == CheckpointScan::Kind::kNone && !beside->empty()) scan.kind = CheckpointScan::Kind::kIncomplete;
  return scan;
}

Status RemoveLeftovers(Storage* storage, const std::string& path, std::chrono::seconds grace, bool dry_run,
                       const std::function<Status(const std::string&)>& removed) {
  const std::string context = "removing leftovers at '" + path + "'";
  auto j = Judge(storage, path, grace);
  if (!j.ok()) return j.status().WithContext(context);
  DCKPT_RETURN_IF_ERROR(
      RemoveNames(storage, path, j->scan.leftovers, Markers(j->scan.leftovers), dry_run, removed).WithContext(context));
  auto beside = RenameLeftoversOf(storage, path, grace);
  if (!beside.ok()) return beside.status().WithContext(context);
  for (const RenameLeftover& l : *beside) {
    if (!l.garbage) continue;
    if (removed) DCKPT_RETURN_IF_ERROR(removed(l.path).WithContext(context));
    if (dry_run) continue;
    Status st = RemoveRenameLeftover(l.path, grace);  // judged again: a writer may have come back meanwhile
    if (!st.ok() && st.code() != StatusCode::kNotFound && st.code() != StatusCode::kState) return st;
  }
  return OkStatus();
}

Status RemoveCheckpoint(Storage* storage, const std::string& path) {
  const std::string context = "removing checkpoint '" + path + "'";
  auto j = Judge(storage, path, std::chrono::seconds(0));
  if (!j.ok()) return j.status().WithContext(context);
  if (j->scan.kind == CheckpointScan::Kind::kNone) return NotFound(context + ": no checkpoint is there");
  if (j->scan.kind == CheckpointScan::Kind::kCheckpoint) {
    DCKPT_RETURN_IF_ERROR(CheckNoDependents(storage, path, "removing"));
  }
  // The metadata goes first and alone: from then on the checkpoint does not exist, and what remains are leftovers.
  std::vector<std::string> names = j->committed;
  names.insert(names.end(), j->scan.leftovers.begin(), j->scan.leftovers.end());
  DCKPT_RETURN_IF_ERROR(
      RemoveNames(storage, path, names, Markers(j->scan.leftovers), false, nullptr).WithContext(context));
  // The checkpoint's directory too, where the backend has them, once nothing is left in it (a file distckpt did not
  // write, or a running save's, keeps it).
  return storage->RemoveEmptyDir(path).WithContext(context);
}

}  // namespace distckpt
