// The codec of compressed chunks (FORMAT.md "Compressed chunks"): each checksum block on its own, its elements' bytes
// grouped by position (all first bytes, then all second bytes, ...), then one zstd frame. Grouping puts the exponent
// bytes of floats together, which is where the redundancy of weights and optimizer state lies.
#ifndef DISTCKPT_CORE_CODEC_BLOCK_CODEC_H_
#define DISTCKPT_CORE_CODEC_BLOCK_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/base/dtype.h"
#include "core/base/status.h"

namespace distckpt {

/// Compression levels SaveOptions accepts. 0 (kEntropyLevel, the default) codes the grouped bytes with zstd's entropy
/// coder alone (frames of Huffman-coded literals, no match finding): on floats as small as level 1 and about 3x
/// faster to write and 4x faster to read. The others are zstd's levels with match finding (negative: faster, 19 and
/// more: slow), for data with repeats (integer ids, masks, text).
int MinCompressionLevel();
int MaxCompressionLevel();
constexpr int kEntropyLevel = 0;
constexpr int kDefaultCompressionLevel = kEntropyLevel;

/// The width whose bytes are grouped for elements of `dtype_size` bytes: the size when 2, 4 or 8, else 1 (no grouping).
size_t GroupWidth(uint64_t dtype_size);

/// dst[j * n + i] = src[i * width + j] for the n = len / width elements of src (len a multiple of width). width 1
/// copies.
void GroupBytes(const char* src, size_t len, size_t width, char* dst);
/// The inverse: dst[i * width + j] = src[j * n + i].
void UngroupBytes(const char* src, size_t len, size_t width, char* dst);

/// Encodes one block of `len` bytes into `out` (room for len bytes): returns the stored size, which is less than len
/// when the block shrank (out holds the frame), or exactly len when it did not (out is unspecified: the block is to be
/// stored as it is). Thread-safe (a compression context per thread).
Result<size_t> EncodeBlock(const char* src, size_t len, size_t width, int level, char* out);

/// Decodes one stored block of `stored` bytes into `len` bytes at `dst`: a copy when stored == len, else the frame,
/// which must decode to exactly len bytes (an error otherwise, never a write past dst + len). Thread-safe.
Status DecodeBlock(const char* src, size_t stored, size_t width, char* dst, size_t len);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_CODEC_BLOCK_CODEC_H_
