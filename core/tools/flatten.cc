#include "core/tools/flatten.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "core/engine/base_checkpoint.h"
#include "core/engine/chunk_copy.h"
#include "core/engine/reader.h"
#include "core/format/checksum.h"
#include "core/format/metadata.h"
#include "core/plan/save_planner.h"

namespace distckpt {

namespace {

// One chunk to copy: where it is in the source, where it goes.
struct Move {
  size_t entry;
  size_t chunk;
  ChunkLocation from;
  uint64_t extent = 0;              // bytes it takes in the file: its length, or its stored length
  std::vector<StoredBlock> stored;  // a compressed chunk's blocks (copied as stored, checked against these)
  uint64_t to_offset = 0;
};

}  // namespace

Result<FlattenSummary> FlattenCheckpoint(const std::string& src, const std::string& dst, bool overwrite,
                                         Storage* storage) {
  if (storage == nullptr) storage = DefaultStorage();
  const std::string where = "flattening '" + src + "' into '" + dst + "'";
  ReadOptions ro;
  ro.storage = storage;
  ro.map_files = false;
  auto opened = Reader::Open(src, nullptr, ro);
  if (!opened.ok()) return opened.status().WithContext(where);
  Reader& reader = **opened;
  const MetadataView& meta = reader.metadata();
  if (!meta.checksummed()) {
    return InvalidArgument(where + ": it is a foreign checkpoint (" + std::string(meta.source()) +
                           "), which is self-contained already");
  }
  MetadataRecord record = meta.ToRecord();
  const uint64_t block = record.checksum_block_size;
  const uint64_t align = record.alignment;

  // One new data file per source file that holds a chunk, chunks in their source order, each on an aligned offset.
  std::vector<std::vector<Move>> per_file(meta.num_files());
  for (size_t e = 0; e < record.entries.size(); ++e) {
    for (size_t c = 0; c < record.entries[e].chunks.size(); ++c) {
      const EntryRecord& rec = record.entries[e];
      const ChunkLocation& loc = rec.chunks[c];
      Move m{e, c, loc, loc.length, {}, 0};
      if (!rec.codings.empty() && !rec.codings[c].raw()) {
        m.extent = rec.codings[c].stored_length;
        const uint64_t nb = NumChecksumBlocks(loc.length, block);
        m.stored.assign(rec.stored_blocks.begin() + rec.codings[c].first_stored,
                        rec.stored_blocks.begin() + rec.codings[c].first_stored + nb);
      }
      per_file[loc.file].push_back(std::move(m));
    }
  }
  std::vector<DataFileRecord> files;
  std::vector<uint32_t> new_index(meta.num_files(), UINT32_MAX);
  for (uint32_t f = 0; f < meta.num_files(); ++f) {
    std::vector<Move>& moves = per_file[f];
    if (moves.empty()) continue;
    std::sort(moves.begin(), moves.end(), [](const Move& a, const Move& b) { return a.from.offset < b.from.offset; });
    uint64_t cursor = 0;
    for (Move& m : moves) {
      m.to_offset = m.extent == 0 ? cursor / align * align : (cursor + align - 1) / align * align;
      cursor = std::max(cursor, m.to_offset + m.extent);
    }
    new_index[f] = static_cast<uint32_t>(files.size());
    files.push_back(DataFileRecord{DataFileName(new_index[f]), cursor, 0});
  }

  const std::string nonce = NewNonce();
  if (overwrite) {
    auto st = CheckNoDependents(storage, dst, "overwriting");
    if (!st.ok()) return st.WithContext(where);
  }
  auto staged = StagedCheckpoint::Create(storage, dst, nonce, overwrite);
  if (!staged.ok()) return staged.status().WithContext(where);
  FlattenSummary summary;
  auto copy_all = [&]() -> Status {
    std::vector<char> buf;
    for (uint32_t f = 0; f < meta.num_files(); ++f) {
      if (per_file[f].empty()) continue;
      DCKPT_ASSIGN_OR_RETURN(const ReadableFile* in, reader.File(f));
      DataFileRecord& out_rec = files[new_index[f]];
      out_rec.name = staged->FileName(out_rec.name);
      DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, storage->CreateFile(staged->StagingFile(out_rec.name)));
      DCKPT_RETURN_IF_ERROR(out->Preallocate(out_rec.size));
      for (const Move& m : per_file[f]) {
        // Nothing unverified is copied: a raw chunk's checksum, a compressed chunk's stored blocks are checked.
        const ChunkCopyContext what{src, record.entries[m.entry].name, m.chunk, reader.FilePath(f)};
        Status copied = CopyChunkVerified(*in, m.from, Span<const StoredBlock>(m.stored.data(), m.stored.size()), block,
                                          out.get(), m.to_offset, &buf, what);
        if (!copied.ok()) {
          return copied.code() == StatusCode::kCorrupt ? Corrupt(copied.message() + " (no copy was made)") : copied;
        }
        summary.bytes_copied += m.extent;
        if (meta.file_base(f) != 0) summary.bytes_from_bases += m.extent;
      }
      DCKPT_RETURN_IF_ERROR(out->Truncate(out_rec.size));
      DCKPT_RETURN_IF_ERROR(out->Sync());
      DCKPT_RETURN_IF_ERROR(out->Close());
    }
    for (uint32_t f = 0; f < meta.num_files(); ++f) {
      for (const Move& m : per_file[f]) {
        ChunkLocation& loc = record.entries[m.entry].chunks[m.chunk];
        loc.file = new_index[f];
        loc.offset = m.to_offset;
      }
    }
    record.files = files;
    record.bases.clear();
    record.chain_length = 0;
    DCKPT_ASSIGN_OR_RETURN(std::string encoded, EncodeMetadata(record));
    return staged->CommitWithMetadata(encoded);
  };
  Status st = copy_all();
  if (!st.ok()) {
    (void)staged->Abort();
    return st.WithContext(where);
  }
  summary.num_files = static_cast<uint32_t>(files.size());
  return summary;
}

}  // namespace distckpt
