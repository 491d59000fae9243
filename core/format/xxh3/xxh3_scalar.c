/* XXH3-64 without SIMD (xxhash's scalar code), on every CPU: the reference every SIMD build is tested against
 * (xxh3.h).
 * C, not C++: a C++ file would emit weak copies of inline library functions that the linker could pick for the whole
 * program. XXH_INLINE_ALL makes every xxhash function static to this file. */
#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_SCALAR
#include <xxhash.h>

uint64_t distckpt_xxh3_scalar(const void* data, size_t size) { return XXH3_64bits(data, size); }
