// Load: fill a State's buffers in place from a checkpoint, resharding as needed. No collective is needed to plan.
#ifndef DISTCKPT_CORE_ENGINE_LOAD_H_
#define DISTCKPT_CORE_ENGINE_LOAD_H_

#include <string>

#include "core/base/status.h"
#include "core/comm/communicator.h"
#include "core/engine/reader.h"
#include "core/engine/state.h"

namespace distckpt {

struct LoadSummary {
  IoStats io;
  uint32_t entries = 0;      ///< entries this rank loaded
  double seconds = 0;
};

/// Loads every tensor piece and bytes entry of `state` from the checkpoint at `path`. Tensors must exist with the
/// same dtype and global shape; each rank reads only the byte ranges its pieces need. Collective when `comm` has
/// several ranks (the metadata is read once and broadcast; at the end every rank learns whether all succeeded, so a
/// failure on one rank fails all of them).
Result<LoadSummary> Load(const std::string& path, State& state, Communicator* comm, const ReadOptions& options);

/// The same through an open reader: from the checkpoint it opened, with its options (verify, mapping, shared
/// verification, timeout), without reading the metadata again. Collective when `comm` has several ranks; `comm` must
/// be the communicator the reader was opened with (every rank opened it). A binding that reads the structure and
/// bytes entries through a reader loads its tensors this way, so that everything comes from one checkpoint.
Result<LoadSummary> Load(Reader* reader, State& state, Communicator* comm, const ProgressFn& progress);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_LOAD_H_
