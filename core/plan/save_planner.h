// Save planning: merge every rank's local plan into one global plan. Dedups replicated boxes (each written once,
// balanced across replicas by bytes), checks exact tiling and consistency, and assigns files and offsets.
// Pure computation: no I/O, no communication.
#ifndef DISTCKPT_CORE_PLAN_SAVE_PLANNER_H_
#define DISTCKPT_CORE_PLAN_SAVE_PLANNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/base/box.h"
#include "core/base/dtype.h"
#include "core/base/status.h"
#include "core/format/metadata.h"

namespace distckpt {

/// What an incremental save knows of a piece's bytes before writing them (FORMAT.md 5.1): its chunk checksum and
/// chunk hash. `known` is false for a piece that was not hashed (device memory): it is always written.
struct ChunkFingerprint {
  bool known = false;
  uint64_t checksum = 0;
  ChunkHash hash;
};

/// What one rank holds of one tensor: its dtype/global shape and the boxes of its local pieces.
struct LocalTensorDecl {
  std::string name;
  DType dtype = DType::kInvalid;
  std::vector<uint64_t> shape;
  std::vector<Box> boxes;  ///< one per local piece, in the rank's own order
  /// Incremental saves only: one per box, or empty.
  std::vector<ChunkFingerprint> fingerprints;
};

/// A bytes entry held by one rank. If several ranks declare the same name, the sizes must agree and one writes it.
struct LocalBytesDecl {
  std::string name;
  uint64_t size = 0;
  ChunkFingerprint fingerprint;  ///< incremental saves only
};

/// One rank's local plan.
struct LocalPlan {
  uint32_t rank = 0;
  std::vector<LocalTensorDecl> tensors;
  std::vector<LocalBytesDecl> bytes;
};

/// A chunk an incremental save does not write: its bytes are already in an earlier checkpoint's data file.
struct ReusedChunk {
  uint32_t base = 0;       ///< 1-based index into MetadataRecord::bases (DataFileRecord::base)
  std::string file;        ///< the data file of that base
  uint64_t file_size = 0;  ///< its size
  uint64_t offset = 0;     ///< where the chunk lies in it
  uint64_t checksum = 0;
  std::vector<uint64_t> blocks;  ///< its block checksums (empty for a single block)
  ChunkHash hash;
  ChunkCoding coding;               ///< how the base stores it (format 3.0; raw by default)
  std::vector<StoredBlock> stored;  ///< its stored blocks when compressed
};

/// Asked once per chunk that has bytes, once its writer is chosen (`fingerprint`: the writer's, possibly unknown):
/// true and `*out` filled when the chunk is not to be written.
using ReuseFn = std::function<bool(const EntryRecord& entry, uint32_t chunk, const ChunkFingerprint& fingerprint,
                                   ReusedChunk* out)>;

struct SavePlanOptions {
  uint64_t alignment = kChunkAlignment;
  uint64_t checksum_block_size = kDefaultChecksumBlockSize;
  /// Incremental saves: decides which chunks are already stored (null: every chunk is written). The planner adds a
  /// file record for each base file a reused chunk names; the caller fills MetadataRecord::bases after planning.
  ReuseFn reuse;
};

/// The checksums a writer computed for one chunk.
struct ChunkChecksums {
  uint32_t entry = 0;
  uint32_t chunk = 0;
  uint64_t checksum = 0;
  std::vector<uint64_t> blocks;  ///< empty when the chunk has a single block
  ChunkHash hash;                ///< the chunk hash (FORMAT.md 5.1)
  bool has_hash = true;          ///< false: the writer did not compute it (SaveOptions::chunk_hashes off)
  /// Format 3.0: how the chunk is stored (raw by default) and, when compressed, its stored blocks.
  ChunkCoding coding;
  std::vector<StoredBlock> stored;
  /// A compressed save's writer lays its file out itself (stored sizes are known only once written): the chunk's
  /// offset and the size of the file, which replace the plan's.
  bool placed = false;
  uint64_t offset = 0;
  uint64_t file_size = 0;
};

/// One chunk a rank must write.
struct WriteTask {
  uint32_t entry = 0;  ///< index into GlobalPlan::metadata.entries
  uint32_t chunk = 0;  ///< index into that entry's chunks
  /// Tensor: index into the rank's LocalTensorDecl::boxes; bytes: unused (0). The one chunk of a zero-element
  /// tensor has length 0, and if no rank holds a piece of it `local` names none: check `length` before indexing.
  uint32_t local = 0;
  uint32_t file = 0;    ///< index into metadata.files
  uint64_t offset = 0;  ///< byte offset in the file (aligned)
  uint64_t length = 0;  ///< bytes
};

struct GlobalPlan {
  /// Entries sorted by name with shapes, chunk boxes and locations filled in; checksums are zero and block tables
  /// empty until the writers report them (see FinalizeChecksums). Files are named data-%05u.bin, one per rank that
  /// writes anything, with their final sizes.
  MetadataRecord metadata;
  /// per_rank[r]: the chunks rank r writes, in increasing file offset order.
  std::vector<std::vector<WriteTask>> per_rank;
  /// For each rank and each of its LocalPlan tensors (in the rank's order): the entry index.
  std::vector<std::vector<uint32_t>> tensor_entry;
  /// Same for bytes declarations.
  std::vector<std::vector<uint32_t>> bytes_entry;
  /// The chunks SavePlanOptions::reuse took from a base: located already, written by no rank; their checksums go
  /// to FinalizeChecksums with the writers'.
  std::vector<ChunkChecksums> reused;
};

/// Merges the plans (plans[r].rank must equal r). Errors name the tensor and the ranks involved: dtype or shape
/// disagreement, boxes outside the tensor, overlaps and holes, bytes size disagreement.
/// options.alignment must be a power of two >= kChunkAlignment. Empty boxes are accepted and produce no chunk,
/// except that a tensor with zero elements gets exactly one empty chunk, written by the lowest declaring rank that
/// holds a piece of it (else the lowest declaring rank).
/// Runs in O(boxes log boxes) time and memory linear in the number of boxes; the writer, user and structure fields
/// of the metadata are left for the caller.
Result<GlobalPlan> MakeGlobalPlan(const std::vector<LocalPlan>& plans, const SavePlanOptions& options);

/// The data file rank `rank` writes: "data-%05u.bin".
std::string DataFileName(uint32_t rank);

/// The part of a GlobalPlan that one rank needs back from the coordinator to write its chunks.
struct RankAssignment {
  uint32_t rank = 0;
  std::vector<WriteTask> tasks;        ///< GlobalPlan::per_rank[rank]
  std::vector<uint32_t> tensor_entry;  ///< GlobalPlan::tensor_entry[rank]
  std::vector<uint32_t> bytes_entry;   ///< GlobalPlan::bytes_entry[rank]
};

/// Copies rank `rank`'s share out of `plan`. Fails if the plan has no such rank.
Result<RankAssignment> GetRankAssignment(const GlobalPlan& plan, uint32_t rank);

/// Stores every writer's checksums into plan->metadata (chunk checksum, first_block, block_checksums, chunk hashes,
/// and for compressed saves the codings, stored blocks, offsets and file sizes the writers chose). Fails if a chunk
/// is reported twice or missing.
Status FinalizeChecksums(const std::vector<ChunkChecksums>& reports, GlobalPlan* plan);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_PLAN_SAVE_PLANNER_H_
