#include "core/manager/arrival_check.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "core/format/checksum.h"
#include "core/format/metadata.h"

namespace distckpt {
namespace manager_internal {

ArrivalCheck::ArrivalCheck(std::string what, std::vector<std::string> files, std::vector<uint64_t> sizes)
    : what_(std::move(what)),
      files_(std::move(files)),
      sizes_(std::move(sizes)),
      arrived_(files_.size(), 0),
      blocks_(files_.size()),
      next_(files_.size(), 0) {
  if (files_.empty() || files_[0] != kMetadataFileName) {
    st_ = Internal(what_ + ": the part's metadata does not come first");
  }
}

void ArrivalCheck::Feed(size_t i, uint64_t offset, const char* data, uint64_t n) {
  if (!st_.ok() || n == 0) return;
  if (i >= files_.size() || offset != arrived_[i] || n > sizes_[i] - offset) {
    st_ = Internal(what_ + ": bytes of '" + (i < files_.size() ? files_[i] : "?") + "' arrived out of order");
    return;
  }
  arrived_[i] += n;
  if (i == 0) {
    metadata_.append(data, n);
    if (arrived_[0] == sizes_[0]) Parse();
    return;
  }
  if (!parsed_) {
    st_ = Internal(what_ + ": data arrived before the part's metadata");
    return;
  }
  FeedData(i, offset, data, n);
}

// Every checksum block of every chunk, by data file: what each block's bytes must hash to.
void ArrivalCheck::Parse() {
  auto view = MetadataView::Parse(std::make_shared<const std::string>(metadata_), what_);
  if (!view.ok()) {
    st_ = view.status().WithContext("as received");
    return;
  }
  const uint64_t bs = view.value().checksum_block_size();
  std::vector<size_t> index(view.value().num_files(), files_.size());
  for (size_t k = 0; k < view.value().num_files(); ++k) {
    for (size_t i = 1; i < files_.size(); ++i) {
      if (files_[i] == view.value().file_name(k)) index[k] = i;
    }
    if (index[k] == files_.size() || sizes_[index[k]] != view.value().file_size(k)) {
      st_ = Corrupt(what_ + ": data file '" + std::string(view.value().file_name(k)) +
                    "' of its metadata is not among the files sent, or not of its size");
      return;
    }
  }
  for (size_t e = 0; e < view.value().num_entries(); ++e) {
    const EntryView ev = view.value().entry(e);
    for (size_t c = 0; c < ev.num_chunks; ++c) {
      const ChunkLocation loc = ev.chunk(c);
      auto& list = blocks_[index[loc.file]];
      if (loc.first_block == kNoBlockTable) {
        list.push_back({loc.offset, loc.offset + loc.length, loc.checksum, std::string(ev.name), true});
        continue;
      }
      const uint64_t nb = NumChecksumBlocks(loc.length, bs);
      for (uint64_t b = 0; b < nb; ++b) {
        const uint64_t lo = loc.offset + b * bs;
        list.push_back({lo, std::min(lo + bs, loc.offset + loc.length), ev.block_checksums[loc.first_block + b],
                        std::string(ev.name), false});
      }
    }
  }
  for (auto& list : blocks_) {
    std::sort(list.begin(), list.end(), [](const Block& a, const Block& b) { return a.lo < b.lo; });
  }
  parsed_ = true;
}

void ArrivalCheck::FeedData(size_t i, uint64_t offset, const char* data, uint64_t n) {
  const uint64_t end = offset + n;
  auto& list = blocks_[i];
  size_t& k = next_[i];
  for (; k < list.size() && st_.ok(); ++k) {
    const Block& b = list[k];
    if (b.lo >= end) return;
    if (b.hi > end) {  // the block goes on in the next arrival: keep what is here
      const uint64_t from = std::max(b.lo, offset);
      carry_.append(data + (from - offset), end - from);
      return;
    }
    uint64_t hash;
    if (b.lo >= offset && carry_.empty()) {
      hash = Xxh3(data + (b.lo - offset), b.hi - b.lo);
    } else {
      carry_.append(data + (std::max(b.lo, offset) - offset), b.hi - std::max(b.lo, offset));
      hash = Xxh3(carry_.data(), carry_.size());
      carry_.clear();
    }
    if (hash != b.hash) {
      char hex[64];
      std::snprintf(hex, sizeof hex, "stored %016llx, computed %016llx", static_cast<unsigned long long>(b.hash),
                    static_cast<unsigned long long>(hash));
      st_ = Corrupt(what_ + ": entry '" + b.entry + "': checksum mismatch in '" + files_[i] + "' bytes " +
                    std::to_string(b.lo) + ".." + std::to_string(b.hi) + " as received (" + hex + ")");
    }
  }
}

Status ArrivalCheck::Finish() const {
  if (!st_.ok()) return st_;
  for (size_t i = 0; i < files_.size(); ++i) {
    if (arrived_[i] != sizes_[i]) return Internal(what_ + ": '" + files_[i] + "' did not arrive whole");
  }
  for (size_t i = 1; i < files_.size(); ++i) {
    if (next_[i] != blocks_[i].size()) return Internal(what_ + ": blocks of '" + files_[i] + "' were never checked");
  }
  return OkStatus();
}

}  // namespace manager_internal
}  // namespace distckpt
