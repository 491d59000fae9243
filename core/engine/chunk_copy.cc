#include "core/engine/chunk_copy.h"

#include <algorithm>

#include "core/format/checksum.h"

namespace distckpt {
namespace {

constexpr uint64_t kCopyBytes = 16ull << 20;  // read and written at a time (whole checksum blocks)

Status Mismatch(const ChunkCopyContext& what, const std::string& detail) {
  return Corrupt("checkpoint '" + what.checkpoint + "': entry '" + what.entry + "' chunk #" +
                 std::to_string(what.chunk) + detail + " in data file '" + what.file + "'; the data is corrupt");
}

}  // namespace

uint64_t StoredExtent(const ChunkLocation& from, Span<const StoredBlock> stored) {
  if (stored.empty()) return from.length;
  uint64_t n = 0;
  for (const StoredBlock& b : stored) n += b.size;
  return n;
}

Status CopyChunkVerified(const ReadableFile& in, const ChunkLocation& from, Span<const StoredBlock> stored,
                         uint64_t block_size, WritableFile* out, uint64_t to, std::vector<char>* buf,
                         const ChunkCopyContext& what) {
  if (!stored.empty()) {
    // Compressed: block by block, each checked against its stored checksum (a stored block is at most a block).
    if (buf->size() < block_size) buf->resize(block_size);
    uint64_t at = 0;
    for (size_t b = 0; b < stored.size(); ++b) {
      const uint64_t n = stored[b].size;
      if (n > block_size) return Mismatch(what, " block #" + std::to_string(b) + ": stored block larger than a block");
      DCKPT_RETURN_IF_ERROR(in.ReadAt(from.offset + at, buf->data(), n));
      if (Xxh3(buf->data(), n) != stored[b].checksum) {
        return Mismatch(what, " block #" + std::to_string(b) + ": stored checksum mismatch");
      }
      DCKPT_RETURN_IF_ERROR(out->WriteAt(to + at, buf->data(), n));
      at += n;
    }
    return OkStatus();
  }
  // Raw: every block hashed as it passes, the chunk's checksum checked from them.
  const uint64_t step = std::max(block_size, kCopyBytes / block_size * block_size);
  const uint64_t want = std::min(step, from.length);
  if (buf->size() < want) buf->resize(static_cast<size_t>(want));
  std::vector<uint64_t> blocks;
  if (from.length == 0) blocks.push_back(Xxh3(nullptr, 0));
  for (uint64_t done = 0; done < from.length;) {
    const uint64_t n = std::min(step, from.length - done);
    DCKPT_RETURN_IF_ERROR(in.ReadAt(from.offset + done, buf->data(), n));
    for (uint64_t b = 0; b < n; b += block_size) blocks.push_back(Xxh3(buf->data() + b, std::min(block_size, n - b)));
    DCKPT_RETURN_IF_ERROR(out->WriteAt(to + done, buf->data(), n));
    done += n;
  }
  if (CombineBlockChecksums(Span<const uint64_t>(blocks.data(), blocks.size())) != from.checksum) {
    return Mismatch(what, ": checksum mismatch");
  }
  return OkStatus();
}

}  // namespace distckpt
