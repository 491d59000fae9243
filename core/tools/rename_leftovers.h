// What unfinished saves, overwrites and prunes leave beside checkpoints on a file system (the rename layout, FORMAT.md
// section 6.1), and removing it safely: "<name>.dckpt-staging-<nonce>" (a save in progress, abandoned, or complete but
// never renamed), "<name>.dckpt-old-<nonce>" (a checkpoint an overwrite moved aside) and
// "<name>.dckpt-deleting-<nonce>" (one a prune moved aside). One judge for every client: the C ABI's
// dckpt_scan_leftovers / dckpt_remove_leftover, dckpt_storage_stat and dckpt_storage_remove_leftovers on a POSIX path,
// Python, Rust and Go's store.Prune.
//
// Safety: only directories with those names are ever looked at or removed; symbolic links are never followed (a link
// named like a leftover is not one); a directory is removed only after it has been moved to a "deleting" name and
// found, there, to be the very directory that was judged (device and inode), so nothing swapped in meanwhile is
// removed; a staging directory whose writer (its STAGING marker) is a live process on this host is never garbage.
#ifndef DISTCKPT_CORE_TOOLS_RENAME_LEFTOVERS_H_
#define DISTCKPT_CORE_TOOLS_RENAME_LEFTOVERS_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/tools/staging_marker.h"

namespace distckpt {

struct RenameLeftover {
  /// The values are the C ABI's dckpt_leftover_kind.
  enum class Kind {
    kStaging = 1,            ///< a save in progress or abandoned (a STAGING marker, or no marker and no metadata)
    kCompleteUnrenamed = 2,  ///< every rank finished, but the save died before its rename: it never reported success
    kReplaced = 3,           ///< "<name>.dckpt-old-<nonce>": moved aside by an overwrite
    kDeleting = 4,           ///< "<name>.dckpt-deleting-<nonce>": moved aside by an interrupted prune
  };
  std::string path;        ///< dir + "/" + name
  std::string name;        ///< the directory's own name
  std::string final_name;  ///< the checkpoint name it belongs to
  Kind kind = Kind::kStaging;
  uint64_t bytes = 0;       ///< regular files below it (not following links)
  double idle_seconds = 0;  ///< since the newest change of the directory or an entry directly in it
  bool has_marker = false;  ///< a STAGING marker was read (kStaging)
  StagingMarker marker;     ///< what it says
  WriterState writer = WriterState::kUnknown;
  bool garbage = false;            ///< safe to remove under the grace period it was judged with
  std::string reason;              ///< why, in words: "abandoned: writer pid 12 on this host has exited; idle 2h01m"
  uint64_t device = 0, inode = 0;  ///< its identity when judged
};

/// Every leftover directly in `dir`, sorted by name; with `final_name` non-empty, only that checkpoint's. A directory
/// that is not there gives none.
Result<std::vector<RenameLeftover>> ScanRenameLeftovers(const std::string& dir, std::chrono::seconds grace,
                                                        const std::string& final_name = "");

/// The leftovers of the checkpoint at `checkpoint_path`: those beside it, named after it.
Result<std::vector<RenameLeftover>> RenameLeftoversBeside(const std::string& checkpoint_path,
                                                          std::chrono::seconds grace);

/// Judges the leftover at `path` anew (kNotFound if it is not one) and removes it if it is garbage now: moved to a
/// deleting name, checked to be the same directory there, then removed without following links. kState, naming it and
/// why, if it is not garbage (any more).
Status RemoveRenameLeftover(const std::string& path, std::chrono::seconds grace);

/// "2h01m", "45m", "20s": how reasons print durations.
std::string HumanDuration(double seconds);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_TOOLS_RENAME_LEFTOVERS_H_
