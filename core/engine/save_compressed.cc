#include "core/engine/save_compressed.h"

#include <algorithm>
#include <memory>

#include "core/codec/block_codec.h"

namespace distckpt {
namespace {

// Decoded bytes of the blocks compressed at once, while the previous window is written.
constexpr uint64_t kWindowBytes = 32ull << 20;

uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// One checksum block of one chunk, as it goes through a window.
struct Slot {
  size_t chunk = 0;    // index into `chunks`
  uint64_t block = 0;  // its block number in the chunk
  const char* src = nullptr;
  uint64_t len = 0;     // decoded bytes
  uint64_t stored = 0;  // stored bytes: < len compressed (in the slot's buffer), == len raw (at src)
  uint64_t at = 0;      // file offset
  uint64_t pad = 0;     // zeros after it (the gap to the next chunk)
  const char* bytes() const { return stored == len ? src : buffer; }
  char* buffer = nullptr;
};

}  // namespace

Status WriteZeros(WritableFile* file, uint64_t from, uint64_t to) {
  static const char kZeros[4096] = {};
  while (from < to) {
    const uint64_t n = std::min<uint64_t>(sizeof kZeros, to - from);
    DCKPT_RETURN_IF_ERROR(file->WriteAt(from, kZeros, n));
    from += n;
  }
  return OkStatus();
}

Result<uint64_t> WriteCompressedChunks(WritableFile* file, uint64_t start, const std::vector<CompressedChunk>& chunks,
                                       const CompressedWriteOptions& options, ThreadPool* pool,
                                       const ChunkHashSinks& sinks) {
  const uint64_t block = options.block_size;
  uint64_t blocks = 0;
  for (const CompressedChunk& c : chunks) blocks += NumChecksumBlocks(c.length, block);
  // A small state gets buffers its size, not the window's.
  const size_t per_window =
      static_cast<size_t>(std::min<uint64_t>(blocks, std::max<uint64_t>(1, kWindowBytes / block)));
  // Two sets of buffers: one window is compressed into one while the other's writes are still running.
  std::unique_ptr<char[]> buffers[2];
  for (auto& b : buffers) b.reset(new char[per_window * block]);
  std::vector<Slot> windows[2];
  std::unique_ptr<TaskGroup> writes[2];

  uint64_t at = start;
  size_t chunk = 0, next_block = 0;  // the next block to put into a window
  for (int w = 0; chunk < chunks.size(); w ^= 1) {
    if (writes[w]) {
      DCKPT_RETURN_IF_ERROR(writes[w]->Wait());  // its buffers are free again
      writes[w].reset();
    }
    std::vector<Slot>& slots = windows[w];
    slots.clear();
    while (slots.size() < per_window && chunk < chunks.size()) {
      const CompressedChunk& c = chunks[chunk];
      const uint64_t nblocks = NumChecksumBlocks(c.length, block);
      Slot s;
      s.chunk = chunk;
      s.block = next_block;
      s.src = c.data + next_block * block;
      s.len = std::min(block, c.length - next_block * block);
      s.buffer = buffers[w].get() + slots.size() * block;
      slots.push_back(s);
      if (++next_block == nblocks) ++chunk, next_block = 0;
    }
    // Hash and compress the window's blocks in parallel.
    {
      TaskGroup group(pool);
      for (Slot& s : slots) {
        group.Run([&s, &chunks, &options, &sinks, block]() -> Status {
          const CompressedChunk& c = chunks[s.chunk];
          const uint64_t nblocks = NumChecksumBlocks(c.length, block);
          if (options.chunk_hashes) (*sinks.block_hashes)[c.task][s.block] = Xxh3_128(s.src, s.len);
          const uint64_t h = Xxh3(s.src, s.len);
          if (nblocks > 1) (*sinks.reports)[c.task].blocks[s.block] = h;
          else (*sinks.single)[c.task] = h;
          DCKPT_ASSIGN_OR_RETURN(s.stored, EncodeBlock(s.src, s.len, c.width, options.level, s.buffer));
          (*sinks.reports)[c.task].stored[s.block] = StoredBlock{Xxh3(s.bytes(), s.stored), s.stored};
          return OkStatus();
        });
      }
      DCKPT_RETURN_IF_ERROR(group.Wait());
    }
    // Place them, in order.
    for (size_t k = 0; k < slots.size(); ++k) {
      Slot& s = slots[k];
      const CompressedChunk& c = chunks[s.chunk];
      ChunkChecksums& report = (*sinks.reports)[c.task];
      if (s.block == 0) {
        at = RoundUp(at, options.alignment);
        report.offset = at;
        report.coding.stored_length = 0;
      }
      s.at = at;
      at += s.stored;
      report.coding.stored_length += s.stored;
      const bool last_of_chunk = s.block + 1 == NumChecksumBlocks(c.length, block);
      if (last_of_chunk && s.chunk + 1 < chunks.size()) s.pad = RoundUp(at, options.alignment) - at;
    }
    // Write them while the next window is compressed.
    writes[w] = std::make_unique<TaskGroup>(pool);
    for (const Slot& s : slots) {
      writes[w]->Run([&s, file, &options]() -> Status {
        DCKPT_RETURN_IF_ERROR(file->WriteAt(s.at, s.bytes(), s.stored));
        if (s.pad) DCKPT_RETURN_IF_ERROR(WriteZeros(file, s.at + s.stored, s.at + s.stored + s.pad));
        return options.progress ? options.progress(s.len) : OkStatus();
      });
    }
  }
  for (auto& g : writes) {
    if (g) DCKPT_RETURN_IF_ERROR(g->Wait());
  }
  // A chunk none of whose blocks shrank is a raw chunk: the same bytes, no stored blocks.
  for (const CompressedChunk& c : chunks) {
    ChunkChecksums& report = (*sinks.reports)[c.task];
    if (report.coding.stored_length == c.length) {
      report.coding = ChunkCoding{};
      report.stored.clear();
    } else {
      report.coding.codec = Codec::kZstdGrouped;
    }
  }
  return at;
}

}  // namespace distckpt
