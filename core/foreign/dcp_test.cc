// Tests of DescribeTorchDcp and ParseDcpMetadata: the checkpoints the real torch.distributed.checkpoint wrote
// (tests/fixtures/dcp), read in place and compared, tensor by tensor, with the hashes of what torch's own dcp.load
// assembles; what must be refused (dtypes, strides, transforms, layouts, hostile or damaged metadata, chunks that do
// not tile), each naming the checkpoint, the file and the entry; and every byte of a real .metadata flipped or
// truncated.
#include "core/foreign/dcp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/base/box.h"
#include "core/base/testing/read_file.h"
#include "core/base/testing/status_matchers.h"
#include "core/foreign/testing/dcp_fixtures.h"
#include "core/foreign/testing/sha256.h"
#include "core/foreign/torch_save.h"

namespace distckpt {
namespace {

using testing_util::DcpExpectedRows;
using testing_util::DcpFixtureDir;
using testing_util::ReadFileToString;
using testing_util::Sha256Hex;

const EntryRecord* FindEntry(const MetadataRecord& r, const std::string& name) {
  for (const EntryRecord& e : r.entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string FindUser(const MetadataRecord& r, const std::string& key) {
  for (const auto& kv : r.user) {
    if (kv.first == key) return kv.second;
  }
  return "";
}

std::vector<uint64_t> ParseShape(const std::string& s) {
  std::vector<uint64_t> out;
  size_t start = 0;
  while (start < s.size()) {
    const size_t comma = s.find(',', start);
    out.push_back(std::stoull(s.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Reads the file bytes each location names (through the storage) and assembles the full tensor in C order.
std::string AssembleTensor(Storage* storage, const std::string& dir, const MetadataRecord& r, const EntryRecord& e) {
  const uint64_t itemsize = DTypeSize(e.dtype);
  uint64_t volume = 1;
  for (uint64_t s : e.shape) volume *= s;
  std::string full(volume * itemsize, '\0');
  const size_t ndim = e.shape.size();
  std::vector<char> covered(volume, 0);
  for (size_t c = 0; c < e.chunks.size(); ++c) {
    const ChunkLocation& loc = e.chunks[c];
    auto file = storage->OpenFile(dir + "/" + r.files[loc.file].name);
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    if (!file.ok()) return "";
    std::string bytes(loc.length, '\0');
    EXPECT_TRUE((*file)->ReadAt(loc.offset, bytes.data(), bytes.size()).ok());
    const uint64_t* off = e.chunk_offsets.data() + c * ndim;
    const uint64_t* len = e.chunk_lengths.data() + c * ndim;
    // Walk the chunk's elements in C order; each lands at its global C-order index.
    std::vector<uint64_t> idx(ndim, 0);
    uint64_t n = 1;
    for (size_t d = 0; d < ndim; ++d) n *= len[d];
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t g = 0;
      for (size_t d = 0; d < ndim; ++d) g = g * e.shape[d] + off[d] + idx[d];
      std::memcpy(&full[g * itemsize], &bytes[k * itemsize], itemsize);
      covered[g]++;
      for (size_t d = ndim; d-- > 0;) {
        if (++idx[d] < len[d]) break;
        idx[d] = 0;
      }
    }
  }
  for (uint64_t g = 0; g < volume; ++g) EXPECT_EQ(covered[g], 1) << e.name << " element " << g;
  return full;
}

// Checks a description against expected.tsv: every tensor's bytes (read at the chunk locations) hash to what torch's
// dcp.load gave, every bytes entry's blob to what the item holds; files, version and planner_data match.
void CheckAgainstExpected(Storage* storage, const std::string& ck, const std::string& dir, const MetadataRecord& r) {
  size_t entries = 0, files = 0;
  const std::string planner = FindUser(r, "torch_dcp.planner_data");
  for (const auto& row : DcpExpectedRows()) {
    if (row[1] != ck) continue;
    if (row[0] == "file") {
      ++files;
      bool found = false;
      for (const DataFileRecord& f : r.files) found = found || (f.name == row[2] && f.size == std::stoull(row[3]));
      EXPECT_TRUE(found) << row[2];
    } else if (row[0] == "version") {
      EXPECT_EQ(FindUser(r, "torch_dcp.version"), row[2]);
    } else if (row[0] == "tensor") {
      ++entries;
      SCOPED_TRACE(ck + " tensor " + row[2]);
      const EntryRecord* e = FindEntry(r, row[2]);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->kind, EntryKind::kTensor);
      EXPECT_EQ(e->dtype, DTypeFromTorchName(row[3]));
      EXPECT_EQ(e->shape, ParseShape(row[4]));
      EXPECT_LE(e->chunks.size(), std::stoull(row[5]));  // empty DCP chunks are left out
      EXPECT_EQ(Sha256Hex(AssembleTensor(storage, dir, r, *e)), row[6]);
    } else if (row[0] == "bytes") {
      ++entries;
      SCOPED_TRACE(ck + " bytes " + row[2]);
      const EntryRecord* e = FindEntry(r, row[2]);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(e->kind, EntryKind::kBytes);
      ASSERT_EQ(e->chunks.size(), 1u);
      EXPECT_EQ(e->chunks[0].length, std::stoull(row[3]));
      const std::string data = ReadFileToString(dir + "/" + r.files[e->chunks[0].file].name);
      EXPECT_EQ(Sha256Hex(data.substr(e->chunks[0].offset, e->chunks[0].length)), row[4]);
    } else if (row[0] == "planner") {
      // The generator wrote json.dumps(keys); the description's JSON uses the same separators.
      EXPECT_NE(planner.find("\"" + row[2] + "\": " + row[3]), std::string::npos) << row[2];
    }
  }
  EXPECT_EQ(r.entries.size(), entries);
  EXPECT_EQ(r.files.size(), files);
}

// The description encoded as distckpt metadata and parsed back the way a reader does (MetadataView::ParseForeign),
// then copied out again: what the reader would see.
MetadataRecord ThroughView(const MetadataRecord& r) {
  Result<std::string> encoded = EncodeMetadata(r);
  EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
  if (!encoded.ok()) return {};
  auto buffer = std::make_shared<const std::string>(std::move(encoded).value());
  Result<MetadataView> view = MetadataView::ParseForeign(buffer, "description");
  EXPECT_TRUE(view.ok()) << view.status().ToString();
  if (!view.ok()) return {};
  EXPECT_EQ(view->source(), kDcpSource);
  EXPECT_FALSE(view->checksummed());
  // The same bytes as a metadata file: refused, so no file can switch verification off.
  EXPECT_TRUE(StatusIs(MetadataView::Parse(buffer, "file").status(), StatusCode::kCorrupt, {"source"}));
  return view->ToRecord();
}

TEST(DcpTest, DescribesWhatTorchWroteAsTorchLoadsIt) {
  std::unique_ptr<Storage> posix = NewPosixStorage();
  for (const char* ck :
       {"fsdp2_2ranks", "fsdp2_3ranks", "single_dtensor", "dtensor_2ranks", "torch24_dtensor_2ranks"}) {
    SCOPED_TRACE(ck);
    const std::string dir = testing_util::RealCopyOfDcpFixture(ck);
    DCKPT_ASSERT_OK_AND_ASSIGN(MetadataRecord r, DescribeTorchDcp(posix.get(), dir));
    EXPECT_EQ(r.writer, kDcpWriter);
    EXPECT_EQ(r.source, kDcpSource);
    EXPECT_EQ(r.alignment, 1u);
    EXPECT_TRUE(r.structure.empty());
    for (const EntryRecord& e : r.entries) {
      for (const ChunkLocation& c : e.chunks) {
        EXPECT_EQ(c.checksum, 0u);
        EXPECT_EQ(c.first_block, kNoBlockTable);
        EXPECT_LE(c.offset + c.length, r.files[c.file].size);
      }
    }
    CheckAgainstExpected(posix.get(), ck, dir, r);
    // And as distckpt's reader sees it, after encoding and parsing.
    const MetadataRecord seen = ThroughView(r);
    EXPECT_EQ(seen.source, kDcpSource);
    CheckAgainstExpected(posix.get(), ck, dir, seen);
  }
}

TEST(DcpTest, ShardedFixturesHaveTheExpectedShape) {
  std::unique_ptr<Storage> posix = NewPosixStorage();
  DCKPT_ASSERT_OK_AND_ASSIGN(MetadataRecord r,
                             DescribeTorchDcp(posix.get(), testing_util::RealCopyOfDcpFixture("fsdp2_3ranks")));
  ASSERT_EQ(r.files.size(), 3u);
  const EntryRecord* emb = FindEntry(r, "model.emb.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kBF16);
  EXPECT_EQ(emb->chunks.size(), 3u);  // 10 rows over 3 ranks: 4, 4, 2
  const EntryRecord* head = FindEntry(r, "model.head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->chunks.size(), 2u);  // 2 rows over 3 ranks: the third rank's empty shard holds nothing
  const EntryRecord* step = FindEntry(r, "optim.state.fc1.weight.step");
  ASSERT_NE(step, nullptr);
  EXPECT_TRUE(step->shape.empty());  // 0-d, saved once although every rank holds it
  EXPECT_EQ(step->chunks.size(), 1u);
  const EntryRecord* note = FindEntry(r, "note");
  ASSERT_NE(note, nullptr);
  EXPECT_EQ(note->kind, EntryKind::kBytes);
  EXPECT_FALSE(FindUser(r, "torch_dcp.save_id").empty());
}

TEST(DcpTest, RefusesWhatItCannotReadInPlaceNamingTheEntry) {
  std::unique_ptr<Storage> posix = NewPosixStorage();
  const std::string transposed = testing_util::RealCopyOfDcpFixture("transposed");
  EXPECT_TRUE(StatusIs(DescribeTorchDcp(posix.get(), transposed).status(), StatusCode::kUnsupported,
                       {transposed + "/__0_0.distcp", "entry 't'", "strides (1, 4)"}));
  const std::string f8 = testing_util::RealCopyOfDcpFixture("unsupported_dtype");
  EXPECT_TRUE(StatusIs(DescribeTorchDcp(posix.get(), f8).status(), StatusCode::kUnsupported,
                       {f8, "entry 'f8'", "float8_e4m3fnuz"}));
}

// ---- Checkpoints in memory
// --------------------------------------------------------------------------------------------

// A fixture copied into a memory storage at /ckpt, so tests can change or remove its files.
std::unique_ptr<Storage> CopyToMemory(const std::string& fixture, const std::string& dir = "/ckpt") {
  std::unique_ptr<Storage> mem = NewMemoryStorage();
  EXPECT_TRUE(mem->CreateDir(dir).ok());
  const std::string src = DcpFixtureDir(fixture);
  std::unique_ptr<Storage> posix = NewPosixStorage();
  auto names = posix->ListDir(src);
  EXPECT_TRUE(names.ok());
  for (const std::string& n : *names) {
    EXPECT_TRUE(mem->WriteFileDurably(dir + "/" + n, ReadFileToString(src + "/" + n)).ok());
  }
  return mem;
}

TEST(DcpTest, MissingDirectoryMetadataOrDataFile) {
  std::unique_ptr<Storage> mem = NewMemoryStorage();
  EXPECT_TRUE(StatusIs(DescribeTorchDcp(mem.get(), "/nowhere").status(), StatusCode::kNotFound, {"'/nowhere'"}));
  DCKPT_ASSERT_OK(mem->CreateDir("/empty"));
  EXPECT_TRUE(
      StatusIs(DescribeTorchDcp(mem.get(), "/empty").status(), StatusCode::kNotFound, {"'/empty'", ".metadata"}));
  std::unique_ptr<Storage> ck = CopyToMemory("fsdp2_2ranks");
  DCKPT_ASSERT_OK(ck->RemoveAll("/ckpt/__1_0.distcp"));
  EXPECT_TRUE(
      StatusIs(DescribeTorchDcp(ck.get(), "/ckpt").status(), StatusCode::kNotFound, {"'/ckpt'", "__1_0.distcp"}));
}

TEST(DcpTest, TruncatedDataFileIsCorruptNamingFileAndEntry) {
  std::unique_ptr<Storage> ck = CopyToMemory("single_dtensor");
  const std::string data = ReadFileToString(DcpFixtureDir("single_dtensor") + "/__0_0.distcp");
  DCKPT_ASSERT_OK(ck->WriteFileDurably("/ckpt/__0_0.distcp", data.substr(0, data.size() / 2)));
  EXPECT_TRUE(StatusIs(DescribeTorchDcp(ck.get(), "/ckpt").status(), StatusCode::kCorrupt,
                       {"/ckpt/__0_0.distcp", "entry '", "truncated"}));
}

TEST(DcpTest, HostileMetadataRunsNothing) {
  std::unique_ptr<Storage> ck = CopyToMemory("single_dtensor");
  DCKPT_ASSERT_OK(ck->WriteFileDurably("/ckpt/.metadata", "cposix\nsystem\n(X\x05\x00\x00\x00touchtR."));
  EXPECT_TRUE(StatusIs(DescribeTorchDcp(ck.get(), "/ckpt").status(), StatusCode::kCorrupt,
                       {"'/ckpt/.metadata'", "posix.system"}));
  // A relative_path that leaves the directory, made from the real file by renaming its data file in place.
  std::string meta = ReadFileToString(DcpFixtureDir("single_dtensor") + "/.metadata");
  const std::string name = "__0_0.distcp";
  ASSERT_NE(meta.find(name), std::string::npos);
  meta.replace(meta.find(name), name.size(), "../0_0.distc");
  DCKPT_ASSERT_OK(ck->WriteFileDurably("/ckpt/.metadata", meta));
  EXPECT_TRUE(StatusIs(DescribeTorchDcp(ck.get(), "/ckpt").status(), StatusCode::kCorrupt,
                       {"'/ckpt/.metadata'", "'../0_0.distc'", "not a data file inside the checkpoint"}));
}

// Checks what a description says about its files: every chunk inside its file, lengths that fit the dtype.
void CheckConsistent(const MetadataRecord& r) {
  for (const EntryRecord& e : r.entries) {
    const uint64_t itemsize = DTypeSize(e.dtype);
    ASSERT_GT(itemsize, 0u) << e.name;
    ASSERT_EQ(e.chunk_offsets.size(), e.chunks.size() * e.shape.size());
    for (size_t c = 0; c < e.chunks.size(); ++c) {
      const ChunkLocation& loc = e.chunks[c];
      ASSERT_LT(loc.file, r.files.size());
      ASSERT_LE(loc.offset, r.files[loc.file].size);
      ASSERT_LE(loc.length, r.files[loc.file].size - loc.offset);
      uint64_t volume = itemsize;
      for (size_t d = 0; d < e.shape.size(); ++d) volume *= e.chunk_lengths[c * e.shape.size() + d];
      ASSERT_EQ(loc.length, volume) << e.name;
    }
  }
}

TEST(DcpTest, EveryByteOfARealMetadataFlippedOrTruncated) {
  const std::string fixture = "fsdp2_2ranks";
  const std::string meta = ReadFileToString(DcpFixtureDir(fixture) + "/.metadata");
  ASSERT_GT(meta.size(), 1000u);
  std::unique_ptr<Storage> ck = CopyToMemory(fixture);
  size_t still_valid = 0, refused = 0;
  auto check = [&](const std::string& m, const std::string& what) {
    DCKPT_ASSERT_OK(ck->WriteFileDurably("/ckpt/.metadata", m));
    Result<MetadataRecord> r = DescribeTorchDcp(ck.get(), "/ckpt");
    if (r.ok()) {
      ++still_valid;
      CheckConsistent(*r);
      // Whatever is described, the format takes: it encodes and parses as a foreign description.
      Result<std::string> encoded = EncodeMetadata(*r);
      ASSERT_TRUE(encoded.ok()) << what << ": " << encoded.status().ToString();
      ASSERT_TRUE(
          MetadataView::ParseForeign(std::make_shared<const std::string>(std::move(encoded).value()), what).ok());
      return;
    }
    ++refused;
    const StatusCode code = r.status().code();
    ASSERT_TRUE(code == StatusCode::kCorrupt || code == StatusCode::kUnsupported || code == StatusCode::kNotFound)
        << what << ": " << r.status().ToString();
    ASSERT_NE(r.status().message().find("/ckpt"), std::string::npos) << what << ": " << r.status().ToString();
  };
  for (size_t i = 0; i < meta.size(); ++i) {
    std::string m = meta;
    m[i] = static_cast<char>(m[i] ^ 0xff);
    check(m, "byte " + std::to_string(i) + " flipped");
    m = meta;
    m[i] = static_cast<char>(m[i] ^ 0x01);
    check(m, "bit 0 of byte " + std::to_string(i) + " flipped");
  }
  for (size_t n = 0; n < meta.size(); ++n) {
    std::string m = meta.substr(0, n);
    DCKPT_ASSERT_OK(ck->WriteFileDurably("/ckpt/.metadata", m));
    Result<MetadataRecord> r = DescribeTorchDcp(ck.get(), "/ckpt");
    ASSERT_FALSE(r.ok()) << "truncated to " << n;
    ASSERT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().ToString();
  }
  EXPECT_GT(refused, meta.size());
  EXPECT_GT(still_valid, 0u);  // flips inside names and numbers can leave a valid checkpoint
}

// ---- Metadata written here ------------------------------------------------------------------------------------------
// A writer of DCP metadata pickles in the shape DCP gives them (protocol 2 opcodes), to reach what torch would not
// write: overlapping chunks, transforms, sparse layouts, shared objects.

void LE(std::string* s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s->push_back(static_cast<char>(v >> (8 * i)));
}
std::string G(const std::string& m, const std::string& n) { return "c" + m + "\n" + n + "\n"; }
std::string U(const std::string& s) {
  std::string b = "X";
  LE(&b, s.size(), 4);
  return b + s;
}
std::string I(uint64_t v) {
  std::string b = "\x8a\x08";
  LE(&b, v, 8);
  return b;
}
const char kMeta[] = "torch.distributed.checkpoint.metadata";
std::string Obj(const std::string& module, const std::string& cls, const std::string& state) {
  return G(module, cls) + ")\x81" + (state.empty() ? "" : state + "b");
}
std::string Dict(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string b = "}(";
  for (const auto& [k, v] : kv) b += k + v;
  return b + "u";
}
std::string Size(const std::vector<uint64_t>& v) {
  std::string b = G("torch", "Size") + "(";
  for (uint64_t x : v) b += I(x);
  return b + "t\x85R";
}
std::string Props(const std::string& dtype, const std::string& layout = "torch.strided") {
  const std::string mem = G(kMeta, "_MEM_FORMAT_ENCODING") + "K\x00\x85R";
  return Obj(kMeta, "TensorProperties",
             "(" + G("torch", dtype) + G("torch.serialization", "_get_layout") + U(layout) + "\x85R" + "\x89" + mem +
                 "\x89" + ")t");
}
std::string Chunk(const std::vector<uint64_t>& off, const std::vector<uint64_t>& size) {
  return Obj(kMeta, "ChunkStorageMetadata", Dict({{U("offsets"), Size(off)}, {U("sizes"), Size(size)}}));
}
struct SynthChunk {
  std::vector<uint64_t> offsets, sizes;
};
std::string Tensor(const std::string& dtype, const std::vector<uint64_t>& shape, const std::vector<SynthChunk>& chunks,
                   const std::string& layout = "torch.strided") {
  std::string list = "](";
  for (const SynthChunk& c : chunks) list += Chunk(c.offsets, c.sizes);
  list += "e";
  return Obj(kMeta, "TensorStorageMetadata",
             Dict({{U("properties"), Props(dtype, layout)}, {U("size"), Size(shape)}, {U("chunks"), list}}));
}
std::string Index(const std::string& fqn, const std::vector<uint64_t>* offsets) {
  std::vector<std::pair<std::string, std::string>> kv = {{U("fqn"), U(fqn)}};
  if (offsets) kv.push_back({U("offset"), Size(*offsets)});
  return Obj(kMeta, "MetadataIndex", Dict(kv));
}
std::string Info(const std::string& file, uint64_t offset, uint64_t length, const std::string& transforms = "") {
  std::vector<std::pair<std::string, std::string>> kv = {
      {U("relative_path"), U(file)}, {U("offset"), I(offset)}, {U("length"), I(length)}};
  if (!transforms.empty()) kv.push_back({U("transform_descriptors"), "]" + U(transforms) + "a"});
  return Obj("torch.distributed.checkpoint.filesystem", "_StorageInfo", Dict(kv));
}
std::string MetadataPickle(const std::string& sdm, const std::string& storage) {
  return "\x80\x02" +
         Obj(kMeta, "Metadata",
             Dict({{U("state_dict_metadata"), sdm}, {U("storage_data"), storage}, {U("version"), U("1.0.0")}})) +
         ".";
}

// The single_dtensor fixture's "dtensor" item: a [6, 4] float32 torch.save archive. Synthetic metadata point at it.
struct RealTensorItem {
  uint64_t offset = 0, length = 0;
};
RealTensorItem DtensorItem() {
  const std::string dir = DcpFixtureDir("single_dtensor");
  Result<DcpMetadata> md = ParseDcpMetadata(ReadFileToString(dir + "/.metadata"), dir);
  EXPECT_TRUE(md.ok());
  for (const DcpEntry& e : md->entries) {
    if (e.fqn == "dtensor") return {md->items[e.chunks[0].item].offset, md->items[e.chunks[0].item].length};
  }
  ADD_FAILURE() << "no dtensor entry";
  return {};
}

class SynthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ck_ = CopyToMemory("single_dtensor");
    item_ = DtensorItem();
  }
  // state_dict_metadata with one tensor "w" of `shape` whose chunks all point at the [6, 4] item.
  Result<MetadataRecord> Describe(const std::string& meta) {
    EXPECT_TRUE(ck_->WriteFileDurably("/ckpt/.metadata", meta).ok());
    return DescribeTorchDcp(ck_.get(), "/ckpt");
  }
  std::string OneTensor(const std::vector<uint64_t>& shape, const std::vector<SynthChunk>& chunks,
                        const std::string& dtype = "float32", const std::string& layout = "torch.strided",
                        const std::string& transforms = "") {
    std::string storage = "}(";
    for (const SynthChunk& c : chunks)
      storage += Index("w", &c.offsets) + Info("__0_0.distcp", item_.offset, item_.length, transforms);
    storage += "u";
    return MetadataPickle(Dict({{U("w"), Tensor(dtype, shape, chunks, layout)}}), storage);
  }
  std::unique_ptr<Storage> ck_;
  RealTensorItem item_;
};

TEST_F(SynthTest, TwoChunksOfOneItemTile) {
  DCKPT_ASSERT_OK_AND_ASSIGN(MetadataRecord r, Describe(OneTensor({12, 4}, {{{0, 0}, {6, 4}}, {{6, 0}, {6, 4}}})));
  ASSERT_EQ(r.entries.size(), 1u);
  ASSERT_EQ(r.entries[0].chunks.size(), 2u);
  EXPECT_EQ(r.entries[0].chunks[0].offset, r.entries[0].chunks[1].offset);
  EXPECT_EQ(r.entries[0].chunks[0].length, 96u);
  EXPECT_EQ(FindUser(r, "torch_dcp.version"), "1.0.0");
  EXPECT_EQ(ThroughView(r).entries.size(), 1u);
}

TEST_F(SynthTest, ChunksThatDoNotTileAreNamed) {
  EXPECT_TRUE(StatusIs(Describe(OneTensor({10, 4}, {{{0, 0}, {6, 4}}, {{4, 0}, {6, 4}}})).status(),
                       StatusCode::kCorrupt, {"'/ckpt'", "entry 'w'", "do not tile"}));  // overlap
  EXPECT_TRUE(StatusIs(Describe(OneTensor({14, 4}, {{{0, 0}, {6, 4}}, {{8, 0}, {6, 4}}})).status(),
                       StatusCode::kCorrupt, {"entry 'w'", "do not tile"}));  // hole
  EXPECT_TRUE(StatusIs(Describe(OneTensor({6, 4}, {{{1, 0}, {6, 4}}})).status(), StatusCode::kCorrupt,
                       {"'/ckpt/.metadata'", "entry 'w' chunk #0", "outside the tensor"}));
}

TEST_F(SynthTest, ItemThatDisagreesWithTheMetadata) {
  EXPECT_TRUE(StatusIs(Describe(OneTensor({6, 4}, {{{0, 0}, {6, 4}}}, "bfloat16")).status(), StatusCode::kCorrupt,
                       {"/ckpt/__0_0.distcp", "entry 'w'", "float32", "bfloat16"}));
  EXPECT_TRUE(StatusIs(Describe(OneTensor({4, 6}, {{{0, 0}, {4, 6}}})).status(), StatusCode::kCorrupt,
                       {"entry 'w'", "size [6, 4]", "[4, 6]"}));
}

TEST_F(SynthTest, TransformsLayoutsDimsAndDtypesAreUnsupported) {
  EXPECT_TRUE(StatusIs(Describe(OneTensor({6, 4}, {{{0, 0}, {6, 4}}}, "float32", "torch.strided", "zstd")).status(),
                       StatusCode::kUnsupported, {"'/ckpt/.metadata'", "entry 'w'", "'zstd'"}));
  EXPECT_TRUE(StatusIs(Describe(OneTensor({6, 4}, {{{0, 0}, {6, 4}}}, "float32", "torch.sparse_coo")).status(),
                       StatusCode::kUnsupported, {"entry 'w'", "torch.sparse_coo"}));
  EXPECT_TRUE(StatusIs(
      Describe(OneTensor({1, 1, 1, 1, 1, 1, 1, 6, 4}, {{{0, 0, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1, 1, 6, 4}}}))
          .status(),
      StatusCode::kUnsupported, {"entry 'w'", "9 dimensions"}));
  EXPECT_TRUE(StatusIs(Describe(OneTensor({6, 4}, {{{0, 0}, {6, 4}}}, "qint8")).status(), StatusCode::kUnsupported,
                       {"entry 'w'", "qint8"}));
}

TEST_F(SynthTest, SchemaViolations) {
  const std::vector<uint64_t> origin = {0, 0};
  const std::string tensor = Tensor("float32", {6, 4}, {{{0, 0}, {6, 4}}});
  const std::string info = Info("__0_0.distcp", item_.offset, item_.length);
  // A chunk without storage_data.
  EXPECT_TRUE(StatusIs(Describe(MetadataPickle(Dict({{U("w"), tensor}}), "}")).status(), StatusCode::kCorrupt,
                       {"'/ckpt/.metadata'", "entry 'w' chunk #0", "no storage_data"}));
  // storage_data for an FQN that does not exist; the same chunk twice.
  EXPECT_TRUE(StatusIs(Describe(MetadataPickle(Dict({{U("w"), tensor}}),
                                               Dict({{Index("w", &origin), info}, {Index("v", &origin), info}})))
                           .status(),
                       StatusCode::kCorrupt, {"entry 'v'", "no such entry"}));
  EXPECT_TRUE(StatusIs(Describe(MetadataPickle(Dict({{U("w"), tensor}}),
                                               Dict({{Index("w", &origin), info}, {Index("w", &origin), info}})))
                           .status(),
                       StatusCode::kCorrupt, {"entry 'w'", "given twice"}));
  // The same FQN twice.
  EXPECT_TRUE(
      StatusIs(Describe(MetadataPickle(Dict({{U("w"), tensor}, {U("w"), tensor}}), Dict({{Index("w", &origin), info}})))
                   .status(),
               StatusCode::kCorrupt, {"'w' appears twice"}));
  // A bytes item whose range lies past its file.
  const std::string bytes = Obj(kMeta, "BytesStorageMetadata", "");
  EXPECT_TRUE(StatusIs(Describe(MetadataPickle(Dict({{U("b"), bytes}}),
                                               Dict({{Index("b", nullptr), Info("__0_0.distcp", 1 << 20, 10)}})))
                           .status(),
                       StatusCode::kCorrupt, {"/ckpt/__0_0.distcp", "entry 'b'", "truncated"}));
  // A bytes item, fine.
  DCKPT_ASSERT_OK_AND_ASSIGN(
      MetadataRecord r,
      Describe(MetadataPickle(Dict({{U("b"), bytes}}), Dict({{Index("b", nullptr), Info("__0_0.distcp", 5, 10)}}))));
  ASSERT_EQ(r.entries.size(), 1u);
  EXPECT_EQ(r.entries[0].kind, EntryKind::kBytes);
  EXPECT_EQ(r.entries[0].chunks[0].offset, 5u);
  // Wrong types.
  EXPECT_TRUE(StatusIs(Describe(MetadataPickle(U("x"), "}")).status(), StatusCode::kCorrupt,
                       {"state_dict_metadata is a string"}));
  EXPECT_TRUE(StatusIs(Describe(MetadataPickle(Dict({{U("w"), U("x")}}), "}")).status(), StatusCode::kCorrupt,
                       {"entry 'w'", "TensorStorageMetadata"}));
  EXPECT_TRUE(
      StatusIs(Describe("\x80\x02" + U("x") + ".").status(), StatusCode::kCorrupt, {"the pickled object is a string"}));
}

TEST_F(SynthTest, SharedObjectsCannotMultiplyTheWork) {
  // One TensorStorageMetadata of 2000 chunks, memoized once and named by 4000 FQNs (2 bytes of BINGET each).
  std::vector<SynthChunk> chunks;
  for (uint64_t i = 0; i < 2000; ++i) chunks.push_back({{i, 0}, {1, 4}});
  std::string sdm = "}(" + U("w0") + Tensor("float32", {2000, 4}, chunks) + "r";
  LE(&sdm, 1, 4);  // LONG_BINPUT 1
  for (int i = 1; i < 4000; ++i) sdm += U("w" + std::to_string(i)) + "j" + std::string("\x01\x00\x00\x00", 4);
  sdm += "u";
  EXPECT_TRUE(StatusIs(Describe(MetadataPickle(sdm, "}")).status(), StatusCode::kCorrupt,
                       {"'/ckpt/.metadata'", "more work than its size allows"}));
}

TEST_F(SynthTest, ReadsOfItemStructuresAreBoundedByTheMetadataSize) {
  // 1000 chunks of one tensor that all name the same real item: legitimate in form (they tile), but 1.5 MB of item
  // reads for metadata that claims to be 0 bytes.
  DcpMetadata md;
  md.items.push_back({"__0_0.distcp", item_.offset, item_.length});
  DcpEntry e;
  e.fqn = "w";
  e.torch_dtype = "float32";
  e.shape = {6000, 4};
  for (uint64_t i = 0; i < 1000; ++i) e.chunks.push_back({{6 * i, 0}, {6, 4}, 0});
  md.entries.push_back(e);
  const std::string data = ReadFileToString(DcpFixtureDir("single_dtensor") + "/__0_0.distcp");
  struct File : ReadableFile {
    explicit File(const std::string* d) : d_(d) {}
    Status ReadAt(uint64_t offset, void* out, size_t size) const override {
      if (offset > d_->size() || size > d_->size() - offset) return Corrupt("past the end");
      std::memcpy(out, d_->data() + offset, size);
      return OkStatus();
    }
    uint64_t size() const override { return d_->size(); }
    const std::string& path() const override { return path_; }
    const std::string* d_;
    std::string path_ = "f";
  };
  DcpFileOpener open = [&data](const std::string&) -> Result<std::unique_ptr<ReadableFile>> {
    return std::unique_ptr<ReadableFile>(new File(&data));
  };
  EXPECT_TRUE(StatusIs(DescribeDcpMetadata(md, "/synth", open).status(), StatusCode::kCorrupt,
                       {"'/synth'", "entry 'w'", "out of proportion"}));
  md.metadata_bytes = 100000;  // 25 MB of budget: fine
  DCKPT_ASSERT_OK_AND_ASSIGN(MetadataRecord r, DescribeDcpMetadata(md, "/synth", open));
  EXPECT_EQ(r.entries[0].chunks.size(), 1000u);
  // A hand-made DcpMetadata with an item index out of range is refused, not trusted.
  md.entries[0].chunks[0].item = 7;
  EXPECT_TRUE(StatusIs(DescribeDcpMetadata(md, "/synth", open).status(), StatusCode::kInvalidArgument,
                       {"entry 'w'", "item that does not exist"}));
}

}  // namespace
}  // namespace distckpt
