/* XXH3-64 built for AArch64's NEON, which every AArch64 CPU has; checksum.cc picks it there (xxh3.h).
 * C, not C++: a C++ file would emit weak copies of inline library functions that the linker could pick for the whole
 * program. XXH_INLINE_ALL makes every xxhash function static to this file. */
#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_NEON
#include <xxhash.h>

uint64_t distckpt_xxh3_neon(const void* data, size_t size) { return XXH3_64bits(data, size); }
