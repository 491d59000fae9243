#include "core/codec/block_codec.h"

#include <zstd.h>
#include <zstd_errors.h>

#include <cstdlib>
#include <cstring>
#include <memory>

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
  int level = 0;
  Scratch scratch;
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
void Group(const char* src, size_t n, char* dst) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < W; ++j) dst[j * n + i] = src[i * W + j];
  }
}

template <size_t W>
void Ungroup(const char* src, size_t n, char* dst) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < W; ++j) dst[i * W + j] = src[j * n + i];
  }
}

}  // namespace

int MinCompressionLevel() { return ZSTD_minCLevel(); }
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
  if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()) {
    return InvalidArgument("zstd compression level " + std::to_string(level) + " is outside [" +
                           std::to_string(ZSTD_minCLevel()) + ", " + std::to_string(ZSTD_maxCLevel()) + "]");
  }
  if (len < 2) return len;
  Contexts& ctx = Mine();
  if (ctx.c == nullptr || ctx.level != level) {
    if (ctx.c == nullptr) ctx.c = ZSTD_createCCtx();
    if (ctx.c == nullptr) return Status(StatusCode::kNoMemory, "cannot allocate a zstd compression context");
    ZSTD_CCtx_reset(ctx.c, ZSTD_reset_session_and_parameters);
    size_t r = ZSTD_CCtx_setParameter(ctx.c, ZSTD_c_compressionLevel, level);
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
  // Room for one byte less than the block: a frame that would not be smaller fails with "destination too small".
  const size_t n = ZSTD_compress2(ctx.c, out, len - 1, input, len);
  if (ZSTD_isError(n)) {
    if (ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall) return len;
    return Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  }
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
