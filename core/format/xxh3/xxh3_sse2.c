/* XXH3-64 built for one x86-64 SIMD level (SSE2); checksum.cc picks the widest one the CPU and OS support (xxh3.h).
 * C, not C++: this file is compiled with its own -m flags, and a C++ file would emit weak copies of inline library
 * functions built for SSE2 that the linker could pick for the whole program. XXH_INLINE_ALL makes every xxhash
 * function static to this file. */
#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_SSE2
#include <xxhash.h>

uint64_t distckpt_xxh3_sse2(const void* data, size_t size) { return XXH3_64bits(data, size); }
