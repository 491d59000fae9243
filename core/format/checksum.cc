#include "core/format/checksum.h"

#include <cstddef>
#include <cstring>

#include "core/format/xxh3/xxh3.h"

// XXH3-64 built once per SIMD level (xxh3/: xxhash's own code inlined from Debian's header), the widest build the CPU
// and OS support chosen once at load: on x86-64 ~4x faster than the baseline build of XXH3_64bits in Debian's
// libxxhash on this hardware (bench/NOTES.md). Inlined rather than taken from libxxhash's run-time dispatch, which
// exists only in its shared library: libdistckpt.so and libdistckpt.a carry no xxhash dependency.
namespace distckpt {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "distckpt assumes a little-endian host");

namespace {

using internal_xxh3::Xxh3Fn;

const Xxh3Fn kXxh3 = internal_xxh3::Xxh3Variants().front().fn;
const internal_xxh3::Xxh3_128Fn kXxh3_128 = internal_xxh3::Xxh3Variants().front().fn128;

// Before static initialisation has run (a checksum from another library's constructor) kXxh3 may still be null.
inline uint64_t XXH3_64bits_dispatch(const void* data, size_t size) {
  const Xxh3Fn fn = kXxh3 != nullptr ? kXxh3 : distckpt_xxh3_scalar;
  return fn(data, size);
}

}  // namespace

uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits_dispatch(data, size); }

static_assert(sizeof(ChunkHash) == 16 && offsetof(ChunkHash, hi) == 8, "ChunkHash is two little-endian words");

ChunkHash Xxh3_128(const void* data, size_t size) {
  const internal_xxh3::Xxh3_128Fn fn = kXxh3_128 != nullptr ? kXxh3_128 : distckpt_xxh3_128_scalar;
  uint64_t out[2];
  fn(data, size, out);
  return ChunkHash{out[0], out[1]};
}

ChunkHash CombineBlockHashes(Span<const ChunkHash> block_hashes) {
  if (block_hashes.size() == 1) return block_hashes[0];
  return Xxh3_128(block_hashes.data(), block_hashes.size() * sizeof(ChunkHash));
}

ChunkHash ChunkStrongHash(const void* data, uint64_t length, uint64_t block_size) {
  const uint64_t n = NumChecksumBlocks(length, block_size);
  const auto* p = static_cast<const unsigned char*>(data);
  if (n == 1) return Xxh3_128(p, static_cast<size_t>(length));
  std::vector<ChunkHash> blocks(n);
  for (uint64_t b = 0; b < n; ++b) {
    const uint64_t begin = b * block_size;
    blocks[b] = Xxh3_128(p + begin, static_cast<size_t>((b + 1 == n) ? length - begin : block_size));
  }
  return CombineBlockHashes(Span<const ChunkHash>(blocks.data(), blocks.size()));
}

uint64_t NumChecksumBlocks(uint64_t length, uint64_t block_size) {
  if (block_size == 0 || length == 0) return 1;
  // ceil without overflowing length + block_size - 1.
  return length / block_size + (length % block_size != 0 ? 1 : 0);
}

uint64_t CombineBlockChecksums(Span<const uint64_t> block_checksums) {
  if (block_checksums.size() == 1) return block_checksums[0];
  // The host is little-endian (static_assert above), so the in-memory array is the little-endian concatenation.
  return XXH3_64bits_dispatch(block_checksums.data(), block_checksums.size() * sizeof(uint64_t));
}

uint64_t ChunkChecksum(const void* data, uint64_t length, uint64_t block_size, std::vector<uint64_t>* blocks) {
  const uint64_t n = NumChecksumBlocks(length, block_size);
  const auto* p = static_cast<const unsigned char*>(data);
  if (n == 1) {
    if (blocks != nullptr) blocks->clear();
    return XXH3_64bits_dispatch(p, static_cast<size_t>(length));
  }
  std::vector<uint64_t> local;
  std::vector<uint64_t>& out = blocks != nullptr ? *blocks : local;
  out.resize(n);
  for (uint64_t b = 0; b < n; ++b) {
    const uint64_t begin = b * block_size;
    const uint64_t len = (b + 1 == n) ? length - begin : block_size;
    out[b] = XXH3_64bits_dispatch(p + begin, static_cast<size_t>(len));
  }
  return CombineBlockChecksums(Span<const uint64_t>(out.data(), out.size()));
}

}  // namespace distckpt
