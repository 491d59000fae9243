// A self-contained copy of an incremental checkpoint (FORMAT.md 4.1): every chunk, wherever it lies, in data files of
// the copy's own. The one implementation behind `distckpt flatten` (Go), distckpt.flatten (Python) and dckpt_flatten.
#ifndef DISTCKPT_CORE_TOOLS_FLATTEN_H_
#define DISTCKPT_CORE_TOOLS_FLATTEN_H_

#include <cstdint>
#include <string>

#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {

struct FlattenSummary {
  uint64_t bytes_copied = 0;      ///< data bytes read, verified and written (all of them: the copy holds every chunk)
  uint64_t bytes_from_bases = 0;  ///< of which the source held in its bases
  uint32_t num_files = 0;         ///< data files of the copy
};

/// Writes a self-contained copy of the checkpoint at `src` to `dst`: every chunk read (from `src` or the bases it
/// refers to), checked against its checksums, and written to the copy's own data files; the metadata is `src`'s with no
/// references (format 1.x). Committed atomically as a save is (`dst` may be `src` itself with `overwrite`, which makes
/// it self-contained in place; a checkpoint other incremental ones refer to is not overwritten). A foreign checkpoint
/// is kInvalidArgument. `storage`: nullptr for the POSIX file system.
Result<FlattenSummary> FlattenCheckpoint(const std::string& src, const std::string& dst, bool overwrite,
                                         Storage* storage = nullptr);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_TOOLS_FLATTEN_H_
