// Copying a chunk's stored bytes from one data file to another, checked on the way: the one verified copy behind
// flatten (core/tools/flatten.h) and the checkpoint manager's persisting of a step, so neither ever copies a damaged
// byte into a checkpoint that would then look sound.
#ifndef DISTCKPT_CORE_ENGINE_CHUNK_COPY_H_
#define DISTCKPT_CORE_ENGINE_CHUNK_COPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/span.h"
#include "core/base/status.h"
#include "core/format/metadata.h"
#include "core/storage/storage.h"

namespace distckpt {

/// What a copied chunk is, for errors: "checkpoint '<checkpoint>': entry '<entry>' chunk #<chunk>" and the data file.
struct ChunkCopyContext {
  std::string checkpoint;
  std::string entry;
  size_t chunk = 0;
  std::string file;  ///< the path of the data file read
};

/// Copies the chunk at `from` in `in` to offset `to` of `out`, as it is stored: a raw chunk (`stored` empty) is read
/// whole blocks at a time, every block hashed and the chunk's checksum checked from them; a compressed chunk (its
/// `stored` blocks) block by block, each checked against its stored checksum. `buf` is scratch (resized as needed).
/// A mismatch is kCorrupt naming the checkpoint, the entry, the chunk (and block) and the data file. Bytes already
/// written to `out` before a mismatch is found are the caller's to discard (an aborted staging).
Status CopyChunkVerified(const ReadableFile& in, const ChunkLocation& from, Span<const StoredBlock> stored,
                         uint64_t block_size, WritableFile* out, uint64_t to, std::vector<char>* buf,
                         const ChunkCopyContext& what);

/// The bytes `from` takes in its data file: its length, or the sum of its stored blocks.
uint64_t StoredExtent(const ChunkLocation& from, Span<const StoredBlock> stored);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_CHUNK_COPY_H_
