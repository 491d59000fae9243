// Mutation tests. Damage to a metadata file is always detected (the checksum trailer). Behind the checksum, as a
// hostile *writer* would produce it (mutated FlatBuffers bytes with a valid trailer), every buffer is either rejected
// cleanly or gives a view whose every field satisfies the reader invariants, re-derived here independently of the
// validator.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "core/format/metadata.h"
#include "core/format/metadata_test_util.h"

namespace distckpt {
namespace {

// Returns "" when the view satisfies every invariant a reader relies on, else the first violation.
std::string CheckInvariants(const MetadataView& v) {
  const uint64_t bs = v.checksum_block_size(), align = v.alignment();
  if (bs < 4096 || (bs & (bs - 1)) != 0) return "bad checksum block size";
  if (align < kChunkAlignment || (align & (align - 1)) != 0) return "bad alignment";
  std::set<std::string_view> files;
  for (size_t f = 0; f < v.num_files(); ++f) {
    if (!IsValidFileName(v.file_name(f))) return "bad file name";
    if (!files.insert(v.file_name(f)).second) return "duplicate file";
  }
  for (size_t u = 1; u < v.num_user(); ++u) {
    if (!(v.user(u - 1).first < v.user(u).first)) return "user keys unsorted";
  }
  for (size_t i = 0; i < v.num_entries(); ++i) {
    const EntryView e = v.entry(i);
    if (e.name.empty() || (i > 0 && !(v.entry(i - 1).name < e.name))) return "entry names unsorted";
    if (v.Find(e.name) != std::optional<size_t>(i)) return "Find disagrees";
    if (!IsValidDType(static_cast<uint32_t>(e.dtype))) return "bad dtype";
    if (e.kind != EntryKind::kTensor && e.kind != EntryKind::kBytes) return "bad kind";
    if (e.ndim() > kMaxDims) return "too many dims";
    Result<uint64_t> nbytes = CheckedVolume(e.shape, DTypeSize(e.dtype));
    if (!nbytes.ok() || *nbytes != e.nbytes()) return "nbytes";
    if (e.kind == EntryKind::kBytes && (e.num_chunks != 1 || e.ndim() != 1 || e.dtype != DType::kU8)) return "bytes";
    std::vector<Box> boxes;
    uint64_t blocks_used = 0;
    for (size_t c = 0; c < e.num_chunks; ++c) {
      const Box b = e.chunk_box(c);
      for (uint32_t d = 0; d < b.ndim; ++d) {
        if (b.offset[d] > e.shape[d] || b.length[d] > e.shape[d] - b.offset[d]) return "box outside shape";
      }
      const ChunkLocation loc = e.chunk(c);
      if (loc.length != b.volume() * DTypeSize(e.dtype)) return "chunk length";
      if (loc.file >= v.num_files()) return "file index";
      if (loc.offset % align != 0) return "alignment";
      const uint64_t size = v.file_size(loc.file);
      if (loc.offset > size || loc.length > size - loc.offset) return "past end of file";
      const uint64_t nb = loc.length <= bs ? 1 : (loc.length + bs - 1) / bs;
      if (nb == 1) {
        if (loc.first_block != kNoBlockTable) return "stray block table";
      } else {
        if (loc.first_block != blocks_used || nb > e.block_checksums.size() - blocks_used) return "block table";
        blocks_used += nb;
      }
      boxes.push_back(b);
    }
    if (blocks_used != e.block_checksums.size()) return "unused blocks";
    if (!CheckExactTiling(e.shape, boxes).ok()) return "tiling";
  }
  return "";
}

// Applies one random kind of damage to `*buf`.
void Damage(std::string* buf, std::mt19937_64& rng) {
  switch (rng() % 8) {
    case 0:  // truncate
      buf->resize(rng() % buf->size());
      break;
    case 1:  // overwrite a 4-byte word (offsets, lengths) with a small or huge value
      if (buf->size() >= 4) {
        const size_t pos = (rng() % (buf->size() / 4)) * 4;
        const uint32_t val = rng() % 2 ? static_cast<uint32_t>(rng() % 64) : static_cast<uint32_t>(rng());
        std::memcpy(&(*buf)[pos], &val, 4);
      }
      break;
    default: {  // flip 1-4 random bits or bytes
      const int n = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < n; ++k) {
        char& c = (*buf)[rng() % buf->size()];
        c = static_cast<char>(rng() % 2 ? c ^ (1 << (rng() % 8)) : static_cast<char>(rng()));
      }
    }
  }
}

// `fb_bytes`: a FlatBuffers buffer without the trailer. Every mutant gets a valid trailer, as a hostile writer would
// give it, so the damage reaches the verifier and the validator.
void MutateBehindChecksum(const std::string& fb_bytes, uint64_t seed, int iterations) {
  std::mt19937_64 rng(seed);
  int accepted = 0;
  for (int iter = 0; iter < iterations; ++iter) {
    std::string buf = fb_bytes;
    Damage(&buf, rng);
    AppendMetadataTrailer(&buf);
    Result<MetadataView> view = MetadataView::Parse(testing_util::Share(buf), "mut");
    if (!view.ok()) {
      const StatusCode code = view.status().code();
      ASSERT_TRUE(code == StatusCode::kCorrupt || code == StatusCode::kVersion || code == StatusCode::kUnsupported)
          << view.status().ToString();
      ASSERT_FALSE(view.status().message().empty());
      continue;
    }
    ++accepted;
    const std::string violation = CheckInvariants(*view);
    ASSERT_EQ(violation, "") << "iteration " << iter;
    // Whatever the reader accepts, the writer accepts too, and the re-encoded buffer reads back the same.
    Result<std::string> again = EncodeMetadata(view->ToRecord());
    ASSERT_TRUE(again.ok()) << "iteration " << iter << ": " << again.status().ToString();
    Result<MetadataView> reread = MetadataView::Parse(testing_util::Share(*again), "again");
    ASSERT_TRUE(reread.ok());
    ASSERT_EQ(reread->num_entries(), view->num_entries());
    ASSERT_EQ(reread->ToRecord().entries.size(), view->num_entries());
  }
  // Many mutations land in checksums, sizes and text and are legitimately accepted; make sure both paths ran.
  EXPECT_GT(accepted, iterations / 50);
  EXPECT_LT(accepted, iterations);
}

std::string WithoutTrailer(const std::string& file) { return file.substr(0, file.size() - kMetadataTrailerBytes); }

TEST(MetadataMutationTest, EncodedRecord) {
  Result<std::string> valid = EncodeMetadata(testing_util::ValidRecord());
  ASSERT_TRUE(valid.ok());
  MutateBehindChecksum(WithoutTrailer(*valid), 20240601, 20000);
}

TEST(MetadataMutationTest, RawRecordWithUnknownFields) {
  testing_util::RawMetadata m = testing_util::ToRaw(testing_util::ValidRecord());
  m.unknown_fields = true;
  m.format_minor = kFormatMinor + 1;
  m.trailer = false;
  MutateBehindChecksum(testing_util::RawEncode(m), 77, 5000);
}

// Damage to a written file, whatever it is: the file either still holds exactly its original bytes or is refused as
// corrupt. Never a view of other content.
TEST(MetadataMutationTest, DamageToAFileIsAlwaysDetected) {
  Result<std::string> valid = EncodeMetadata(testing_util::ValidRecord());
  ASSERT_TRUE(valid.ok());
  std::mt19937_64 rng(4242);
  int unchanged = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string buf = *valid;
    Damage(&buf, rng);
    Result<MetadataView> view = MetadataView::Parse(testing_util::Share(buf), "mut");
    if (buf == *valid) {
      ++unchanged;  // the damage happened to write the same bytes back
      ASSERT_TRUE(view.ok());
      continue;
    }
    ASSERT_FALSE(view.ok()) << "iteration " << iter << ": damaged metadata accepted";
    ASSERT_EQ(view.status().code(), StatusCode::kCorrupt) << view.status().ToString();
  }
  EXPECT_LT(unchanged, 200);
}

}  // namespace
}  // namespace distckpt
