#include "core/engine/incremental.h"

#include <algorithm>
#include <utility>

namespace distckpt {

Result<std::unique_ptr<IncrementalBase>> IncrementalBase::Open(Storage* storage, const std::string& path,
                                                               const std::string& base, uint32_t full_every) {
  DCKPT_ASSIGN_OR_RETURN(std::string name, SiblingName(path, base));
  DCKPT_ASSIGN_OR_RETURN(BaseCheckpoint opened, OpenBaseCheckpoint(storage, SiblingPath(path, name)));
  // chain_length + 1 saves since the last self-contained one, this one included.
  const bool active = full_every == 0 || opened.meta.chain_length() + 1 < full_every;
  return std::unique_ptr<IncrementalBase>(new IncrementalBase(path, std::move(name), std::move(opened), active));
}

uint32_t IncrementalBase::BaseIndex(const std::string& name, uint64_t checksum, uint64_t size) {
  auto [it, added] = base_index_.emplace(name, 0);
  if (added) {
    bases_.push_back(BaseRecord{name, checksum, size});
    it->second = static_cast<uint32_t>(bases_.size());
  }
  return it->second;
}

ReuseFn IncrementalBase::Reuse(uint64_t checksum_block_size, uint64_t alignment) {
  if (!active_ || base_.meta.checksum_block_size() != checksum_block_size) return nullptr;
  const std::string own = BaseName(path_);
  return [this, alignment, own](const EntryRecord& rec, uint32_t chunk, const ChunkFingerprint& fp, ReusedChunk* out) {
    if (!fp.known) return false;
    const MetadataView& meta = base_.meta;
    const std::optional<size_t> found = meta.Find(rec.name);
    if (!found) return false;
    const EntryView e = meta.entry(*found);
    if (e.kind != rec.kind || e.dtype != rec.dtype || e.chunk_hashes.empty() ||
        !std::equal(e.shape.begin(), e.shape.end(), rec.shape.begin(), rec.shape.end())) {
      return false;
    }
    if (indexed_entry_ != *found) {
      boxes_.clear();
      const size_t ndim = e.ndim();
      for (uint32_t k = 0; k < e.num_chunks; ++k) {
        std::vector<uint64_t> key(e.chunk_offsets + k * ndim, e.chunk_offsets + (k + 1) * ndim);
        key.insert(key.end(), e.chunk_lengths + k * ndim, e.chunk_lengths + (k + 1) * ndim);
        boxes_.emplace(std::move(key), k);
      }
      indexed_entry_ = *found;
    }
    const size_t ndim = rec.shape.size();
    std::vector<uint64_t> key(rec.chunk_offsets.begin() + chunk * ndim, rec.chunk_offsets.begin() + (chunk + 1) * ndim);
    key.insert(key.end(), rec.chunk_lengths.begin() + chunk * ndim, rec.chunk_lengths.begin() + (chunk + 1) * ndim);
    const auto it = boxes_.find(key);
    if (it == boxes_.end()) return false;
    const uint32_t k = it->second;
    const ChunkLocation loc = e.chunk(k);
    if (loc.length != rec.chunks[chunk].length || e.chunk_hashes[k] != fp.hash || loc.offset % alignment != 0) {
      return false;
    }
    // Where the bytes lie: a file of the base itself, or of one of the base's own bases (referred to directly).
    const uint32_t in = meta.file_base(loc.file);
    std::string holder = name_;
    uint64_t checksum = *meta.checksum(), size = meta.buffer_size();
    if (in != 0) {
      holder = std::string(meta.base_name(in - 1));
      checksum = meta.base_metadata_checksum(in - 1);
      size = meta.base_metadata_size(in - 1);
    }
    if (holder == own) return false;  // the checkpoint being saved (overwritten) cannot hold its own chunks
    out->base = BaseIndex(holder, checksum, size);
    out->file = std::string(meta.file_name(loc.file));
    out->file_size = meta.file_size(loc.file);
    out->offset = loc.offset;
    out->checksum = loc.checksum;
    out->blocks.clear();
    if (loc.first_block != kNoBlockTable) {
      const uint64_t nb = NumChecksumBlocks(loc.length, meta.checksum_block_size());
      out->blocks.assign(e.block_checksums.begin() + loc.first_block, e.block_checksums.begin() + loc.first_block + nb);
    }
    out->hash = fp.hash;
    out->coding = e.coding(k);
    const Span<const StoredBlock> stored = e.stored(k);
    out->stored.assign(stored.begin(), stored.end());
    bytes_reused_ += loc.length;
    return true;
  };
}

void IncrementalBase::Finish(MetadataRecord* metadata) const {
  metadata->bases = bases_;
  metadata->chain_length = bases_.empty() ? 0 : base_.meta.chain_length() + 1;
}

Status IncrementalBase::CheckUnchanged(Storage* storage) const {
  for (const BaseRecord& b : bases_) {
    const std::string where = SiblingPath(path_, b.name);
    auto again = OpenBaseCheckpoint(storage, where);
    if (!again.ok() || *again->meta.checksum() != b.metadata_checksum || again->meta.buffer_size() != b.metadata_size) {
      return Status(StatusCode::kState, "base checkpoint '" + where + "' was replaced or removed during the save " +
                                            "that refers to it" + (again.ok() ? "" : ": " + again.status().message()) +
                                            "; save again");
    }
  }
  return OkStatus();
}

}  // namespace distckpt
