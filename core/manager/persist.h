// Persisting a step of the checkpoint manager (CheckpointManager::Persist, docs/manager.md "Persistent tier"):
// rank 0 plans, from every rank's part, which rank writes each box (a box several parts hold, replicated data, is
// written once, by the holder with the fewest bytes to write so far) and which boxes the previous persisted step
// already holds with the same XXH3-128 (incremental persisting: referred to, not written); each rank copies its boxes
// from its part into one data file of the persisted checkpoint, compressed if asked, checked against the part's
// checksums on the way; rank 0 then merges the parts, patched with where every chunk went, into the metadata.
#ifndef DISTCKPT_CORE_MANAGER_PERSIST_H_
#define DISTCKPT_CORE_MANAGER_PERSIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/base/thread_pool.h"
#include "core/format/metadata.h"
#include "core/manager/part.h"
#include "core/plan/save_planner.h"
#include "core/storage/storage.h"

namespace distckpt {

/// Which chunks each rank writes. A chunk is named by its flat index in its part: the chunks of the part record's
/// entries, in entry order.
struct PersistPlan {
  std::vector<std::vector<uint32_t>> writes;  ///< per rank, ascending
  uint64_t bytes_to_write = 0;                ///< data bytes the ranks copy (before compression)
  uint64_t bytes_reused = 0;                  ///< data bytes referred to in the base
};

/// Rank 0: plans the persisting of `parts` (one per rank, indexed by rank) and patches them: a chunk another part
/// writes gets ChunkLocation::file kChunkNotWritten; with `reuse` (IncrementalBase::Reuse of the base, or null), a
/// chunk whose box, length and chunk hash the base holds refers to the base's file (a DataFileRecord with base >= 1);
/// a chunk the rank writes refers to the part's file 0 (each part's files become: its one new data file if it writes
/// anything, then the base files), its offset and coding set by ApplyWrites. The caller sets each record's bases.
Result<PersistPlan> PlanPersist(std::vector<Part>* parts, const ReuseFn& reuse);

/// The plan as rank 0 sends it to every rank (the writes only).
std::string EncodePlan(const PersistPlan& plan);
Result<PersistPlan> DecodePlan(const std::string& encoded, uint32_t ranks);

struct PersistWriteOptions {
  Codec compression = Codec::kRaw;
  int compression_level = 0;
  ThreadPool* pool = nullptr;  ///< compresses and writes (required with compression)
};

/// Each rank: copies chunks `writes` of `part` (whose data files are in `part_dir` on `local`) into `out`, one after
/// another on aligned offsets, every gap written: a raw chunk compressed when asked (the computed checksums must equal
/// the part's), any other copied as stored and checked (CopyChunkVerified). A mismatch is kCorrupt naming the part,
/// the entry, the chunk and the file. Returns where each chunk went (offset, coding and stored blocks, and the file's
/// size; EncodeChunkReports carries them to rank 0); *stored_bytes: the bytes written.
Result<std::vector<ChunkChecksums>> WritePersistedChunks(Storage* local, const std::string& part_dir, const Part& part,
                                                         const std::vector<uint32_t>& writes, WritableFile* out,
                                                         const PersistWriteOptions& options, uint64_t* stored_bytes);

/// Rank 0: puts what a rank wrote (WritePersistedChunks, in the order of its `writes`) into its part as patched by
/// PlanPersist: the new data file's size and each written chunk's offset and coding. kInternal naming `context` when
/// the reports do not match the plan.
Status ApplyWrites(const std::vector<ChunkChecksums>& reports, const std::vector<uint32_t>& writes, Part* part,
                   const std::string& context);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_MANAGER_PERSIST_H_
