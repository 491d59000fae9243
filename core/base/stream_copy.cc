#include "core/base/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#define DISTCKPT_HAVE_SSE2_STREAM 1
#endif

namespace distckpt {

// Below this the fence and the alignment head cost more than the stores save.
constexpr size_t kStreamMinBytes = 64 << 10;

void StreamCopy(void* dst, const void* src, size_t n) {
#ifdef DISTCKPT_HAVE_SSE2_STREAM
  if (n < kStreamMinBytes) {
    std::memcpy(dst, src, n);
    return;
  }
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;  // align the stores to a cache line
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, n);
  _mm_sfence();  // non-temporal stores are weakly ordered: publish them before the caller signals completion
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace distckpt
