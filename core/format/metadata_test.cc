#include "core/format/metadata.h"

#include <gtest/gtest.h>

#include <cstring>

#include <algorithm>
#include <functional>
#include <random>

#include "core/format/checksum.h"
#include "core/format/metadata_test_util.h"
#include "core/format/schema_generated.h"
#include "flatbuffers/flatbuffers.h"

namespace distckpt {
namespace {

using testing_util::RawEncode;
using testing_util::RawEntry;
using testing_util::RawMetadata;
using testing_util::Share;
using testing_util::ToRaw;
using testing_util::ValidRecord;

Result<MetadataView> ParseString(std::string s, const std::string& context = "/ckpt/step10") {
  return MetadataView::Parse(Share(std::move(s)), context);
}

void ExpectEntryMatches(const EntryRecord& want, const EntryView& got) {
  SCOPED_TRACE(want.name);
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.kind, want.kind);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(std::vector<uint64_t>(got.shape.begin(), got.shape.end()), want.shape);
  ASSERT_EQ(got.num_chunks, want.chunks.size());
  const uint32_t ndim = got.ndim();
  for (size_t i = 0; i < got.num_chunks; ++i) {
    const Box box = got.chunk_box(i);
    ASSERT_EQ(box.ndim, ndim);
    for (uint32_t d = 0; d < ndim; ++d) {
      EXPECT_EQ(box.offset[d], want.chunk_offsets[i * ndim + d]);
      EXPECT_EQ(box.length[d], want.chunk_lengths[i * ndim + d]);
    }
    const ChunkLocation c = got.chunk(i);
    EXPECT_EQ(c.offset, want.chunks[i].offset);
    EXPECT_EQ(c.length, want.chunks[i].length);
    EXPECT_EQ(c.checksum, want.chunks[i].checksum);
    EXPECT_EQ(c.file, want.chunks[i].file);
    EXPECT_EQ(c.first_block, want.chunks[i].first_block);
  }
  EXPECT_EQ(std::vector<uint64_t>(got.block_checksums.begin(), got.block_checksums.end()), want.block_checksums);
  Result<uint64_t> nbytes = CheckedVolume(want.shape, DTypeSize(want.dtype));
  ASSERT_TRUE(nbytes.ok());
  EXPECT_EQ(got.nbytes(), *nbytes);
}

TEST(MetadataTest, RoundTrip) {
  const MetadataRecord want = ValidRecord();
  MetadataRecord shuffled = want;
  std::mt19937 rng(7);
  std::shuffle(shuffled.entries.begin(), shuffled.entries.end(), rng);  // EncodeMetadata sorts
  std::reverse(shuffled.user.begin(), shuffled.user.end());
  Result<std::string> buf = EncodeMetadata(shuffled);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  EXPECT_EQ(std::string(buf->data() + 4, 4), "DCK1");

  Result<MetadataView> view = ParseString(*buf);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->format_major(), kFormatMajor);
  EXPECT_EQ(view->format_minor(), kFormatMinor);
  EXPECT_EQ(view->writer(), want.writer);
  EXPECT_EQ(view->checksum_block_size(), want.checksum_block_size);
  EXPECT_EQ(view->alignment(), want.alignment);
  EXPECT_EQ(view->structure(), want.structure);
  EXPECT_EQ(view->buffer_size(), buf->size());
  ASSERT_EQ(view->num_files(), want.files.size());
  for (size_t i = 0; i < want.files.size(); ++i) {
    EXPECT_EQ(view->file_name(i), want.files[i].name);
    EXPECT_EQ(view->file_size(i), want.files[i].size);
  }
  ASSERT_EQ(view->num_entries(), want.entries.size());
  for (size_t i = 0; i < want.entries.size(); ++i) {
    ExpectEntryMatches(want.entries[i], view->entry(i));
    EXPECT_EQ(view->Find(want.entries[i].name), std::optional<size_t>(i));
  }
  EXPECT_EQ(view->Find("a"), std::nullopt);
  EXPECT_EQ(view->Find("zzz"), std::nullopt);
  EXPECT_EQ(view->Find(""), std::nullopt);
  EXPECT_EQ(view->Find("big "), std::nullopt);
  ASSERT_EQ(view->num_user(), 2u);
  EXPECT_EQ(view->user(0), std::make_pair(std::string_view("framework"), std::string_view("jax")));
  EXPECT_EQ(view->FindUser("step"), std::optional<std::string_view>("10"));
  EXPECT_EQ(view->FindUser("steps"), std::nullopt);

  // ToRecord gives back the (sorted) record, and it encodes to the very same bytes.
  const MetadataRecord back = view->ToRecord();
  ASSERT_EQ(back.entries.size(), want.entries.size());
  for (size_t i = 0; i < want.entries.size(); ++i) {
    EXPECT_EQ(back.entries[i].name, want.entries[i].name);
    EXPECT_EQ(back.entries[i].shape, want.entries[i].shape);
    EXPECT_EQ(back.entries[i].chunk_offsets, want.entries[i].chunk_offsets);
    EXPECT_EQ(back.entries[i].chunk_lengths, want.entries[i].chunk_lengths);
    EXPECT_EQ(back.entries[i].block_checksums, want.entries[i].block_checksums);
    EXPECT_EQ(back.entries[i].chunks.size(), want.entries[i].chunks.size());
  }
  EXPECT_EQ(back.user, want.user);
  EXPECT_EQ(back.alignment, want.alignment);
  Result<std::string> re = EncodeMetadata(back);
  ASSERT_TRUE(re.ok());
  EXPECT_EQ(*re, *buf);

  // Deterministic: the same record always gives the same bytes, and the view outlives the caller's pointer.
  Result<std::string> again = EncodeMetadata(want);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *buf);
  MetadataView copy = *view;
  view = ParseString(*buf);
  EXPECT_EQ(copy.entry(1).name, "a.weight");
}

TEST(MetadataTest, EmptyCheckpointRoundTrips) {
  MetadataRecord r;
  Result<std::string> buf = EncodeMetadata(r);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  Result<MetadataView> view = ParseString(*buf);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->num_entries(), 0u);
  EXPECT_EQ(view->num_files(), 0u);
  EXPECT_EQ(view->Find("x"), std::nullopt);
  EXPECT_EQ(view->FindUser("x"), std::nullopt);
}

TEST(MetadataTest, RawEncoderMatchesValidator) {
  // The hostile tests below start from this buffer: it must be valid as-is.
  Result<MetadataView> view = ParseString(RawEncode(ToRaw(ValidRecord())));
  ASSERT_TRUE(view.ok()) << view.status().ToString();
}

TEST(MetadataTest, EncodeCanonicalisesBlockTables) {
  MetadataRecord r = ValidRecord();
  EntryRecord* e = nullptr;
  for (auto& x : r.entries) {
    if (x.name == "two_big") e = &x;
  }
  ASSERT_NE(e, nullptr);
  // The writer filled the block table in the other order, with an unused value in front.
  const std::vector<uint64_t> blocks = e->block_checksums;
  e->block_checksums = {99, blocks[2], blocks[3], blocks[0], blocks[1]};
  e->chunks[0].first_block = 3;
  e->chunks[1].first_block = 1;
  Result<std::string> buf = EncodeMetadata(r);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  Result<MetadataView> view = ParseString(*buf);
  ASSERT_TRUE(view.ok());
  EntryView v = view->entry(*view->Find("two_big"));
  EXPECT_EQ(std::vector<uint64_t>(v.block_checksums.begin(), v.block_checksums.end()), blocks);
  EXPECT_EQ(v.chunk(0).first_block, 0u);
  EXPECT_EQ(v.chunk(1).first_block, 2u);
}

TEST(MetadataTest, EncodeRefusesInvalidRecords) {
  auto expect_refused = [](const std::function<void(MetadataRecord&)>& damage, const std::string& needle) {
    MetadataRecord r = ValidRecord();
    damage(r);
    Result<std::string> buf = EncodeMetadata(r);
    ASSERT_FALSE(buf.ok()) << needle;
    EXPECT_EQ(buf.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(buf.status().message().find(needle), std::string::npos) << buf.status().message();
  };
  expect_refused([](MetadataRecord& r) { r.entries.push_back(r.entries[0]); }, "appears twice");
  expect_refused([](MetadataRecord& r) { r.files[0].name = "../evil"; }, "invalid name");
  expect_refused([](MetadataRecord& r) { r.entries[0].chunks[0].offset = 100; }, "not a multiple of the alignment");
  expect_refused([](MetadataRecord& r) { r.alignment = 512; }, "alignment 512");
  expect_refused([](MetadataRecord& r) { r.user.push_back(r.user[0]); }, "appears twice");
  expect_refused([](MetadataRecord& r) { r.entries[2].chunks[0].first_block = kNoBlockTable; }, "block table");
  expect_refused([](MetadataRecord& r) { r.entries[1].dtype = DType::kInvalid; }, "unknown dtype 0");
}

// ---- Hostile input: a valid record with one field broken, built with the raw encoder. ----

struct Hostile {
  const char* what;
  std::function<void(RawMetadata&)> damage;
  StatusCode code;
  const char* needle;  // part of the expected message
};

RawEntry& Entry(RawMetadata& m, const std::string& name) {
  for (auto& e : m.entries) {
    if (e.name == name) return e;
  }
  std::abort();
}

// Makes `m` a format 2.0 file whose first data file is one of base `name` (a valid reference), for a case to break.
void RefersTo(RawMetadata& m, std::optional<std::string> name) {
  m.format_major = kFormatMajorReferences;
  m.format_minor = kFormatMinorReferences;
  m.bases = {{std::move(name), 0x1234, 1000}};
  m.chain_length = 1;
  m.files[0].base = 1;
}

std::vector<Hostile> HostileCases() {
  const StatusCode kCorrupt = StatusCode::kCorrupt;
  return {
      // Header.
      {"no format version", [](RawMetadata& m) { m.format_major = 0; }, kCorrupt, "no format version"},
      {"future major", [](RawMetadata& m) { m.format_major = 4; }, StatusCode::kVersion, "format version 4."},
      {"bases in 1.x",
       [](RawMetadata& m) {
         m.bases = {{"step-1", 1, 100}}, m.chain_length = 1;
       },
       kCorrupt, "which only format 2.0 may"},
      {"base escapes the parent", [](RawMetadata& m) { RefersTo(m, ".."); }, kCorrupt, "must name a sibling"},
      {"base is a path", [](RawMetadata& m) { RefersTo(m, "a/b"); }, kCorrupt, "invalid name 'a/b'"},
      {"base is absolute", [](RawMetadata& m) { RefersTo(m, "/etc"); }, kCorrupt, "invalid name '/etc'"},
      {"base without name", [](RawMetadata& m) { RefersTo(m, std::nullopt); }, kCorrupt, "verification"},
      {"base listed twice",
       [](RawMetadata& m) {
         RefersTo(m, "step-1");
         m.bases.push_back(m.bases[0]);
       },
       kCorrupt, "listed twice"},
      {"file base out of range",
       [](RawMetadata& m) {
         RefersTo(m, "step-1");
         m.files[0].base = 2;
       },
       kCorrupt, "names base checkpoint 2, but there are 1"},
      {"chain length without bases",
       [](RawMetadata& m) {
         RefersTo(m, "step-1");
         m.bases.clear();
         m.files[0].base = 0;
       },
       kCorrupt, "chain_length 1 disagrees"},
      {"same file twice in a base",
       [](RawMetadata& m) {
         RefersTo(m, "step-1");
         m.files.push_back(m.files[0]);
       },
       kCorrupt, "are the same file"},
      {"chunk hashes short",
       [](RawMetadata& m) {
         m.entries[1].chunk_hashes.assign(m.entries[1].chunks.size() - 1, ChunkHash{1, 2});
       },
       kCorrupt, "chunk hashes for"},
      {"block size 0", [](RawMetadata& m) { m.checksum_block_size = 0; }, kCorrupt, "checksum_block_size 0"},
      {"block size not pow2", [](RawMetadata& m) { m.checksum_block_size = 5000; }, kCorrupt,
       "checksum_block_size 5000"},
      {"block size too small", [](RawMetadata& m) { m.checksum_block_size = 2048; }, kCorrupt, "checksum_block_size"},
      {"alignment 0", [](RawMetadata& m) { m.alignment = 0; }, kCorrupt, "alignment 0"},
      {"alignment not pow2", [](RawMetadata& m) { m.alignment = 12288; }, kCorrupt, "alignment 12288"},
      {"alignment too small", [](RawMetadata& m) { m.alignment = 512; }, kCorrupt, "alignment 512"},
      {"writer not utf-8", [](RawMetadata& m) { m.writer = "\xff\xfe"; }, kCorrupt, "writer is not valid UTF-8"},
      {"structure not utf-8", [](RawMetadata& m) { m.structure = "{\xc0\xaf}"; }, kCorrupt, "structure is not valid"},
      // Files.
      {"file without name", [](RawMetadata& m) { m.files[1].name.reset(); }, kCorrupt, "FlatBuffers verification"},
      {"file name with slash", [](RawMetadata& m) { m.files[1].name = "sub/data.bin"; }, kCorrupt,
       "invalid name 'sub/data.bin'"},
      {"file name with backslash", [](RawMetadata& m) { m.files[1].name = "a\\b"; }, kCorrupt, "invalid name"},
      {"file name ..", [](RawMetadata& m) { m.files[1].name = ".."; }, kCorrupt, "invalid name '..'"},
      {"file name .", [](RawMetadata& m) { m.files[1].name = "."; }, kCorrupt, "invalid name '.'"},
      {"file name ../x", [](RawMetadata& m) { m.files[1].name = "../x"; }, kCorrupt, "invalid name"},
      {"file name with ..", [](RawMetadata& m) { m.files[1].name = "x..y"; }, kCorrupt, "invalid name"},
      {"file name empty", [](RawMetadata& m) { m.files[1].name = ""; }, kCorrupt, "invalid name ''"},
      {"file name NUL", [](RawMetadata& m) { m.files[1].name = std::string("a\0b", 3); }, kCorrupt,
       "invalid name 'a\\x00b'"},
      {"file name control", [](RawMetadata& m) { m.files[1].name = "a\nb"; }, kCorrupt, "invalid name 'a\\x0ab'"},
      {"file name not utf-8", [](RawMetadata& m) { m.files[1].name = "a\xffz"; }, kCorrupt, "invalid name"},
      {"file name 256 bytes", [](RawMetadata& m) { m.files[1].name = std::string(256, 'x'); }, kCorrupt,
       "invalid name"},
      {"file name reserved", [](RawMetadata& m) { m.files[1].name = "metadata.dckpt"; }, kCorrupt, "reserved name"},
      {"duplicate file", [](RawMetadata& m) { m.files[1].name = m.files[0].name; }, kCorrupt,
       "data files #0 and #1 have the same name 'data-00000.bin'"},
      // User key/values.
      {"duplicate user key", [](RawMetadata& m) { m.user[1].first = m.user[0].first; }, kCorrupt,
       "user key 'framework' appears twice"},
      {"unsorted user keys", [](RawMetadata& m) { std::swap(m.user[0], m.user[1]); }, kCorrupt,
       "user keys are not sorted"},
      {"empty user key", [](RawMetadata& m) { m.user[0].first = ""; }, kCorrupt, "user key #0 is empty"},
      {"user key NUL", [](RawMetadata& m) { m.user[0].first = std::string("f\0", 2); }, kCorrupt, "NUL"},
      {"user value not utf-8", [](RawMetadata& m) { m.user[0].second = "\x80"; }, kCorrupt, "value of user key #0"},
      // Entry names.
      {"entry without name", [](RawMetadata& m) { m.entries[3].name.reset(); }, kCorrupt, "FlatBuffers verification"},
      {"empty entry name", [](RawMetadata& m) { m.entries[0].name = ""; }, kCorrupt, "name of entry #0 is empty"},
      {"duplicate entry", [](RawMetadata& m) { m.entries[1].name = m.entries[0].name; }, kCorrupt,
       "entry name 'a.bias' appears twice"},
      {"unsorted entries", [](RawMetadata& m) { std::swap(m.entries[1], m.entries[2]); }, kCorrupt,
       "entries are not sorted by name: 'big' comes before 'a.weight'"},
      {"entry name NUL", [](RawMetadata& m) { m.entries[0].name = std::string("a.bias\0x", 8); }, kCorrupt, "NUL"},
      {"entry name not utf-8", [](RawMetadata& m) { m.entries[0].name = "a\xed\xa0\x80"; }, kCorrupt,
       "not valid UTF-8"},
      // Kinds, dtypes, shapes.
      {"unknown kind", [](RawMetadata& m) { Entry(m, "a.bias").kind = 7; }, kCorrupt,
       "entry 'a.bias': unknown entry kind 7"},
      {"dtype 0", [](RawMetadata& m) { Entry(m, "a.bias").dtype = 0; }, kCorrupt, "entry 'a.bias': unknown dtype 0"},
      {"dtype 18", [](RawMetadata& m) { Entry(m, "a.bias").dtype = 18; }, kCorrupt, "unknown dtype 18"},
      {"dtype 255", [](RawMetadata& m) { Entry(m, "a.bias").dtype = 255; }, kCorrupt, "unknown dtype 255"},
      {"9 dims",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "u16x8d");
         e.shape.push_back(1);
         e.chunk_offsets.push_back(0);
         e.chunk_lengths.push_back(1);
       },
       kCorrupt, "entry 'u16x8d': has 9 dimensions; at most 8"},
      {"shape overflow",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "zero");
         e.shape = {1ull << 32, 1ull << 31};  // 2^63 elements of 2 bytes
       },
       kCorrupt, "entry 'zero': shape [4294967296, 2147483648] of F16 overflows 64 bits"},
      {"chunk_offsets too short", [](RawMetadata& m) { Entry(m, "a.weight").chunk_offsets.pop_back(); }, kCorrupt,
       "chunk_offsets and chunk_lengths need 8 values each, not 7 and 8"},
      {"chunk_lengths too long", [](RawMetadata& m) { Entry(m, "a.weight").chunk_lengths.push_back(1); }, kCorrupt,
       "not 8 and 9"},
      {"chunks missing", [](RawMetadata& m) { Entry(m, "a.weight").chunks.pop_back(); }, kCorrupt, "has 3 chunks"},
      // Chunk boxes.
      {"box past the shape", [](RawMetadata& m) { Entry(m, "a.weight").chunk_lengths[7] = 4; }, kCorrupt,
       "entry 'a.weight' chunk #3: box [2:4, 3:7] lies outside the shape [4, 6]"},
      {"box offset overflow", [](RawMetadata& m) { Entry(m, "a.weight").chunk_offsets[6] = UINT64_MAX; }, kCorrupt,
       "entry 'a.weight' chunk #3: box [18446744073709551615:overflow, 3:6] lies outside"},
      {"length != volume * itemsize", [](RawMetadata& m) { Entry(m, "a.weight").chunks[2].length = 24; }, kCorrupt,
       "entry 'a.weight' chunk #2: length 24 does not match its box [2:4, 0:3] of BF16 (12 bytes)"},
      {"scalar length", [](RawMetadata& m) { Entry(m, "scalar").chunks[0].length = 4; }, kCorrupt,
       "entry 'scalar' chunk #0: length 4"},
      {"overlapping chunks",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "two_big");  // second chunk moved one element left, first one too short: overlap
         e.chunk_offsets[1] = 4999;
         e.chunk_lengths[1] = 5001;
         e.chunks[1].length = 5001;
         e.chunks[1].checksum = CombineBlockChecksums(Span<const uint64_t>(e.block_checksums.data() + 2, 2));
       },
       kCorrupt, "entry 'two_big': chunks do not tile the shape [10000] exactly"},
      {"hole between chunks",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "a.weight");
         e.chunk_lengths[1] = 2;  // [0:2, 0:2] leaves column 2 uncovered
         e.chunks[0].length = 8;
       },
       kCorrupt, "hole"},
      {"duplicated chunk",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "a.weight");
         e.chunk_offsets[6] = 0, e.chunk_offsets[7] = 0;  // chunk #3 == chunk #0, [2:4, 3:6] uncovered
       },
       kCorrupt, "chunks do not tile"},
      {"empty chunk in non-empty tensor",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "a.bias");
         e.chunk_offsets.push_back(0);
         e.chunk_lengths.push_back(0);
         e.chunks.push_back({0, 0, 0, 0, kNoBlockTable});
       },
       kCorrupt, "is empty in a non-empty tensor"},
      {"non-empty tensor without chunks",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "a.bias");
         e.chunk_offsets.clear();
         e.chunk_lengths.clear();
         e.chunks.clear();
       },
       kCorrupt, "entry 'a.bias': chunks do not tile"},
      {"second scalar chunk",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "scalar");
         e.chunks.push_back(e.chunks[0]);
       },
       kCorrupt, "overlap"},
      // Files, offsets and lengths.
      {"file index out of range", [](RawMetadata& m) { Entry(m, "a.weight").chunks[1].file = 2; }, kCorrupt,
       "entry 'a.weight' chunk #1: data file index 2 is out of range (2 data files)"},
      {"file index huge", [](RawMetadata& m) { Entry(m, "a.weight").chunks[1].file = UINT32_MAX; }, kCorrupt,
       "data file index 4294967295 is out of range"},
      {"misaligned offset", [](RawMetadata& m) { Entry(m, "a.weight").chunks[1].offset += 512; }, kCorrupt,
       "entry 'a.weight' chunk #1: offset 4608 in data file 'data-00000.bin' is not a multiple of the alignment 4096"},
      {"offset + length overflows", [](RawMetadata& m) { Entry(m, "big").chunks[0].offset = UINT64_MAX - 4095; },
       kCorrupt, "entry 'big' chunk #0: offset 18446744073709547520 + length 12000 exceeds the size"},
      // Checksum block tables.
      {"multi-block chunk without table", [](RawMetadata& m) { Entry(m, "big").chunks[0].first_block = kNoBlockTable; },
       kCorrupt, "entry 'big' chunk #0: has 3 checksum blocks but no block table"},
      {"block table out of range", [](RawMetadata& m) { Entry(m, "big").block_checksums.pop_back(); }, kCorrupt,
       "entry 'big' chunk #0: block table [0, +3) is out of range"},
      {"block table first_block huge", [](RawMetadata& m) { Entry(m, "big").chunks[0].first_block = 0xFFFFFFFEu; },
       kCorrupt, "block table [4294967294, +3)"},
      {"no block table vector", [](RawMetadata& m) { Entry(m, "big").block_checksums.clear(); }, kCorrupt,
       "out of range"},
      {"block tables out of order",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "two_big");
         std::swap(e.chunks[0].first_block, e.chunks[1].first_block);
       },
       kCorrupt, "entry 'two_big' chunk #0: block table [2, +2) is out of range or out of order"},
      {"unused block checksums", [](RawMetadata& m) { Entry(m, "big").block_checksums.push_back(1); }, kCorrupt,
       "entry 'big': has 1 block checksums that no chunk uses"},
      {"single-block chunk with table", [](RawMetadata& m) { Entry(m, "a.bias").chunks[0].first_block = 0; }, kCorrupt,
       "entry 'a.bias' chunk #0: has a single checksum block but a block table"},
      {"checksum disagrees with blocks", [](RawMetadata& m) { Entry(m, "big").chunks[0].checksum ^= 1; }, kCorrupt,
       "entry 'big' chunk #0: checksum does not match its block checksums"},
      {"block checksum changed", [](RawMetadata& m) { Entry(m, "big").block_checksums[1] ^= 1; }, kCorrupt,
       "does not match its block checksums"},
      // Bytes entries.
      {"bytes entry with two chunks",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "blob");
         e.chunk_lengths[0] = 5;
         e.chunks[0].length = 5;
         e.chunk_offsets.push_back(5);
         e.chunk_lengths.push_back(5);
         e.chunks.push_back({0, 5, 0, 0, kNoBlockTable});
       },
       kCorrupt, "entry 'blob': a bytes entry must have dtype U8, a 1-d shape and exactly one chunk"},
      {"bytes entry of f32",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "blob");
         e.dtype = static_cast<uint8_t>(DType::kF32);
         e.chunks[0].length = 40;
       },
       kCorrupt, "(it has F32, 1 dimensions and 1 chunks)"},
      {"bytes entry 2-d",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "blob");
         e.shape = {10, 1};
         e.chunk_offsets = {0, 0};
         e.chunk_lengths = {10, 1};
       },
       kCorrupt, "a bytes entry must have"},
      {"bytes entry without chunk",
       [](RawMetadata& m) {
         RawEntry& e = Entry(m, "empty_blob");
         e.chunk_offsets.clear();
         e.chunk_lengths.clear();
         e.chunks.clear();
       },
       kCorrupt, "exactly one chunk"},
      // Shared storage (work amplification).
      {"shared chunk vectors",
       [](RawMetadata& m) {
         // 300 entries that all point at one 2000-chunk vector: each is valid on its own.
         RawEntry e = Entry(m, "a.bias");
         e.shape = {2000};
         e.chunk_offsets.clear();
         e.chunk_lengths.clear();
         e.chunks.clear();
         for (uint64_t i = 0; i < 2000; ++i) {
           e.chunk_offsets.push_back(i);
           e.chunk_lengths.push_back(1);
           e.chunks.push_back({0, 4, 0, 0, kNoBlockTable});
         }
         m.entries.clear();
         for (int i = 0; i < 300; ++i) {
           e.name = "e" + std::to_string(1000 + i);
           m.entries.push_back(e);
         }
         m.share_chunk_vectors = true;
       },
       kCorrupt, "shares storage"},
  };
}

TEST(MetadataTest, RejectsEveryHostileField) {
  for (const Hostile& h : HostileCases()) {
    SCOPED_TRACE(h.what);
    RawMetadata m = ToRaw(ValidRecord());
    h.damage(m);
    Result<MetadataView> view = ParseString(RawEncode(m));
    ASSERT_FALSE(view.ok());
    EXPECT_EQ(view.status().code(), h.code) << view.status().ToString();
    const std::string& msg = view.status().message();
    EXPECT_EQ(msg.rfind("/ckpt/step10: ", 0), 0u) << msg;  // every message names the checkpoint
    EXPECT_NE(msg.find(h.needle), std::string::npos) << "want '" << h.needle << "' in: " << msg;
  }
}

TEST(MetadataTest, ErrorMessageNamesCheckpointEntryChunkAndFile) {
  RawMetadata m = ToRaw(ValidRecord());
  m.files[1].size = 10000;
  m.entries.clear();
  RawEntry e;
  e.name = "layers.0.w";
  e.dtype = static_cast<uint8_t>(DType::kU8);
  e.shape = {4 * 4096};
  for (uint64_t i = 0; i < 4; ++i) {
    e.chunk_offsets.push_back(i * 4096);
    e.chunk_lengths.push_back(4096);
    e.chunks.push_back({i * 4096, 4096, 0, 0, kNoBlockTable});
  }
  e.chunks[3].file = 1;
  e.chunks[3].offset = 8192;
  m.entries.push_back(e);
  m.checksum_block_size = 4096;
  Result<MetadataView> view = ParseString(RawEncode(m));
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().message(),
            "/ckpt/step10: entry 'layers.0.w' chunk #3: offset 8192 + length 4096 exceeds the size 10000 of data file "
            "'data-00001.bin'");
}

TEST(MetadataTest, NamesInMessagesAreEscapedAndShortened) {
  RawMetadata m = ToRaw(ValidRecord());
  std::string name = "evil\x1b[31m'" + std::string(500, 'x');
  m.entries[0].name = name;
  m.entries[0].kind = 9;
  Result<MetadataView> view = ParseString(RawEncode(m));
  ASSERT_FALSE(view.ok());
  const std::string& msg = view.status().message();
  EXPECT_NE(msg.find("entry 'evil\\x1b[31m\\x27xxx"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 300u);
  EXPECT_EQ(msg.find('\x1b'), std::string::npos);
}

TEST(MetadataTest, WrongIdentifierAndGarbage) {
  RawMetadata m = ToRaw(ValidRecord());
  m.trailer = false;  // else the checksum reports the damage first
  std::string wrong = RawEncode(m);
  wrong[4] = 'X';
  Result<MetadataView> view = ParseString(wrong);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(view.status().message().find("not a distckpt metadata file"), std::string::npos);

  EXPECT_FALSE(ParseString("").ok());
  EXPECT_FALSE(ParseString(std::string(1000, '\0')).ok());
  EXPECT_FALSE(ParseString("PK\x03\x04 this is a zip file, not a checkpoint").ok());
  EXPECT_FALSE(MetadataView::Parse(nullptr, "x").ok());
  // A buffer of only the header: root offset 8 points past the end.
  std::string header(
      "\x08\x00\x00\x00"
      "DCK1",
      8);
  EXPECT_EQ(ParseString(header).status().code(), StatusCode::kCorrupt);
}

// The form a mapped file uses: bytes owned by something else, kept alive by `owner`.
TEST(MetadataTest, ParsesABufferItDoesNotOwn) {
  auto storage = std::make_shared<std::vector<uint64_t>>();
  const std::string encoded = *EncodeMetadata(ValidRecord());
  storage->resize(encoded.size() / 8 + 2);
  std::memcpy(storage->data(), encoded.data(), encoded.size());
  Result<MetadataView> view = MetadataView::Parse(storage, storage->data(), encoded.size(), "borrowed");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  storage.reset();  // the view keeps the owner alive
  EXPECT_EQ(view->buffer_size(), encoded.size());
  EXPECT_EQ(view->num_entries(), ValidRecord().entries.size());
  // Misaligned bytes and a missing owner are refused, never read.
  auto shifted = std::make_shared<std::vector<uint64_t>>(encoded.size() / 8 + 2);
  char* odd = reinterpret_cast<char*>(shifted->data()) + 4;
  std::memcpy(odd, encoded.data(), encoded.size());
  EXPECT_EQ(MetadataView::Parse(shifted, odd, encoded.size(), "x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MetadataView::Parse(nullptr, encoded.data(), encoded.size(), "x").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(MetadataTest, EveryTruncationIsRejected) {
  for (const std::string& buf : {*EncodeMetadata(ValidRecord()), *EncodeMetadata(MetadataRecord())}) {
    ASSERT_TRUE(ParseString(buf).ok());
    for (size_t len = 0; len < buf.size(); ++len) {
      Result<MetadataView> view = ParseString(buf.substr(0, len));
      ASSERT_FALSE(view.ok()) << "truncated to " << len << " of " << buf.size() << " bytes";
      EXPECT_EQ(view.status().code(), StatusCode::kCorrupt);
    }
  }
}

// Format 1.1: the file ends with XXH3-64 of everything before it and the magic, and the reader checks it first.
TEST(MetadataTest, EncodedFileEndsWithItsChecksumTrailer) {
  const std::string buf = *EncodeMetadata(ValidRecord());
  ASSERT_GT(buf.size(), kMetadataTrailerBytes);
  EXPECT_EQ(buf.substr(buf.size() - 8), "DCKPTSUM");
  uint64_t stored;
  std::memcpy(&stored, buf.data() + buf.size() - 16, 8);
  EXPECT_EQ(stored, Xxh3(buf.data(), buf.size() - 16));
  Result<MetadataView> view = ParseString(buf);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->format_minor(), kFormatMinor);
  EXPECT_EQ(view->checksum(), stored);
  EXPECT_EQ(view->buffer_size(), buf.size());
}

// The defect the trailer fixes: a flipped bit in a user value, the structure string or a stored chunk checksum used
// to load silently. Now every single-bit flip anywhere in the file is refused as corrupt.
TEST(MetadataTest, EverySingleBitFlipIsDetected) {
  for (const std::string& valid : {*EncodeMetadata(ValidRecord()), *EncodeMetadata(MetadataRecord())}) {
    for (size_t pos = 0; pos < valid.size(); ++pos) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string buf = valid;
        buf[pos] = static_cast<char>(buf[pos] ^ (1 << bit));
        Result<MetadataView> view = ParseString(buf);
        ASSERT_FALSE(view.ok()) << "bit " << bit << " of byte " << pos << " of " << valid.size() << " flipped";
        ASSERT_EQ(view.status().code(), StatusCode::kCorrupt) << view.status().ToString();
      }
    }
  }
}

TEST(MetadataTest, ChecksumMismatchIsCorruptAndSaysSo) {
  std::string buf = *EncodeMetadata(ValidRecord());
  buf[buf.size() / 2] ^= 0x10;
  Result<MetadataView> view = ParseString(buf);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(view.status().message().rfind("/ckpt/step10: metadata checksum mismatch (stored ", 0), 0u)
      << view.status().message();
}

// Bytes appended after the trailer, or a trailer cut off: the file no longer ends with the magic, and a 1.1 file
// without its trailer is refused (it is never read as an unprotected 1.0 file).
TEST(MetadataTest, MissingOrDisplacedTrailerIsCorrupt) {
  const std::string valid = *EncodeMetadata(ValidRecord());
  for (const std::string& buf : {valid + std::string(8, '\0'), valid + "DCKPTSUM", valid.substr(0, valid.size() - 16),
                                 valid.substr(0, valid.size() - 8)}) {
    Result<MetadataView> view = ParseString(buf);
    ASSERT_FALSE(view.ok()) << buf.size();
    EXPECT_EQ(view.status().code(), StatusCode::kCorrupt) << view.status().ToString();
  }
  Result<MetadataView> bare = ParseString(valid.substr(0, valid.size() - 16));
  EXPECT_NE(bare.status().message().find("has no checksum trailer"), std::string::npos) << bare.status().ToString();
}

// Format 1.0 files have no trailer and stay readable (the golden v1_all_dtypes checkpoint is one).
TEST(MetadataTest, Format10FileWithoutTrailerIsAccepted) {
  RawMetadata m = ToRaw(ValidRecord());
  m.format_minor = 0;
  m.trailer = false;
  Result<MetadataView> view = ParseString(RawEncode(m));
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->format_minor(), 0);
  EXPECT_FALSE(view->checksum().has_value());
  // A 1.0 file that carries a trailer anyway gets it checked.
  m.trailer = true;
  std::string buf = RawEncode(m);
  ASSERT_TRUE(ParseString(buf).ok());
  buf[10] ^= 1;
  EXPECT_EQ(ParseString(buf).status().code(), StatusCode::kCorrupt);
}

// What a 1.0 reader does with a 1.1 file: it runs the FlatBuffers verifier over the whole file and reads the fields.
// The trailer lies outside every table, vector and string, so such a reader accepts the file and ignores the trailer
// (FORMAT.md section 7: a compatible addition, which an old reader cannot check and safely ignores).
TEST(MetadataTest, TrailerIsInvisibleToAFlatBuffersReaderOfTheWholeFile) {
  const std::string buf = *EncodeMetadata(ValidRecord());
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
  EXPECT_TRUE(fb::VerifyMetadataBuffer(verifier));
  const fb::Metadata* root = fb::GetMetadata(buf.data());
  EXPECT_EQ(root->format_major(), 1);
  EXPECT_EQ(root->format_minor(), kFormatMinor);
  EXPECT_EQ(root->entries()->size(), ValidRecord().entries.size());
  EXPECT_EQ(std::string(root->structure()->c_str()), ValidRecord().structure);
}

TEST(MetadataTest, FutureMajorVersionIsAVersionError) {
  RawMetadata m = ToRaw(ValidRecord());
  m.format_major = kFormatMajorCompression + 1;
  Result<MetadataView> view = ParseString(RawEncode(m));
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), StatusCode::kVersion);
  EXPECT_NE(view.status().message().find("upgrade distckpt"), std::string::npos);

  // Even when the rest of the layout is unrecognisable to this reader, as long as format_major is field 0.
  std::string buf = RawEncode(m);
  for (size_t i = buf.size() - 64; i < buf.size(); ++i) buf[i] = '\xff';
  EXPECT_EQ(ParseString(buf).status().code(), StatusCode::kVersion);
}

TEST(MetadataTest, FutureMinorVersionWithUnknownFieldsIsAccepted) {
  RawMetadata m = ToRaw(ValidRecord());
  m.format_minor = kFormatMinor + 3;
  m.unknown_fields = true;
  Result<MetadataView> view = ParseString(RawEncode(m));
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->format_minor(), kFormatMinor + 3);
  const MetadataRecord want = ValidRecord();
  ASSERT_EQ(view->num_entries(), want.entries.size());
  for (size_t i = 0; i < want.entries.size(); ++i) ExpectEntryMatches(want.entries[i], view->entry(i));

  // A dtype or kind this reader does not know, in a file from a newer minor version: a version error, not corrupt.
  m.entries[0].dtype = 30;
  EXPECT_EQ(ParseString(RawEncode(m)).status().code(), StatusCode::kVersion);
  m.entries[0].dtype = static_cast<uint8_t>(DType::kF32);
  m.entries[0].kind = 2;
  EXPECT_EQ(ParseString(RawEncode(m)).status().code(), StatusCode::kVersion);
}

TEST(MetadataTest, EmptyContextGivesBareMessages) {
  RawMetadata m = ToRaw(ValidRecord());
  m.alignment = 3;
  Result<MetadataView> view = ParseString(RawEncode(m), "");
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().message().rfind("alignment 3", 0), 0u) << view.status().message();
}

TEST(FileNameTest, Rules) {
  EXPECT_TRUE(IsValidFileName("data-00000.bin"));
  EXPECT_TRUE(IsValidFileName(".hidden"));
  EXPECT_TRUE(IsValidFileName("d\xc3\xa9j\xc3\xa0.bin"));  // UTF-8
  EXPECT_TRUE(IsValidFileName(std::string(255, 'a')));
  EXPECT_FALSE(IsValidFileName(std::string(256, 'a')));
  EXPECT_FALSE(IsValidFileName(""));
  EXPECT_FALSE(IsValidFileName("."));
  EXPECT_FALSE(IsValidFileName(".."));
  EXPECT_FALSE(IsValidFileName("../etc/passwd"));
  EXPECT_FALSE(IsValidFileName("/etc/passwd"));
  EXPECT_FALSE(IsValidFileName("a/b"));
  EXPECT_FALSE(IsValidFileName("a\\b"));
  EXPECT_FALSE(IsValidFileName("a..b"));
  EXPECT_FALSE(IsValidFileName(std::string("a\0b", 3)));
  EXPECT_FALSE(IsValidFileName("a\tb"));
  EXPECT_FALSE(IsValidFileName("a\x7f"));
  EXPECT_FALSE(IsValidFileName("\xc0\xae\xc0\xae"));  // overlong "..": invalid UTF-8
  EXPECT_FALSE(IsValidFileName("\xff"));
}

// Format 1.2 records chunk hashes; a record with bases is written as 2.0 (which 1.x readers refuse by its major
// version), and every new field reads back and survives ToRecord.
TEST(MetadataTest, ChunkHashesAndReferencesRoundTrip) {
  MetadataRecord r = ValidRecord();
  for (EntryRecord& e : r.entries) {
    for (size_t i = 0; i < e.chunks.size(); ++i) e.chunk_hashes.push_back(ChunkHash{i + 1, e.name.size()});
  }
  Result<MetadataView> plain = ParseString(*EncodeMetadata(r));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->format_major(), 1);
  EXPECT_EQ(plain->format_minor(), kFormatMinor);
  EXPECT_EQ(plain->num_bases(), 0u);
  EXPECT_EQ(plain->chain_length(), 0u);
  const EntryView a = plain->entry(*plain->Find("a.weight"));
  ASSERT_EQ(a.chunk_hashes.size(), a.num_chunks);
  EXPECT_EQ(a.chunk_hashes[3], (ChunkHash{4, 8}));

  r.bases = {{"step-00010", 0xabc, 4096}, {"step-00020", 0xdef, 8192}};
  r.chain_length = 2;
  r.files.push_back({r.files[0].name, r.files[0].size, 2});  // the same name in a base is another file
  r.entries[0].chunks[0].file = static_cast<uint32_t>(r.files.size() - 1);
  const std::string encoded = *EncodeMetadata(r);
  Result<MetadataView> refs = ParseString(encoded);
  ASSERT_TRUE(refs.ok()) << refs.status().ToString();
  EXPECT_EQ(refs->format_major(), kFormatMajorReferences);
  EXPECT_EQ(refs->format_minor(), kFormatMinorReferences);
  ASSERT_EQ(refs->num_bases(), 2u);
  EXPECT_EQ(refs->base_name(1), "step-00020");
  EXPECT_EQ(refs->base_metadata_checksum(1), 0xdefu);
  EXPECT_EQ(refs->base_metadata_size(0), 4096u);
  EXPECT_EQ(refs->chain_length(), 2u);
  EXPECT_EQ(refs->file_base(refs->num_files() - 1), 2u);
  EXPECT_EQ(refs->file_base(0), 0u);
  EXPECT_EQ(*EncodeMetadata(refs->ToRecord()), encoded);
}

TEST(MetadataTest, ManyChunksRoundTrip) {
  // 100k chunks in a 2-d grid plus a 1-d split: exercises the tiling fast path and the raw-pointer views.
  MetadataRecord r;
  r.files = {{"data-00000.bin", 0}};
  uint64_t off = 0;
  for (int t = 0; t < 2; ++t) {
    EntryRecord e;
    e.name = "t" + std::to_string(t);
    e.dtype = DType::kF16;
    const uint64_t rows = t == 0 ? 250 : 50000, cols = t == 0 ? 200 : 1;
    e.shape = {rows * 2, cols * 3};
    for (uint64_t i = 0; i < rows; ++i) {
      for (uint64_t j = 0; j < cols; ++j) {
        e.chunk_offsets.insert(e.chunk_offsets.end(), {i * 2, j * 3});
        e.chunk_lengths.insert(e.chunk_lengths.end(), {2, 3});
        e.chunks.push_back({off, 12, i ^ j, 0, kNoBlockTable});
        off += kChunkAlignment;
      }
    }
    r.entries.push_back(std::move(e));
  }
  r.files[0].size = off;
  Result<std::string> buf = EncodeMetadata(r);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  Result<MetadataView> view = ParseString(*buf);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  for (size_t i = 0; i < r.entries.size(); ++i) ExpectEntryMatches(r.entries[i], view->entry(i));
}

// ---- Foreign checkpoints' descriptions (FORMAT.md 2.4) ----

namespace {

// A safetensors-like description: two tensors at unaligned offsets of one file, no checksums.
MetadataRecord ForeignRecord() {
  MetadataRecord r;
  r.writer = "safetensors";
  r.source = "safetensors";
  r.alignment = 1;
  r.files = {{"model.safetensors", 8 + 120 + 24 + 6}};
  EntryRecord a;
  a.name = "a";
  a.dtype = DType::kF32;
  a.shape = {2, 3};
  a.chunk_offsets = {0, 0};
  a.chunk_lengths = {2, 3};
  a.chunks = {ChunkLocation{128, 24, 0, 0, kNoBlockTable}};
  EntryRecord b;
  b.name = "b";
  b.dtype = DType::kF16;
  b.shape = {3};
  b.chunk_offsets = {0};
  b.chunk_lengths = {3};
  b.chunks = {ChunkLocation{152, 6, 0, 0, kNoBlockTable}};
  r.entries = {b, a};
  return r;
}

}  // namespace

TEST(MetadataTest, ForeignDescriptionParsesOnlyAsForeign) {
  Result<std::string> buf = EncodeMetadata(ForeignRecord());
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  auto shared = Share(*buf);
  Result<MetadataView> view = MetadataView::ParseForeign(shared, "ckpt");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->source(), "safetensors");
  EXPECT_FALSE(view->checksummed());
  EXPECT_EQ(view->alignment(), 1u);
  EXPECT_EQ(view->entry(1).chunk(0).offset, 152u);  // unaligned, kept
  EXPECT_EQ(view->ToRecord().source, "safetensors");
  // The same bytes as a file: refused, so that no metadata file can turn verification off.
  Result<MetadataView> as_file = ParseString(*buf);
  ASSERT_FALSE(as_file.ok());
  EXPECT_EQ(as_file.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(as_file.status().message().find("source"), std::string::npos) << as_file.status().ToString();
  // A distckpt record is not a foreign one, and its files keep their checksums.
  Result<std::string> native = EncodeMetadata(ValidRecord());
  ASSERT_TRUE(native.ok());
  Result<MetadataView> parsed = ParseString(*native);
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->checksummed());
  EXPECT_FALSE(MetadataView::ParseForeign(Share(*native), "ckpt").ok());
}

TEST(MetadataTest, ForeignDescriptionRefusesChecksumsAndBadBounds) {
  MetadataRecord r = ForeignRecord();
  r.entries[0].chunks[0].checksum = 5;
  EXPECT_FALSE(EncodeMetadata(r).ok());
  r = ForeignRecord();
  r.entries[0].chunks[0].offset = 155;  // runs past the end of the file
  Result<std::string> bad = EncodeMetadata(r);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("exceeds the size"), std::string::npos) << bad.status().ToString();
  r = ForeignRecord();
  r.alignment = 3;
  EXPECT_FALSE(EncodeMetadata(r).ok());
}

}  // namespace
}  // namespace distckpt

namespace distckpt {
namespace {

using testing_util::RawMetadata;
using testing_util::ToRaw;

// ValidRecord with two compressed chunks: "big" (3 blocks, the last stored raw) and chunk #1 of "two_big".
MetadataRecord CompressedRecord() {
  MetadataRecord r = ValidRecord();
  testing_util::CompressSomeChunks(&r);
  return r;
}

RawEntry& Named(RawMetadata& m, const char* name) {
  for (RawEntry& e : m.entries) {
    if (e.name && *e.name == name) return e;
  }
  std::abort();
}

TEST(MetadataTest, CompressedChunksRoundTripAsFormat3) {
  const MetadataRecord r = CompressedRecord();
  const std::string encoded = *EncodeMetadata(r);
  Result<MetadataView> v = ParseString(encoded);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->format_major(), kFormatMajorCompression);
  EXPECT_EQ(v->format_minor(), kFormatMinorCompression);
  const EntryView big = v->entry(*v->Find("big"));
  ASSERT_TRUE(big.compressed(0));
  EXPECT_EQ(big.coding(0).stored_length, 6808u);
  ASSERT_EQ(big.stored(0).size(), 3u);
  EXPECT_EQ(big.stored(0)[2].size, 3808u);
  const EntryView two = v->entry(*v->Find("two_big"));
  EXPECT_FALSE(two.compressed(0));
  EXPECT_TRUE(two.stored(0).empty());
  ASSERT_EQ(two.stored(1).size(), 2u);
  EXPECT_EQ(two.stored(1)[0].checksum, 0x61u);
  const EntryView bias = v->entry(*v->Find("a.bias"));
  EXPECT_FALSE(bias.compressed(0));
  EXPECT_EQ(bias.coding(0).stored_length, bias.chunk(0).length);
  EXPECT_EQ(*EncodeMetadata(v->ToRecord()), encoded);
  // Codings that are all raw are dropped: the file stays 1.x.
  MetadataRecord raw = ValidRecord();
  raw.entries[0].codings = {ChunkCoding{raw.entries[0].chunks[0].length, kNoBlockTable, Codec::kRaw, {0, 0, 0}}};
  Result<MetadataView> plain = ParseString(*EncodeMetadata(raw));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->format_major(), kFormatMajor);
  EXPECT_TRUE(plain->entry(0).codings.empty());
}

TEST(MetadataTest, RejectsEveryHostileCoding) {
  struct Case {
    const char* what;
    std::function<void(RawMetadata&)> damage;
    StatusCode code;
    const char* needle;
  };
  const StatusCode kCorrupt = StatusCode::kCorrupt;
  const std::vector<Case> cases = {
      {"codings in 2.0", [](RawMetadata& m) { m.format_major = 2; }, kCorrupt, "only format 3.0 may"},
      {"codings in 1.2", [](RawMetadata& m) { m.format_major = 1, m.format_minor = 2; }, kCorrupt, "only format 3.0"},
      {"one coding short", [](RawMetadata& m) { Named(m, "two_big").codings.pop_back(); }, kCorrupt,
       "1 chunk codings for 2 chunks"},
      {"unknown codec", [](RawMetadata& m) { Named(m, "big").codings[0].codec = static_cast<Codec>(7); }, kCorrupt,
       "unknown codec 7"},
      {"unknown codec, newer minor",
       [](RawMetadata& m) { m.format_minor = 5, Named(m, "big").codings[0].codec = static_cast<Codec>(7); },
       StatusCode::kVersion, "upgrade distckpt"},
      {"raw with blocks", [](RawMetadata& m) { Named(m, "two_big").codings[0].first_stored = 0; }, kCorrupt,
       "stored raw but"},
      {"raw of another length", [](RawMetadata& m) { Named(m, "two_big").codings[0].stored_length = 4999; }, kCorrupt,
       "stored raw but"},
      {"blocks out of range", [](RawMetadata& m) { Named(m, "big").codings[0].first_stored = 1; }, kCorrupt,
       "out of range or out of order"},
      {"blocks missing", [](RawMetadata& m) { Named(m, "big").stored_blocks.pop_back(); }, kCorrupt,
       "out of range or out of order"},
      {"a block too many",
       [](RawMetadata& m) {
         Named(m, "big").stored_blocks.push_back({1, 1});
       },
       kCorrupt, "1 stored blocks that no compressed chunk uses"},
      {"block larger than it decodes to", [](RawMetadata& m) { Named(m, "big").stored_blocks[0].size = 4097; },
       kCorrupt, "stored block #0 is 4097 bytes for 4096"},
      {"last block larger", [](RawMetadata& m) { Named(m, "big").stored_blocks[2].size = 3809; }, kCorrupt,
       "stored block #2 is 3809 bytes for 3808"},
      {"empty block", [](RawMetadata& m) { Named(m, "big").stored_blocks[1].size = 0; }, kCorrupt,
       "stored block #1 is 0 bytes"},
      {"huge block (sum would overflow)",
       [](RawMetadata& m) { Named(m, "big").stored_blocks[1].size = UINT64_MAX - 500; }, kCorrupt, "stored block #1"},
      {"stored length disagrees", [](RawMetadata& m) { Named(m, "big").codings[0].stored_length = 6807; }, kCorrupt,
       "stored length 6807 is not the 6808 bytes"},
      {"empty chunk compressed",
       [](RawMetadata& m) {
         RawEntry& e = Named(m, "empty_blob");
         e.codings = {ChunkCoding{0, 0, Codec::kZstdGrouped, {0, 0, 0}}};
       },
       kCorrupt, "is empty but marked compressed"},
      {"stored extent past the file",
       [](RawMetadata& m) {
         RawEntry& e = Named(m, "big");
         m.files[e.chunks[0].file].size = e.chunks[0].offset + 6807;
       },
       kCorrupt, "stored length 6808 exceeds the size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    RawMetadata m = ToRaw(CompressedRecord());
    c.damage(m);
    Result<MetadataView> view = ParseString(RawEncode(m));
    ASSERT_FALSE(view.ok());
    EXPECT_EQ(view.status().code(), c.code) << view.status().ToString();
    EXPECT_NE(view.status().message().find(c.needle), std::string::npos) << view.status().ToString();
  }
}

}  // namespace
}  // namespace distckpt
