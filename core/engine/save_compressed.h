// Internal to the engine: the writer of a compressed save's chunks (SaveOptions::compression). Stored sizes are known
// only once a block is compressed, so the writing rank lays its data file out as it goes: chunks one after another on
// aligned offsets, every byte between them written (zeros), so storage that uploads in parts never waits for a gap.
#ifndef DISTCKPT_CORE_ENGINE_SAVE_COMPRESSED_H_
#define DISTCKPT_CORE_ENGINE_SAVE_COMPRESSED_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "core/base/status.h"
#include "core/base/thread_pool.h"
#include "core/format/checksum.h"
#include "core/format/metadata.h"
#include "core/plan/save_planner.h"
#include "core/storage/storage.h"

namespace distckpt {

/// One chunk to compress: the host bytes of the writer's task `task`, whose elements are `width` bytes wide.
struct CompressedChunk {
  size_t task = 0;
  const char* data = nullptr;
  uint64_t length = 0;  ///< > 0
  size_t width = 1;
};

struct CompressedWriteOptions {
  uint64_t block_size = kDefaultChecksumBlockSize;
  uint64_t alignment = kChunkAlignment;
  int level = 0;  // kEntropyLevel
  bool chunk_hashes = true;
  /// Called with the decoded bytes of each block once it is written; an error aborts.
  std::function<Status(uint64_t)> progress;
};

/// Where each task's hashes go (indexed by task): the caller combines them as for raw chunks.
struct ChunkHashSinks {
  std::vector<ChunkChecksums>* reports;               ///< blocks (several-block chunks), coding, stored, offset
  std::vector<uint64_t>* single;                      ///< the checksum of a single-block chunk
  std::vector<std::vector<ChunkHash>>* block_hashes;  ///< each block's XXH3-128 (sized by the caller)
};

/// Compresses and writes `chunks` in order into `file` from `start` (aligned) on, block by block on `pool`: a window
/// of blocks is hashed and compressed in parallel while the previous one is written. Fills each chunk's report (its
/// offset, coding and stored blocks; `placed` is left to the caller) and returns where the last chunk ends.
Result<uint64_t> WriteCompressedChunks(WritableFile* file, uint64_t start, const std::vector<CompressedChunk>& chunks,
                                       const CompressedWriteOptions& options, ThreadPool* pool,
                                       const ChunkHashSinks& sinks);

/// Writes zeros over [from, to) of `file` (the padding between chunks of a file that is written densely).
Status WriteZeros(WritableFile* file, uint64_t from, uint64_t to);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_SAVE_COMPRESSED_H_
