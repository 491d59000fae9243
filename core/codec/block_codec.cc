#include "core/codec/block_codec.h"

// ZSTD_compressSequences (entropy-only frames) is in zstd's static-linking section: the core links one known build.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

// Debian builds zstd with tracing hooks that an application may define (weak references otherwise). Defined here as
// "no tracing", so the core leaves no undefined zstd symbol for a program's own zstd to satisfy with another layout.
extern "C" {
unsigned long long ZSTD_trace_compress_begin(const void*) { return 0; }
void ZSTD_trace_compress_end(unsigned long long, const void*) {}
unsigned long long ZSTD_trace_decompress_begin(const void*) { return 0; }
void ZSTD_trace_decompress_end(unsigned long long, const void*) {}
}

namespace distckpt {
namespace {

// Scratch space of one thread: the grouped bytes of a block, reused block after block.
struct Scratch {
  std::unique_ptr<char[]> bytes;
  size_t size = 0;
  char* Get(size_t n) {
    if (n > size) {
      bytes.reset(new char[n]);
      size = n;
    }
    return bytes.get();
  }
};

struct Contexts {
  ZSTD_CCtx* c = nullptr;
  ZSTD_DCtx* d = nullptr;
  int level = INT32_MIN;  // the level ctx.c is set up for
  Scratch scratch;
  Scratch frame;  // entropy frames are built here
  ~Contexts() {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};

Contexts& Mine() {
  thread_local Contexts contexts;
  return contexts;
}

template <size_t W>
void Group(const char* src, size_t n, char* dst, size_t from = 0) {
  for (size_t i = from; i < n; ++i) {
    for (size_t j = 0; j < W; ++j) dst[j * n + i] = src[i * W + j];
  }
}

template <size_t W>
void Ungroup(const char* src, size_t n, char* dst, size_t from = 0) {
  for (size_t i = from; i < n; ++i) {
    for (size_t j = 0; j < W; ++j) dst[i * W + j] = src[j * n + i];
  }
}

#if defined(__SSE2__)
// 16 elements at a time: the even and odd bytes of 16-bit lanes split with a mask, a shift and a saturating pack (SSE2,
// every x86-64 CPU); 4-byte elements are split twice.
inline void Split16(__m128i a, __m128i b, __m128i* even, __m128i* odd) {
  const __m128i low = _mm_set1_epi16(0x00ff);
  *even = _mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(b, low));
  *odd = _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8));
}

void Group2(const char* src, size_t n, char* dst) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i lo, hi;
    Split16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i + 16)), &lo, &hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), lo);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + n + i), hi);
  }
  Group<2>(src, n, dst, i);
}

void Ungroup2(const char* src, size_t n, char* dst) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + n + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), _mm_unpacklo_epi8(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
  }
  Ungroup<2>(src, n, dst, i);
}

// 4-byte elements, 64 at a time: each plane gets a whole cache line per iteration. (16 bytes per plane per step put
// four store streams a multiple of 4 KiB apart into the same cache sets: 1.1 GB/s instead of ~3.)
void Group4(const char* src, size_t n, char* dst) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i planes[4][4];
    for (int q = 0; q < 4; ++q) {
      const __m128i* in = reinterpret_cast<const __m128i*>(src + 4 * (i + 16 * q));
      __m128i e0, o0, e1, o1;  // bytes 0/2 and 1/3 of elements 0..7, then 8..15
      Split16(_mm_loadu_si128(in), _mm_loadu_si128(in + 1), &e0, &o0);
      Split16(_mm_loadu_si128(in + 2), _mm_loadu_si128(in + 3), &e1, &o1);
      Split16(e0, e1, &planes[0][q], &planes[2][q]);
      Split16(o0, o1, &planes[1][q], &planes[3][q]);
    }
    for (int p = 0; p < 4; ++p) {
      __m128i* out = reinterpret_cast<__m128i*>(dst + p * n + i);
      for (int q = 0; q < 4; ++q) _mm_storeu_si128(out + q, planes[p][q]);
    }
  }
  Group<4>(src, n, dst, i);
}

void Ungroup4(const char* src, size_t n, char* dst) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i planes[4][4];
    for (int p = 0; p < 4; ++p) {
      const __m128i* in = reinterpret_cast<const __m128i*>(src + p * n + i);
      for (int q = 0; q < 4; ++q) planes[p][q] = _mm_loadu_si128(in + q);
    }
    for (int q = 0; q < 4; ++q) {
      const __m128i l01 = _mm_unpacklo_epi8(planes[0][q], planes[1][q]);  // 16-bit halves 0|1
      const __m128i h01 = _mm_unpackhi_epi8(planes[0][q], planes[1][q]);
      const __m128i l23 = _mm_unpacklo_epi8(planes[2][q], planes[3][q]);  // 16-bit halves 2|3
      const __m128i h23 = _mm_unpackhi_epi8(planes[2][q], planes[3][q]);
      __m128i* out = reinterpret_cast<__m128i*>(dst + 4 * (i + 16 * q));
      _mm_storeu_si128(out, _mm_unpacklo_epi16(l01, l23));
      _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(l01, l23));
      _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(h01, h23));
      _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(h01, h23));
    }
  }
  Ungroup<4>(src, n, dst, i);
}
#else
void Group2(const char* src, size_t n, char* dst) { Group<2>(src, n, dst); }
void Ungroup2(const char* src, size_t n, char* dst) { Ungroup<2>(src, n, dst); }
void Group4(const char* src, size_t n, char* dst) { Group<4>(src, n, dst); }
void Ungroup4(const char* src, size_t n, char* dst) { Ungroup<4>(src, n, dst); }
#endif

// Entropy-only frames: the whole input as literals (one sequence per zstd block, no match), each block within one
// byte plane so that each gets its own Huffman table. Returns the frame size, or an error code of zstd's.
size_t EntropyFrame(ZSTD_CCtx* c, const char* in, size_t len, size_t width, char* out, size_t capacity) {
  thread_local std::vector<ZSTD_Sequence> seqs;
  seqs.clear();
  // A Huffman table per plane pays off on large planes; small blocks share one (its header would outweigh the gain).
  constexpr size_t kMinPlaneBytes = 512;
  if (len / width < kMinPlaneBytes) width = 1;
  const size_t plane = len / width;
  for (size_t p = 0; p < width; ++p) {
    const size_t end = p + 1 == width ? len : (p + 1) * plane;
    for (size_t at = p * plane; at < end; at += ZSTD_BLOCKSIZE_MAX) {
      seqs.push_back(ZSTD_Sequence{0, static_cast<unsigned>(std::min<size_t>(ZSTD_BLOCKSIZE_MAX, end - at)), 0, 0});
    }
  }
  return ZSTD_compressSequences(c, out, capacity, seqs.data(), seqs.size(), in, len);
}

}  // namespace

int MinCompressionLevel() { return std::max(ZSTD_minCLevel(), -7); }
int MaxCompressionLevel() { return ZSTD_maxCLevel(); }

size_t GroupWidth(uint64_t dtype_size) {
  return dtype_size == 2 || dtype_size == 4 || dtype_size == 8 ? dtype_size : 1;
}

void GroupBytes(const char* src, size_t len, size_t width, char* dst) {
  const size_t n = len / width;
  switch (width) {
    case 2:
      return Group<2>(src, n, dst);
    case 4:
      return Group<4>(src, n, dst);
    case 8:
      return Group<8>(src, n, dst);
    default:
      std::memcpy(dst, src, len);
  }
}

void UngroupBytes(const char* src, size_t len, size_t width, char* dst) {
  const size_t n = len / width;
  switch (width) {
    case 2:
      return Ungroup<2>(src, n, dst);
    case 4:
      return Ungroup<4>(src, n, dst);
    case 8:
      return Ungroup<8>(src, n, dst);
    default:
      std::memcpy(dst, src, len);
  }
}

Result<size_t> EncodeBlock(const char* src, size_t len, size_t width, int level, char* out) {
  if (level < MinCompressionLevel() || level > MaxCompressionLevel()) {
    return InvalidArgument("zstd compression level " + std::to_string(level) + " is outside [" +
                           std::to_string(MinCompressionLevel()) + ", " + std::to_string(MaxCompressionLevel()) + "]");
  }
  if (len < 2) return len;
  Contexts& ctx = Mine();
  if (ctx.c == nullptr || ctx.level != level) {
    if (ctx.c == nullptr) ctx.c = ZSTD_createCCtx();
    if (ctx.c == nullptr) return Status(StatusCode::kNoMemory, "cannot allocate a zstd compression context");
    ZSTD_CCtx_reset(ctx.c, ZSTD_reset_session_and_parameters);
    // The entropy mode: zstd's level 1 parameters (literal compression on), sequences given, never searched.
    size_t r = ZSTD_CCtx_setParameter(ctx.c, ZSTD_c_compressionLevel, level == kEntropyLevel ? 1 : level);
    if (!ZSTD_isError(r) && level == kEntropyLevel) {
      r = ZSTD_CCtx_setParameter(ctx.c, ZSTD_c_blockDelimiters, ZSTD_sf_explicitBlockDelimiters);
    }
    // The frame need not repeat what the metadata holds: its decoded size is the block's, and checksums cover both
    // the stored and the decoded bytes.
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(ctx.c, ZSTD_c_contentSizeFlag, 0);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(ctx.c, ZSTD_c_checksumFlag, 0);
    if (ZSTD_isError(r)) {
      return InvalidArgument("zstd compression level " + std::to_string(level) + ": " + ZSTD_getErrorName(r));
    }
    ctx.level = level;
  }
  const char* input = src;
  if (width > 1) {
    char* grouped = ctx.scratch.Get(len);
    GroupBytes(src, len, width, grouped);
    input = grouped;
  }
  if (level != kEntropyLevel) {
    // Room for one byte less than the block: a frame that would not be smaller fails with "destination too small".
    const size_t n = ZSTD_compress2(ctx.c, out, len - 1, input, len);
    if (!ZSTD_isError(n)) return n;
    if (ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall) return len;
    return Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  }
  // ZSTD_compressSequences of zstd 1.5.4 can write past a small dstCapacity: it gets the worst case's room (its own
  // buffer), and a frame that is not smaller than the block is not kept.
  char* frame = ctx.frame.Get(ZSTD_compressBound(len));
  const size_t n = EntropyFrame(ctx.c, input, len, width, frame, ZSTD_compressBound(len));
  if (ZSTD_isError(n)) {
    // Storing the block as it is is always right, and zstd's entropy coder declines some inputs of a few bytes.
    if (len < 4096) return len;
    return Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  }
  if (n >= len) return len;
  std::memcpy(out, frame, n);
  return n;
}

Status DecodeBlock(const char* src, size_t stored, size_t width, char* dst, size_t len) {
  if (stored == len) {
    std::memcpy(dst, src, len);
    return OkStatus();
  }
  if (stored > len) return Corrupt("a stored block is larger than the block it decodes to");
  Contexts& ctx = Mine();
  if (ctx.d == nullptr) ctx.d = ZSTD_createDCtx();
  if (ctx.d == nullptr) return Status(StatusCode::kNoMemory, "cannot allocate a zstd decompression context");
  char* out = width > 1 ? ctx.scratch.Get(len) : dst;
  const size_t n = ZSTD_decompressDCtx(ctx.d, out, len, src, stored);
  if (ZSTD_isError(n)) return Corrupt(std::string("zstd frame does not decode: ") + ZSTD_getErrorName(n));
  if (n != len) {
    return Corrupt("zstd frame decodes to " + std::to_string(n) + " bytes instead of " + std::to_string(len));
  }
  if (width > 1) UngroupBytes(out, len, width, dst);
  return OkStatus();
}

}  // namespace distckpt
