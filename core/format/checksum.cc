#include "core/format/checksum.h"

#include <cstring>

// XXH3-64 built three times (xxh3/xxh3_{sse2,avx2,avx512}.c, xxhash's own code inlined from Debian's header), the
// widest variant the CPU and OS support chosen once at load: ~4x faster than the baseline build of XXH3_64bits in
// Debian's libxxhash on this hardware (bench/NOTES.md). Inlined rather than taken from libxxhash's run-time dispatch,
// which exists only in its shared library: libdistckpt.so and libdistckpt.a carry no xxhash dependency.
extern "C" {
uint64_t distckpt_xxh3_sse2(const void* data, size_t size);
uint64_t distckpt_xxh3_avx2(const void* data, size_t size);
uint64_t distckpt_xxh3_avx512(const void* data, size_t size);
}

namespace distckpt {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "distckpt assumes a little-endian host");

namespace {

using Xxh3Fn = uint64_t (*)(const void*, size_t);

Xxh3Fn PickXxh3() {
  __builtin_cpu_init();  // libgcc's checks include the OS's XSAVE state for the AVX registers
  if (__builtin_cpu_supports("avx512f")) return distckpt_xxh3_avx512;
  if (__builtin_cpu_supports("avx2")) return distckpt_xxh3_avx2;
  return distckpt_xxh3_sse2;
}

const Xxh3Fn kXxh3 = PickXxh3();

// Before static initialisation has run (a checksum from another library's constructor) kXxh3 may still be null.
inline uint64_t XXH3_64bits_dispatch(const void* data, size_t size) {
  const Xxh3Fn fn = kXxh3 != nullptr ? kXxh3 : distckpt_xxh3_sse2;
  return fn(data, size);
}

}  // namespace

uint64_t Xxh3(const void* data, size_t size) { return XXH3_64bits_dispatch(data, size); }

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
