/* XXH3-64 built for AArch64's NEON, which every AArch64 CPU has; checksum.cc picks it there (xxh3.h).
 * C, not C++: a C++ file would emit weak copies of inline library functions that the linker could pick for the whole
 * program. XXH_INLINE_ALL makes every xxhash function static to this file. */
#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_NEON
#include <xxhash.h>

uint64_t distckpt_xxh3_neon(const void* data, size_t size) { return XXH3_64bits(data, size); }

/* XXH3-128 of the same build: out[0] the low, out[1] the high 64 bits (the chunk hashes of FORMAT.md 1.2). */
void distckpt_xxh3_128_neon(const void* data, size_t size, uint64_t out[2]) {
  const XXH128_hash_t h = XXH3_128bits(data, size);
  out[0] = h.low64;
  out[1] = h.high64;
}
