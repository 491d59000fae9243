#include "core/manager/persist.h"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "core/base/dtype.h"
#include "core/base/wire.h"
#include "core/engine/chunk_copy.h"
#include "core/engine/save_compressed.h"
#include "core/format/checksum.h"

namespace distckpt {
namespace {

// Raw bytes read from the part and compressed at a time (a larger chunk goes alone).
constexpr uint64_t kBatchBytes = 64ull << 20;

uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// (entry, chunk) of each flat chunk index of a part record.
std::vector<std::pair<uint32_t, uint32_t>> FlatChunks(const MetadataRecord& rec) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (uint32_t e = 0; e < rec.entries.size(); ++e) {
    for (uint32_t c = 0; c < rec.entries[e].chunks.size(); ++c) out.emplace_back(e, c);
  }
  return out;
}

// Chunk `c` of `e` is stored as `coding`, with `stored` blocks when compressed.
void SetCoding(EntryRecord* e, size_t c, ChunkCoding coding, const std::vector<StoredBlock>& stored) {
  if (coding.raw()) {
    if (e->codings.empty()) return;
    coding = ChunkCoding{};
    coding.stored_length = e->chunks[c].length;
  } else {
    if (e->codings.empty()) {
      e->codings.resize(e->chunks.size());
      for (size_t j = 0; j < e->chunks.size(); ++j) e->codings[j].stored_length = e->chunks[j].length;
    }
    coding.first_stored = static_cast<uint32_t>(e->stored_blocks.size());
    e->stored_blocks.insert(e->stored_blocks.end(), stored.begin(), stored.end());
  }
  e->codings[c] = coding;
}

// An entry of a part as the merged checkpoint has it: a piece entry "T#k" becomes tensor T with its global shape and
// its chunks' boxes moved to the piece's place (what a base of the merged checkpoint is compared with).
EntryRecord GlobalEntry(const EntryRecord& e, const Part::Piece* piece) {
  EntryRecord g;
  g.name = piece ? piece->tensor : e.name;
  g.kind = e.kind;
  g.dtype = e.dtype;
  g.shape = piece ? piece->shape : e.shape;
  g.chunk_offsets = e.chunk_offsets;
  g.chunk_lengths = e.chunk_lengths;
  g.chunks = e.chunks;
  if (piece != nullptr) {
    const size_t nd = piece->offsets.size();
    for (size_t i = 0; i < g.chunk_offsets.size(); ++i) g.chunk_offsets[i] += piece->offsets[i % nd];
  }
  return g;
}

enum class Role : uint8_t { kSkip, kWrite, kReuse };

}  // namespace

Result<PersistPlan> PlanPersist(std::vector<Part>* parts, const ReuseFn& reuse) {
  const size_t ranks = parts->size();
  PersistPlan plan;
  plan.writes.resize(ranks);
  // Every holder of every box (tensor and global box, or bytes entry).
  struct Holder {
    uint32_t rank;
    uint32_t flat;
  };
  struct Box {
    uint64_t length = 0;
    std::vector<Holder> holders;
  };
  std::map<std::pair<std::string, std::vector<uint64_t>>, Box> boxes;
  std::vector<std::vector<Role>> role(ranks);
  std::vector<std::vector<const Part::Piece*>> pieces(ranks);  // per rank, per entry: its piece (null: bytes)
  for (uint32_t r = 0; r < ranks; ++r) {
    const Part& part = (*parts)[r];
    std::map<std::string, const Part::Piece*> placed;
    for (const Part::Piece& p : part.pieces) placed[p.entry] = &p;
    uint32_t flat = 0;
    for (const EntryRecord& e : part.record.entries) {
      const Part::Piece* piece = nullptr;
      if (e.kind == EntryKind::kTensor) piece = placed.at(e.name);  // ParsePart placed every tensor entry
      pieces[r].push_back(piece);
      const EntryRecord g = GlobalEntry(e, piece);
      const size_t nd = g.shape.size();
      for (size_t c = 0; c < e.chunks.size(); ++c, ++flat) {
        std::vector<uint64_t> key;
        if (e.kind == EntryKind::kTensor) {
          key.assign(g.chunk_offsets.begin() + c * nd, g.chunk_offsets.begin() + (c + 1) * nd);
          key.insert(key.end(), g.chunk_lengths.begin() + c * nd, g.chunk_lengths.begin() + (c + 1) * nd);
        }
        Box& box = boxes[{std::string(1, static_cast<char>(e.kind)) + g.name, std::move(key)}];
        box.length = e.chunks[c].length;
        box.holders.push_back(Holder{r, flat});
      }
    }
    role[r].assign(flat, Role::kSkip);
  }
  // The biggest boxes first, each to the holder with the fewest bytes so far (the lowest rank on a tie).
  std::vector<const Box*> order;
  for (const auto& kv : boxes) order.push_back(&kv.second);
  std::stable_sort(order.begin(), order.end(), [](const Box* a, const Box* b) { return a->length > b->length; });
  std::vector<uint64_t> load(ranks, 0);
  for (const Box* box : order) {
    const Holder* best = &box->holders.front();
    for (const Holder& h : box->holders) {
      if (load[h.rank] < load[best->rank]) best = &h;
    }
    load[best->rank] += box->length;
    role[best->rank][best->flat] = Role::kWrite;
  }
  // Chunks the base holds are referred to; the rest are written. Then each part is patched.
  for (uint32_t r = 0; r < ranks; ++r) {
    Part& part = (*parts)[r];
    MetadataRecord& rec = part.record;
    std::map<uint32_t, ReusedChunk> reused;
    uint32_t flat = 0;
    for (size_t e = 0; e < rec.entries.size(); ++e) {
      const EntryRecord& entry = rec.entries[e];
      std::optional<EntryRecord> global;
      for (uint32_t c = 0; c < entry.chunks.size(); ++c, ++flat) {
        if (role[r][flat] != Role::kWrite) continue;
        const ChunkLocation& loc = entry.chunks[c];
        ReusedChunk found;
        if (reuse && loc.length > 0 && c < entry.chunk_hashes.size()) {
          if (!global) global = GlobalEntry(entry, pieces[r][e]);
          ChunkFingerprint fp;
          fp.known = true;
          fp.checksum = loc.checksum;
          fp.hash = entry.chunk_hashes[c];
          if (reuse(*global, c, fp, &found) && found.checksum == loc.checksum && found.base != 0) {
            role[r][flat] = Role::kReuse;
            plan.bytes_reused += loc.length;
            reused.emplace(flat, std::move(found));
            continue;
          }
        }
        plan.writes[r].push_back(flat);
        plan.bytes_to_write += loc.length;
      }
    }
    std::vector<DataFileRecord> files;
    if (!plan.writes[r].empty()) files.push_back(DataFileRecord{DataFileName(0), 0, 0});
    std::map<std::pair<uint32_t, std::string>, uint32_t> base_file;
    flat = 0;
    for (EntryRecord& entry : rec.entries) {
      for (size_t c = 0; c < entry.chunks.size(); ++c, ++flat) {
        ChunkLocation& loc = entry.chunks[c];
        switch (role[r][flat]) {
          case Role::kSkip:
            loc.file = kChunkNotWritten;
            break;
          case Role::kWrite:
            loc.file = 0;  // ApplyWrites sets its offset and coding
            break;
          case Role::kReuse: {
            const ReusedChunk& found = reused.at(flat);
            auto [it, added] = base_file.emplace(std::make_pair(found.base, found.file), files.size());
            if (added) files.push_back(DataFileRecord{found.file, found.file_size, found.base});
            loc.file = it->second;
            loc.offset = found.offset;
            SetCoding(&entry, c, found.coding, found.stored);
            break;
          }
        }
      }
    }
    rec.files = std::move(files);
  }
  return plan;
}

std::string EncodePlan(const PersistPlan& plan) {
  WireWriter w;
  w.Var(plan.writes.size());
  for (const std::vector<uint32_t>& writes : plan.writes) {
    w.Var(writes.size());
    uint32_t prev = 0;
    for (uint32_t f : writes) {
      w.Var(f - prev);  // ascending: the gaps
      prev = f;
    }
  }
  return w.Take();
}

Result<PersistPlan> DecodePlan(const std::string& encoded, uint32_t ranks) {
  const Status bad = Internal("persist: malformed plan from rank 0");
  WireReader r(encoded);
  uint64_t n = 0;
  if (!r.Var(&n) || n != ranks) return bad;
  PersistPlan plan;
  plan.writes.resize(ranks);
  for (std::vector<uint32_t>& writes : plan.writes) {
    uint64_t count = 0;
    if (!r.Count(&count)) return bad;
    uint64_t at = 0;
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t gap = 0;
      if (!r.Var(&gap) || gap > UINT32_MAX - at || (i > 0 && gap == 0)) return bad;
      at += gap;
      writes.push_back(static_cast<uint32_t>(at));
    }
  }
  if (!r.done()) return bad;
  return plan;
}

Result<std::vector<ChunkChecksums>> WritePersistedChunks(Storage* local, const std::string& part_dir, const Part& part,
                                                         const std::vector<uint32_t>& writes, WritableFile* out,
                                                         const PersistWriteOptions& options, uint64_t* stored_bytes) {
  const MetadataRecord& rec = part.record;
  const auto flats = FlatChunks(rec);
  const uint64_t block = rec.checksum_block_size, align = rec.alignment;
  std::vector<std::unique_ptr<ReadableFile>> files(rec.files.size());
  auto open = [&](uint32_t f) -> Result<const ReadableFile*> {
    if (f >= files.size() || rec.files[f].base != 0) return Internal("persist: a part chunk names no file of its own");
    if (!files[f]) {
      DCKPT_ASSIGN_OR_RETURN(files[f], local->OpenFile(part_dir + "/" + rec.files[f].name));
    }
    return files[f].get();
  };
  auto what = [&](uint32_t flat) {
    const auto [e, c] = flats[flat];
    return ChunkCopyContext{part_dir, rec.entries[e].name, c,
                            part_dir + "/" + rec.files[rec.entries[e].chunks[c].file].name};
  };
  // Where each written chunk went (its checksums stay the part's).
  std::vector<ChunkChecksums> placed(writes.size());
  uint64_t cursor = 0;
  std::vector<char> buf;
  // Raw chunks waiting to be compressed together: index into `writes`, and their bytes in `batch`.
  std::vector<size_t> pending;
  std::vector<char> batch;
  uint64_t batch_bytes = 0;
  auto flush = [&]() -> Status {
    if (pending.empty()) return OkStatus();
    const uint64_t start = RoundUp(cursor, align);
    DCKPT_RETURN_IF_ERROR(WriteZeros(out, cursor, start));
    std::vector<CompressedChunk> chunks;
    std::vector<ChunkChecksums> reports(pending.size());
    std::vector<uint64_t> single(pending.size());
    std::vector<std::vector<ChunkHash>> hashes(pending.size());
    uint64_t at = 0;
    for (size_t i = 0; i < pending.size(); ++i) {
      const auto [e, c] = flats[writes[pending[i]]];
      const EntryRecord& entry = rec.entries[e];
      const uint64_t length = entry.chunks[c].length;
      const uint64_t nb = NumChecksumBlocks(length, block);
      reports[i].blocks.assign(nb > 1 ? nb : 0, 0);
      reports[i].stored.assign(nb, StoredBlock{});
      const size_t width = entry.kind == EntryKind::kTensor ? DTypeSize(entry.dtype) : 1;
      chunks.push_back(CompressedChunk{i, batch.data() + at, length, width});
      at += length;
    }
    CompressedWriteOptions copts;
    copts.block_size = block;
    copts.alignment = align;
    copts.level = options.compression_level;
    copts.chunk_hashes = false;  // the part's hashes describe the same bytes (their checksums are checked below)
    DCKPT_ASSIGN_OR_RETURN(cursor, WriteCompressedChunks(out, start, chunks, copts, options.pool,
                                                         ChunkHashSinks{&reports, &single, &hashes}));
    for (size_t i = 0; i < pending.size(); ++i) {
      const auto [e, c] = flats[writes[pending[i]]];
      const ChunkLocation& loc = rec.entries[e].chunks[c];
      const ChunkChecksums& rep = reports[i];
      const uint64_t sum = rep.blocks.empty() ? single[i] : CombineBlockChecksums(rep.blocks);
      if (sum != loc.checksum) {
        const ChunkCopyContext w = what(writes[pending[i]]);
        return Corrupt("checkpoint '" + w.checkpoint + "': entry '" + w.entry + "' chunk #" + std::to_string(w.chunk) +
                       ": checksum mismatch in data file '" + w.file + "'; the data is corrupt");
      }
      ChunkChecksums& p = placed[pending[i]];
      p.offset = rep.offset;
      p.coding = rep.coding;
      if (!rep.coding.raw()) p.stored = rep.stored;
      *stored_bytes += rep.coding.raw() ? loc.length : rep.coding.stored_length;
    }
    pending.clear();
    batch_bytes = 0;
    return OkStatus();
  };
  for (size_t i = 0; i < writes.size(); ++i) {
    if (writes[i] >= flats.size()) return Internal("persist: the plan names a chunk the part does not have");
    const auto [e, c] = flats[writes[i]];
    const EntryRecord& entry = rec.entries[e];
    const ChunkLocation& loc = entry.chunks[c];
    const bool coded = c < entry.codings.size() && !entry.codings[c].raw();
    if (loc.length == 0) {
      placed[i].offset = cursor / align * align;  // takes no space
      continue;
    }
    DCKPT_ASSIGN_OR_RETURN(const ReadableFile* in, open(loc.file));
    if (options.compression != Codec::kRaw && !coded) {
      if (batch_bytes > 0 && batch_bytes + loc.length > kBatchBytes) DCKPT_RETURN_IF_ERROR(flush());
      batch.resize(static_cast<size_t>(std::max<uint64_t>(batch.size(), batch_bytes + loc.length)));
      DCKPT_RETURN_IF_ERROR(in->ReadAt(loc.offset, batch.data() + batch_bytes, loc.length));
      batch_bytes += loc.length;
      pending.push_back(i);
      continue;
    }
    DCKPT_RETURN_IF_ERROR(flush());
    Span<const StoredBlock> stored;
    if (coded) {
      const ChunkCoding& coding = entry.codings[c];
      const uint64_t nb = NumChecksumBlocks(loc.length, block);
      stored = Span<const StoredBlock>(entry.stored_blocks.data() + coding.first_stored, nb);
      placed[i].coding = coding;
      placed[i].stored.assign(stored.begin(), stored.end());
    }
    const uint64_t to = RoundUp(cursor, align);
    DCKPT_RETURN_IF_ERROR(WriteZeros(out, cursor, to));
    DCKPT_RETURN_IF_ERROR(CopyChunkVerified(*in, loc, stored, block, out, to, &buf, what(writes[i])));
    placed[i].offset = to;
    cursor = to + StoredExtent(loc, stored);
    *stored_bytes += StoredExtent(loc, stored);
  }
  DCKPT_RETURN_IF_ERROR(flush());
  for (size_t i = 0; i < writes.size(); ++i) {
    std::tie(placed[i].entry, placed[i].chunk) = flats[writes[i]];
    placed[i].has_hash = false;
    placed[i].placed = true;
    placed[i].file_size = cursor;
  }
  return placed;
}

Status ApplyWrites(const std::vector<ChunkChecksums>& reports, const std::vector<uint32_t>& writes, Part* part,
                   const std::string& context) {
  MetadataRecord& rec = part->record;
  const auto flats = FlatChunks(rec);
  const Status bad = Internal(context + ": the report of what rank " + std::to_string(part->info.rank) +
                              " wrote does not match its plan");
  if (reports.size() != writes.size() || rec.files.empty() || rec.files[0].base != 0) return bad;
  for (size_t i = 0; i < writes.size(); ++i) {
    const ChunkChecksums& r = reports[i];
    if (writes[i] >= flats.size() || flats[writes[i]] != std::make_pair(r.entry, r.chunk) || !r.placed) return bad;
    rec.files[0].size = r.file_size;
    EntryRecord& entry = rec.entries[r.entry];
    entry.chunks[r.chunk].offset = r.offset;
    SetCoding(&entry, r.chunk, r.coding, r.stored);
  }
  return OkStatus();
}

}  // namespace distckpt
