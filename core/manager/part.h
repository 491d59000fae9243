// A rank's part of a step: the checkpoint manager saves each rank's pieces as one ordinary single-rank checkpoint
// (a "part"), and merges the parts of a step back into the metadata of one checkpoint that tiles every tensor, to
// restore from (resharding) or to persist.
//
// In a part, piece k of tensor T is the entry "T#k" whose shape is the piece's lengths; the user key kPartKey says
// whose part it is ("rank=R ranks=N step=S"), and kPartBoxesKey where each piece entry lies in its tensor (one line
// per piece entry: entry name, tensor name, offsets, global shape; names percent-escaped). Bytes entries keep their
// names; the state's structure is kept under kPartStructureKey. A part is verifiable and inspectable by every client
// like any checkpoint (a flat one of its piece entries).
#ifndef DISTCKPT_CORE_MANAGER_PART_H_
#define DISTCKPT_CORE_MANAGER_PART_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"
#include "core/engine/state.h"
#include "core/format/metadata.h"

namespace distckpt {

constexpr char kPartKey[] = "dckpt.part";
constexpr char kPartBoxesKey[] = "dckpt.part.boxes";
/// The state's structure (a binding's nested layout, which names the tensors, not the part's piece entries) is kept
/// under this user key, so that a part opens in every client as a flat checkpoint of its piece entries.
constexpr char kPartStructureKey[] = "dckpt.part.structure";

struct PartInfo {
  uint32_t rank = 0;
  uint32_t ranks = 0;  ///< the world size of the job that saved the step
  uint64_t step = 0;
};

/// The state a rank's part is saved from: borrows `state`'s buffers (pieces keep their memory location).
Result<State> MakePartState(const State& state, const PartInfo& info);

/// The tensors of `state` as one rank declares them (names, dtypes, shapes, piece boxes), for CheckLayouts.
std::string EncodeLayout(const State& state);
/// Checks, as a collective save does before writing, that the ranks' pieces (`layouts`, one per rank, from
/// EncodeLayout) tile every tensor exactly, with one dtype and shape per tensor; identical boxes on several ranks
/// (replicas) are fine. kInvalidArgument naming `context`, the tensor and the problem.
Status CheckLayouts(const std::vector<std::string>& layouts, const std::string& context);

/// A part's metadata, checked: its part keys parse, every piece entry is listed once and lies inside its tensor.
struct Part {
  PartInfo info;
  MetadataRecord record;
  struct Piece {
    std::string entry;   ///< "T#k"
    std::string tensor;  ///< "T"
    std::vector<uint64_t> offsets;
    std::vector<uint64_t> shape;  ///< T's global shape
  };
  std::vector<Piece> pieces;
};
/// Parses the metadata file bytes of a part. `context` (the part's path) prefixes errors (kCorrupt).
Result<Part> ParsePart(const std::string& metadata_bytes, const std::string& context);
/// PartInfo of a metadata view, or kCorrupt when it is not a part.
Result<PartInfo> PartInfoOf(const MetadataView& view, const std::string& context);

/// ChunkLocation::file of a chunk of a part that another part writes (the checkpoint manager persists a box several
/// parts hold once, core/manager/persist.h): MergeParts leaves it out.
constexpr uint32_t kChunkNotWritten = UINT32_MAX;

/// Merges the parts of one step (every rank 0..ranks-1 once, any order) into the metadata file of one checkpoint whose
/// data file DataFileName(b + k) ("data-<5 digits>.bin", the names any save gives) is data file k of part r, where b
/// is the number of data files of the parts of the ranks below r (files of the parts' own: a data file of a base,
/// DataFileRecord::base >= 1, stays one, once, after them). Tensors get their global shapes, with each piece's chunks
/// moved to the piece's place; a box several parts hold (replicated data) is kept once (the lowest rank's that was
/// written: chunks at kChunkNotWritten are left out); a bytes entry several parts hold must have one size (the lowest
/// rank's is kept); chunk hashes (where every chunk of the entry has one), codings and stored blocks go along. Bases
/// are merged by name (parts naming one base must agree on its metadata checksum and size), the chain length is the
/// longest. User metadata and structure are rank 0's (the structure from kPartStructureKey; the part keys dropped).
/// The result is validated like any metadata (chunks tile every tensor), so parts that do not make up a whole
/// checkpoint are refused (kCorrupt naming `context` and the tensor). `file_name`, if given, names the merged data
/// files instead (it is passed DataFileName(b + k)).
Result<std::string> MergeParts(const std::vector<Part>& parts, const std::string& context,
                               const std::function<std::string(const std::string&)>& file_name = nullptr);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_MANAGER_PART_H_
