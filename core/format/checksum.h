// Chunk checksums (FORMAT.md "Checksums"): xxHash3-64 per checksum block, combined per chunk.
#ifndef DISTCKPT_CORE_FORMAT_CHECKSUM_H_
#define DISTCKPT_CORE_FORMAT_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/base/span.h"

namespace distckpt {

/// XXH3-64 (seed 0) of a byte range.
uint64_t Xxh3(const void* data, size_t size);

/// A chunk's strong hash (FORMAT.md "Chunk hashes", format 1.2): XXH3-128, laid out as the schema's Hash128.
struct ChunkHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const ChunkHash& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const ChunkHash& o) const { return !(*this == o); }
};

/// XXH3-128 (seed 0) of a byte range.
ChunkHash Xxh3_128(const void* data, size_t size);

/// The chunk hash from the XXH3-128 of each of its checksum blocks: the block's own hash when there is one block,
/// otherwise XXH3-128 of the concatenation of the blocks' hashes (each low then high, little-endian).
ChunkHash CombineBlockHashes(Span<const ChunkHash> block_hashes);

/// The chunk hash of a whole chunk held in memory (blocks of `block_size`, as its checksums).
ChunkHash ChunkStrongHash(const void* data, uint64_t length, uint64_t block_size);

/// Number of checksum blocks a chunk of `length` bytes has: ceil(length / block_size), at least 1.
uint64_t NumChecksumBlocks(uint64_t length, uint64_t block_size);

/// The chunk checksum from its block checksums: the block checksum itself when there is one block, otherwise XXH3-64
/// of the little-endian concatenation of the block checksums. Lets blocks be hashed in parallel.
uint64_t CombineBlockChecksums(Span<const uint64_t> block_checksums);

/// Computes the block checksums of a whole chunk held in memory, and returns the chunk checksum. `*blocks` (may be
/// null) receives the block checksums of a multi-block chunk and is cleared for a single-block one, which stores none.
uint64_t ChunkChecksum(const void* data, uint64_t length, uint64_t block_size, std::vector<uint64_t>* blocks);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FORMAT_CHECKSUM_H_
