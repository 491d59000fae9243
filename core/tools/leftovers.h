// What is at a checkpoint path of the metadata-last layout (FORMAT.md section 6.2), and removing what unfinished or
// superseded saves left there. The prune of object stores: Python, Go and Rust reach it through the C ABI
// (dckpt_storage_stat, dckpt_storage_remove_leftovers, dckpt_storage_remove_checkpoint).
#ifndef DISTCKPT_CORE_TOOLS_LEFTOVERS_H_
#define DISTCKPT_CORE_TOOLS_LEFTOVERS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {

struct CheckpointScan {
  enum class Kind { kNone, kCheckpoint, kIncomplete };
  Kind kind = Kind::kNone;
  uint64_t files = 0;  ///< distckpt's files there: metadata, data files, markers
  uint64_t bytes = 0;
  uint64_t leftover_files = 0;  ///< of which no committed checkpoint's, and no running save's
  uint64_t leftover_bytes = 0;
  unsigned saves_in_progress = 0;  ///< markers of saves younger than the grace period (their writers may be alive)
  /// Names (below the path) that RemoveLeftovers would remove: data files before markers.
  std::vector<std::string> leftovers;
};

/// Looks at `path`. A marker is stale (its save abandoned) when it is older than `grace`, or names a process of this
/// host that no longer exists. kCorrupt, naming the path, when metadata is there but cannot be read as a checkpoint's
/// (then nothing can be judged unreferenced).
Result<CheckpointScan> ScanCheckpointPath(Storage* storage, const std::string& path, std::chrono::seconds grace);

/// Removes the leftovers ScanCheckpointPath finds (never the committed checkpoint, a running save's files, or a name
/// distckpt does not write). `removed` is told each path first (with dry_run: instead of removing it); an error from it
/// stops the removal.
Status RemoveLeftovers(Storage* storage, const std::string& path, std::chrono::seconds grace, bool dry_run,
                       const std::function<Status(const std::string&)>& removed);

/// Removes the checkpoint at `path`: its metadata first (it stops existing in one step), then its data files, then
/// leftovers (with no grace; running saves' files excepted), then the directory itself if that left it empty.
/// kNotFound when nothing distckpt wrote is there.
Status RemoveCheckpoint(Storage* storage, const std::string& path);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_TOOLS_LEFTOVERS_H_
