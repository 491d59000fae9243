// The XXH3-64 and XXH3-128 builds of this directory (each C file one SIMD level of xxhash's own code, inlined from
// Debian's header), and which of them this CPU runs. checksum.cc hashes with the first of Xxh3Variants(); checksum_test
// checks every one against the scalar build.
#ifndef DISTCKPT_CORE_FORMAT_XXH3_XXH3_H_
#define DISTCKPT_CORE_FORMAT_XXH3_XXH3_H_

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" {
uint64_t distckpt_xxh3_scalar(const void* data, size_t size);
void distckpt_xxh3_128_scalar(const void* data, size_t size, uint64_t out[2]);
#if defined(__x86_64__)
uint64_t distckpt_xxh3_sse2(const void* data, size_t size);
uint64_t distckpt_xxh3_avx2(const void* data, size_t size);
uint64_t distckpt_xxh3_avx512(const void* data, size_t size);
void distckpt_xxh3_128_sse2(const void* data, size_t size, uint64_t out[2]);
void distckpt_xxh3_128_avx2(const void* data, size_t size, uint64_t out[2]);
void distckpt_xxh3_128_avx512(const void* data, size_t size, uint64_t out[2]);
#elif defined(__aarch64__)
uint64_t distckpt_xxh3_neon(const void* data, size_t size);
void distckpt_xxh3_128_neon(const void* data, size_t size, uint64_t out[2]);
#endif
}

namespace distckpt {
namespace internal_xxh3 {

using Xxh3Fn = uint64_t (*)(const void*, size_t);
using Xxh3_128Fn = void (*)(const void*, size_t, uint64_t*);

struct Xxh3Variant {
  const char* name;
  Xxh3Fn fn;
  Xxh3_128Fn fn128;
};

/// The builds this CPU (and OS: AVX state saving) can run, widest first; the scalar build is always last.
inline std::vector<Xxh3Variant> Xxh3Variants() {
  std::vector<Xxh3Variant> v;
#if defined(__x86_64__)
  __builtin_cpu_init();  // the compiler runtime's checks include the OS's XSAVE state for the AVX registers
  if (__builtin_cpu_supports("avx512f")) v.push_back({"avx512", distckpt_xxh3_avx512, distckpt_xxh3_128_avx512});
  if (__builtin_cpu_supports("avx2")) v.push_back({"avx2", distckpt_xxh3_avx2, distckpt_xxh3_128_avx2});
  v.push_back({"sse2", distckpt_xxh3_sse2, distckpt_xxh3_128_sse2});  // x86-64's baseline
#elif defined(__aarch64__)
  v.push_back({"neon", distckpt_xxh3_neon, distckpt_xxh3_128_neon});  // AArch64's baseline
#endif
  v.push_back({"scalar", distckpt_xxh3_scalar, distckpt_xxh3_128_scalar});
  return v;
}

}  // namespace internal_xxh3
}  // namespace distckpt

#endif  // DISTCKPT_CORE_FORMAT_XXH3_XXH3_H_
