// Tests of the torch.save archive locator: items torch 2.15 wrote (the DCP fixtures, the real zip64 one included),
// archives built here to reach every branch (zip64 records, comments, storage offsets, v3 untyped storages), the
// refusals (compressed, big-endian, strided, conjugate, hostile pickles), and truncation or damage at every byte.
#include "core/foreign/torch_save.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/status_matchers.h"
#include "core/foreign/dcp.h"
#include "core/foreign/testing/dcp_fixtures.h"
#include "core/foreign/testing/sha256.h"

namespace distckpt {
namespace {

using testing_util::DcpExpectedRows;
using testing_util::DcpFixtureDir;
using testing_util::ReadFileToString;

void PutLE(std::string* s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s->push_back(static_cast<char>(v >> (8 * i)));
}

// ---- Archives built here: the layout torch's writer uses (records padded to 64 bytes by a local extra field, data
// descriptors, zip64 end records), with switches for what it does not do.
struct ZipRecord {
  std::string name;
  std::string data;
  uint16_t method = 0;
  uint16_t flags = 0x808;  // data descriptor + UTF-8, as torch writes
  std::string local_name;  // the local header's name where it should differ
};

ZipRecord Rec(std::string name, std::string data) {
  ZipRecord r;
  r.name = std::move(name);
  r.data = std::move(data);
  return r;
}

struct ZipOptions {
  bool zip64_entries = false;   // sizes and offsets in zip64 extra fields (as torch does past 4 GiB)
  bool zip64_end = true;        // zip64 end records (torch always writes them)
  bool eocd_sentinels = false;  // the plain end record defers to the zip64 one
  std::string comment;
};

struct Zip {
  std::string bytes;
  std::map<std::string, uint64_t> data_offset;
};

Zip BuildZip(const std::vector<ZipRecord>& records, const ZipOptions& o = {}) {
  Zip z;
  std::string& b = z.bytes;
  std::vector<uint64_t> lho;
  for (const ZipRecord& r : records) {
    lho.push_back(b.size());
    const std::string& name = r.local_name.empty() ? r.name : r.local_name;
    // Pad so the data starts on a 64-byte boundary: an extra field "FB" of the right length.
    uint64_t extra_len = 0;
    const uint64_t start = b.size() + 30 + name.size();
    if (start % 64 != 0) {
      extra_len = 64 - start % 64;
      if (extra_len < 4) extra_len += 64;
    }
    PutLE(&b, 0x04034b50, 4);
    PutLE(&b, 20, 2);
    PutLE(&b, r.flags, 2);
    PutLE(&b, r.method, 2);
    PutLE(&b, 0, 4);  // time, date
    PutLE(&b, 0, 4);  // crc (in the descriptor)
    PutLE(&b, 0, 8);  // sizes (in the descriptor)
    PutLE(&b, name.size(), 2);
    PutLE(&b, extra_len, 2);
    b += name;
    if (extra_len) {
      PutLE(&b, 0x4246, 2);
      PutLE(&b, extra_len - 4, 2);
      b.append(extra_len - 4, 'Z');
    }
    z.data_offset[r.name] = b.size();
    b += r.data;
    PutLE(&b, 0x08074b50, 4);
    PutLE(&b, 0, 4);
    PutLE(&b, r.data.size(), o.zip64_entries ? 8 : 4);
    PutLE(&b, r.data.size(), o.zip64_entries ? 8 : 4);
  }
  const uint64_t cd_offset = b.size();
  for (size_t i = 0; i < records.size(); ++i) {
    const ZipRecord& r = records[i];
    std::string extra;
    if (o.zip64_entries) {
      PutLE(&extra, 0x0001, 2);
      PutLE(&extra, 24, 2);
      PutLE(&extra, r.data.size(), 8);
      PutLE(&extra, r.data.size(), 8);
      PutLE(&extra, lho[i], 8);
    }
    PutLE(&b, 0x02014b50, 4);
    PutLE(&b, 0x031e, 2);
    PutLE(&b, 45, 2);
    PutLE(&b, r.flags, 2);
    PutLE(&b, r.method, 2);
    PutLE(&b, 0, 4);
    PutLE(&b, 0, 4);  // crc: not checked by the locator
    PutLE(&b, o.zip64_entries ? 0xffffffff : r.data.size(), 4);
    PutLE(&b, o.zip64_entries ? 0xffffffff : r.data.size(), 4);
    PutLE(&b, r.name.size(), 2);
    PutLE(&b, extra.size(), 2);
    PutLE(&b, 0, 2);  // comment
    PutLE(&b, 0, 2);  // disk
    PutLE(&b, 0, 2);
    PutLE(&b, 0, 4);
    PutLE(&b, o.zip64_entries ? 0xffffffff : lho[i], 4);
    b += r.name;
    b += extra;
  }
  const uint64_t cd_size = b.size() - cd_offset;
  if (o.zip64_end) {
    const uint64_t z64 = b.size();
    PutLE(&b, 0x06064b50, 4);
    PutLE(&b, 44, 8);
    PutLE(&b, 0x031e, 2);
    PutLE(&b, 45, 2);
    PutLE(&b, 0, 4);
    PutLE(&b, 0, 4);
    PutLE(&b, records.size(), 8);
    PutLE(&b, records.size(), 8);
    PutLE(&b, cd_size, 8);
    PutLE(&b, cd_offset, 8);
    PutLE(&b, 0x07064b50, 4);
    PutLE(&b, 0, 4);
    PutLE(&b, z64, 8);
    PutLE(&b, 1, 4);
  }
  PutLE(&b, 0x06054b50, 4);
  PutLE(&b, 0, 4);
  PutLE(&b, o.eocd_sentinels ? 0xffff : records.size(), 2);
  PutLE(&b, o.eocd_sentinels ? 0xffff : records.size(), 2);
  PutLE(&b, o.eocd_sentinels ? 0xffffffff : cd_size, 4);
  PutLE(&b, o.eocd_sentinels ? 0xffffffff : cd_offset, 4);
  PutLE(&b, o.comment.size(), 2);
  b += o.comment;
  return z;
}

// The data.pkl torch.save writes for a tensor (protocol 2).
struct TensorSpec {
  std::string storage = "FloatStorage";  // "UntypedStorage" for _rebuild_tensor_v3
  std::string v3_dtype;                  // with UntypedStorage
  std::string key = "0";
  uint64_t numel = 6;
  uint64_t offset = 0;
  std::vector<uint64_t> size = {2, 3};
  std::vector<uint64_t> stride = {3, 1};
  std::string metadata_key;  // a 7th/8th argument {key: True}
  std::string root_module = "torch._utils";
};

std::string Global(const std::string& m, const std::string& n) { return "c" + m + "\n" + n + "\n"; }
std::string Uni(const std::string& s) {
  std::string b = "X";
  PutLE(&b, s.size(), 4);
  return b + s;
}
std::string Int(uint64_t v) {
  std::string b = "J";
  PutLE(&b, v, 4);
  return b;
}
std::string IntTuple(const std::vector<uint64_t>& v) {
  std::string b = "(";
  for (uint64_t x : v) b += Int(x);
  return b + "t";
}

std::string TensorPkl(const TensorSpec& t) {
  const bool v3 = !t.v3_dtype.empty();
  std::string b = "\x80\x02";
  b += Global(t.root_module, v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
  b += "(";
  b += "(" + Uni("storage") + Global(t.storage == "UntypedStorage" ? "torch.storage" : "torch", t.storage) +
       Uni(t.key) + Uni("cpu") + Int(t.numel) + "tQ";
  b += Int(t.offset) + IntTuple(t.size) + IntTuple(t.stride) + "\x89";
  b += Global("collections", "OrderedDict") + ")R";
  if (v3) b += Global("torch", t.v3_dtype);
  if (!t.metadata_key.empty()) b += "}" + Uni(t.metadata_key) + "\x88s";
  b += "tR.";
  return b;
}

std::vector<ZipRecord> TorchRecords(const std::string& pkl, const std::string& data, const char* byteorder = "little") {
  std::vector<ZipRecord> r;
  r.push_back(Rec("archive/data.pkl", pkl));
  r.push_back(Rec("archive/.format_version", "1"));
  if (byteorder != nullptr) r.push_back(Rec("archive/byteorder", byteorder));
  r.push_back(Rec("archive/data/0", data));
  r.push_back(Rec("archive/version", "3\n"));
  return r;
}

std::string Floats(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    const float f = static_cast<float>(i) + 0.5f;
    s.append(reinterpret_cast<const char*>(&f), 4);
  }
  return s;
}

Result<TorchSavedTensor> Locate(const std::string& item) { return LocateTorchSavedTensorInMemory(item, "'item'"); }

// ---- Real items -----------------------------------------------------------------------------------------------------

struct RealItem {
  std::string checkpoint, fqn, file;
  DcpItem item;
  std::vector<uint64_t> sizes;
  std::string dtype;
};

// Every non-empty tensor item of a fixture checkpoint, from its metadata.
std::vector<RealItem> RealItems(const std::string& checkpoint) {
  const std::string dir = DcpFixtureDir(checkpoint);
  Result<DcpMetadata> md = ParseDcpMetadata(ReadFileToString(dir + "/.metadata"), dir);
  EXPECT_TRUE(md.ok()) << md.status().ToString();
  std::vector<RealItem> out;
  if (!md.ok()) return out;
  for (const DcpEntry& e : md->entries) {
    for (const DcpChunk& c : e.chunks) {
      bool empty = false;
      for (uint64_t s : c.sizes) empty = empty || s == 0;
      if (!empty)
        out.push_back(
            {checkpoint, e.fqn, dir + "/" + md->items[c.item].file, md->items[c.item], c.sizes, e.torch_dtype});
    }
  }
  return out;
}

TEST(TorchSaveTest, LocatesEveryTensorItemTorchWrote) {
  std::unique_ptr<Storage> posix = NewPosixStorage();
  size_t n = 0;
  for (const char* ck : {"fsdp2_2ranks", "fsdp2_3ranks", "single_dtensor", "dtensor_2ranks"}) {
    for (const RealItem& it : RealItems(ck)) {
      SCOPED_TRACE(it.checkpoint + " " + it.fqn);
      DCKPT_ASSERT_OK_AND_ASSIGN(auto file, posix->OpenFile(it.file));
      DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor t,
                                 LocateTorchSavedTensor(*file, it.item.offset, it.item.length, it.file));
      EXPECT_EQ(t.torch_dtype, it.dtype);
      EXPECT_EQ(t.shape, it.sizes);
      EXPECT_GE(t.data_offset, it.item.offset);
      EXPECT_LE(t.data_offset + t.data_length, it.item.offset + it.item.length);
      uint64_t numel = 1;
      for (uint64_t s : t.shape) numel *= s;
      EXPECT_EQ(t.data_length, numel * DTypeSize(t.dtype));
      // The same archive held in memory gives the same place, relative to the item.
      const std::string item = ReadFileToString(it.file).substr(it.item.offset, it.item.length);
      DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor m, Locate(item));
      EXPECT_EQ(m.data_offset + it.item.offset, t.data_offset);
      ++n;
    }
  }
  EXPECT_GT(n, 100u);
}

TEST(TorchSaveTest, ReadsOnlyTheArchiveStructuresOfARealZip64Item) {
  // A 4 GiB + 4 KiB uint8 tensor that torch 2.15 wrote with zip64 records (kept as its first and last 64 KiB).
  std::unique_ptr<testing_util::SparseFile> file = testing_util::OpenZip64Fixture();
  ASSERT_NE(file, nullptr);
  std::vector<std::string> row;
  for (const auto& r : DcpExpectedRows()) {
    if (r[0] == "zip64") row = r;
  }
  ASSERT_EQ(row.size(), 11u);
  const uint64_t item_offset = std::stoull(row[5]), item_length = std::stoull(row[6]);
  const uint64_t data_offset = std::stoull(row[7]), data_length = std::stoull(row[8]);
  DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor t, LocateTorchSavedTensor(*file, item_offset, item_length, "zip64"));
  EXPECT_EQ(t.torch_dtype, "uint8");
  EXPECT_EQ(t.shape, std::vector<uint64_t>{data_length});
  EXPECT_EQ(t.data_offset, data_offset);  // where Python's zipfile finds it
  EXPECT_EQ(t.data_length, data_length);
  EXPECT_LT(file->bytes_read(), 16u << 10);  // the head and tail windows, not the 4 GiB
  // The tensor's first and last 4 KiB, read at the place found, are what the generator put there.
  std::string first(4096, '\0'), last(4096, '\0');
  DCKPT_ASSERT_OK(file->ReadAt(t.data_offset, first.data(), first.size()));
  DCKPT_ASSERT_OK(file->ReadAt(t.data_offset + t.data_length - 4096, last.data(), last.size()));
  EXPECT_EQ(testing_util::Sha256Hex(first), row[9]);
  EXPECT_EQ(testing_util::Sha256Hex(last), row[10]);
}

TEST(TorchSaveTest, EveryTruncationOfARealItemIsACleanError) {
  const std::vector<RealItem> items = RealItems("single_dtensor");
  ASSERT_FALSE(items.empty());
  const RealItem& it = items[0];
  const std::string item = ReadFileToString(it.file).substr(it.item.offset, it.item.length);
  DCKPT_ASSERT_OK(Locate(item).status());
  for (size_t n = 0; n < item.size(); ++n) {
    Result<TorchSavedTensor> r = Locate(item.substr(0, n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << n << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find("'item'"), std::string::npos) << r.status().ToString();
  }
  // Cut off at the front instead: the zip structures point outside.
  for (size_t n = 1; n < item.size(); n += 7) {
    EXPECT_FALSE(Locate(item.substr(n)).ok()) << n;
  }
}

TEST(TorchSaveTest, EveryByteFlipOfARealItemFailsCleanlyOrStaysInside) {
  const std::vector<RealItem> items = RealItems("fsdp2_3ranks");
  ASSERT_FALSE(items.empty());
  const RealItem& it = items[0];
  const std::string item = ReadFileToString(it.file).substr(it.item.offset, it.item.length);
  size_t ok = 0;
  for (size_t i = 0; i < item.size(); ++i) {
    for (uint8_t x : {0x01, 0x80, 0xff}) {
      std::string m = item;
      m[i] = static_cast<char>(m[i] ^ x);
      Result<TorchSavedTensor> r = Locate(m);
      if (!r.ok()) {
        EXPECT_TRUE(r.status().code() == StatusCode::kCorrupt || r.status().code() == StatusCode::kUnsupported)
            << r.status().ToString();
        continue;
      }
      ++ok;  // the tensor's own bytes, padding, crc, unchecked records...
      EXPECT_LE(r->data_offset, m.size());
      EXPECT_LE(r->data_length, m.size() - r->data_offset);
    }
  }
  EXPECT_GT(ok, 0u);
}

TEST(TorchSaveTest, AnItemOutsideItsFileIsRefused) {
  std::unique_ptr<Storage> posix = NewPosixStorage();
  const std::vector<RealItem> items = RealItems("single_dtensor");
  ASSERT_FALSE(items.empty());
  DCKPT_ASSERT_OK_AND_ASSIGN(auto file, posix->OpenFile(items[0].file));
  EXPECT_TRUE(StatusIs(LocateTorchSavedTensor(*file, file->size() - 10, 100, "ctx").status(), StatusCode::kCorrupt,
                       {"ctx", "outside the file"}));
  EXPECT_TRUE(StatusIs(LocateTorchSavedTensor(*file, ~uint64_t{0}, 2, "ctx").status(), StatusCode::kCorrupt,
                       {"outside the file"}));
}

// ---- Archives built here
// ---------------------------------------------------------------------------------------------

TEST(TorchSaveTest, PlainArchive) {
  const Zip z = BuildZip(TorchRecords(TensorPkl({}), Floats(6)));
  DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor t, Locate(z.bytes));
  EXPECT_EQ(t.torch_dtype, "float32");
  EXPECT_EQ(t.dtype, DType::kF32);
  EXPECT_EQ(t.shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(t.data_offset, z.data_offset.at("archive/data/0"));
  EXPECT_EQ(t.data_length, 24u);
}

TEST(TorchSaveTest, StorageOffsetAndUnitDimensions) {
  TensorSpec s;
  s.numel = 10;
  s.offset = 3;
  s.size = {1, 2, 3};
  s.stride = {99, 3, 1};  // the stride of a dimension of size 1 does not matter
  const Zip z = BuildZip(TorchRecords(TensorPkl(s), Floats(10)));
  DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor t, Locate(z.bytes));
  EXPECT_EQ(t.data_offset, z.data_offset.at("archive/data/0") + 12);
  EXPECT_EQ(t.data_length, 24u);
  // An empty tensor: any strides, no bytes.
  s.size = {0, 3};
  s.stride = {7, 5};
  DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor e, Locate(BuildZip(TorchRecords(TensorPkl(s), Floats(10))).bytes));
  EXPECT_EQ(e.data_length, 0u);
  // A 0-d tensor.
  s.size = {};
  s.stride = {};
  s.offset = 9;
  DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor z0, Locate(BuildZip(TorchRecords(TensorPkl(s), Floats(10))).bytes));
  EXPECT_EQ(z0.data_length, 4u);
  // The tensor must lie inside its storage.
  s.offset = 10;
  EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords(TensorPkl(s), Floats(10))).bytes).status(), StatusCode::kCorrupt,
                       {"outside its storage"}));
}

TEST(TorchSaveTest, UntypedStorageOfV3CountsBytes) {
  TensorSpec s;
  s.storage = "UntypedStorage";
  s.v3_dtype = "uint16";
  s.numel = 12;  // bytes
  s.size = {2, 3};
  s.stride = {3, 1};
  const Zip z = BuildZip(TorchRecords(TensorPkl(s), std::string(12, '\x07')));
  DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor t, Locate(z.bytes));
  EXPECT_EQ(t.dtype, DType::kU16);
  EXPECT_EQ(t.data_length, 12u);
  s.v3_dtype = "float8_e4m3fnuz";  // a torch dtype distckpt lacks: unsupported, not hostile
  EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords(TensorPkl(s), std::string(12, 0))).bytes).status(),
                       StatusCode::kUnsupported, {"float8_e4m3fnuz"}));
  s.v3_dtype = "bfloat16";  // the same 12 bytes hold the 6 elements
  DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor b,
                             Locate(BuildZip(TorchRecords(TensorPkl(s), std::string(12, 0))).bytes));
  EXPECT_EQ(b.data_length, 12u);
}

TEST(TorchSaveTest, Zip64RecordsAndComments) {
  ZipOptions o;
  o.zip64_entries = true;
  o.eocd_sentinels = true;
  const Zip z = BuildZip(TorchRecords(TensorPkl({}), Floats(6)), o);
  DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor t, Locate(z.bytes));
  EXPECT_EQ(t.data_offset, z.data_offset.at("archive/data/0"));
  // Without zip64 end records, and with a comment after the end record, short and beyond the first 4 KiB read.
  for (size_t len : {0, 100, 5000, 65535}) {
    ZipOptions c;
    c.zip64_end = false;
    c.comment = std::string(len, 'c');
    const Zip zc = BuildZip(TorchRecords(TensorPkl({}), Floats(6)), c);
    DCKPT_ASSERT_OK_AND_ASSIGN(TorchSavedTensor tc, Locate(zc.bytes));
    EXPECT_EQ(tc.data_offset, zc.data_offset.at("archive/data/0")) << len;
  }
  // Sentinels without the zip64 records they defer to.
  ZipOptions bad;
  bad.zip64_end = false;
  bad.eocd_sentinels = true;
  EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords(TensorPkl({}), Floats(6)), bad).bytes).status(),
                       StatusCode::kCorrupt, {"zip64"}));
  // Zip64 sizes the entry defers to an extra field it lacks.
  std::string no_extra = z.bytes;
  const size_t at = no_extra.find(std::string("\x01\x00\x18\x00", 4));
  ASSERT_NE(at, std::string::npos);
  no_extra[at] = 0x09;  // another extra field id
  EXPECT_TRUE(StatusIs(Locate(no_extra).status(), StatusCode::kCorrupt, {"zip64 extra field"}));
}

TEST(TorchSaveTest, WhatDistckptCannotReadInPlaceIsUnsupported) {
  {
    std::vector<ZipRecord> r = TorchRecords(TensorPkl({}), Floats(6));
    r[3].method = 8;  // deflate
    EXPECT_TRUE(StatusIs(Locate(BuildZip(r).bytes).status(), StatusCode::kUnsupported, {"compressed", "data/0"}));
    r[3].method = 0;
    r[3].flags |= 1;
    EXPECT_TRUE(StatusIs(Locate(BuildZip(r).bytes).status(), StatusCode::kUnsupported, {"encrypted"}));
  }
  EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords(TensorPkl({}), Floats(6), "big")).bytes).status(),
                       StatusCode::kUnsupported, {"'big'", "byte order"}));
  EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords(TensorPkl({}), Floats(6), nullptr)).bytes).status(),
                       StatusCode::kUnsupported, {"byteorder"}));
  TensorSpec transposed;
  transposed.size = {3, 2};
  transposed.stride = {1, 3};
  EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords(TensorPkl(transposed), Floats(6))).bytes).status(),
                       StatusCode::kUnsupported, {"strides (1, 3)", "C order"}));
  TensorSpec conj;
  conj.storage = "ComplexFloatStorage";
  conj.numel = 6;
  conj.metadata_key = "conj";
  EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords(TensorPkl(conj), std::string(48, 0))).bytes).status(),
                       StatusCode::kUnsupported, {"'conj'"}));
  // Something else than a tensor.
  EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords("\x80\x02K\x05.", "")).bytes).status(), StatusCode::kUnsupported,
                       {"an int", "not a plain tensor"}));
}

TEST(TorchSaveTest, MalformedArchivesAreCorrupt) {
  const std::string good = BuildZip(TorchRecords(TensorPkl({}), Floats(6))).bytes;
  EXPECT_TRUE(StatusIs(Locate("").status(), StatusCode::kCorrupt, {"too short"}));
  EXPECT_TRUE(StatusIs(Locate(std::string(5000, 'x')).status(), StatusCode::kCorrupt, {"not a zip archive"}));
  {  // the storage's record is missing, or of the wrong size
    std::vector<ZipRecord> r = TorchRecords(TensorPkl({}), Floats(6));
    r[3].name = "archive/data/1";
    EXPECT_TRUE(StatusIs(Locate(BuildZip(r).bytes).status(), StatusCode::kCorrupt, {"archive/data/0"}));
    EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords(TensorPkl({}), Floats(5))).bytes).status(), StatusCode::kCorrupt,
                         {"has 20 bytes", "24"}));
  }
  {  // a local header that names another record
    std::vector<ZipRecord> r = TorchRecords(TensorPkl({}), Floats(6));
    r[3].local_name = "archive/data/X";
    EXPECT_TRUE(StatusIs(Locate(BuildZip(r).bytes).status(), StatusCode::kCorrupt, {"local header", "names"}));
  }
  {  // the same record twice; no data.pkl
    std::vector<ZipRecord> r = TorchRecords(TensorPkl({}), Floats(6));
    r.push_back(r[3]);
    EXPECT_TRUE(StatusIs(Locate(BuildZip(r).bytes).status(), StatusCode::kCorrupt, {"appears twice"}));
    r.pop_back();
    r[0].name = "archive/other.pkl";
    EXPECT_TRUE(StatusIs(Locate(BuildZip(r).bytes).status(), StatusCode::kCorrupt, {"data.pkl"}));
    r[0].name = "data.pkl";  // the first record names the archive's directory
    EXPECT_TRUE(StatusIs(Locate(BuildZip(r).bytes).status(), StatusCode::kCorrupt, {"not inside a directory"}));
  }
  {  // the central directory's offset points elsewhere
    std::string b = good;
    const size_t eocd = b.size() - 22;
    b[eocd + 16] = static_cast<char>(b[eocd + 16] + 1);
    EXPECT_TRUE(StatusIs(Locate(b).status(), StatusCode::kCorrupt, {"disagree"}));
  }
  {  // a hostile data.pkl: refused by name, nothing called
    const std::string evil = "cposix\nsystem\n(X\x02\x00\x00\x00idtR.";
    EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords(evil, "")).bytes).status(), StatusCode::kCorrupt,
                         {"'item'", "archive/data.pkl", "posix.system"}));
  }
  {  // a data.pkl rebuilt by another module's function of the same name
    TensorSpec s;
    s.root_module = "torch._utils_evil";
    EXPECT_TRUE(StatusIs(Locate(BuildZip(TorchRecords(TensorPkl(s), Floats(6))).bytes).status(), StatusCode::kCorrupt,
                         {"torch._utils_evil._rebuild_tensor_v2"}));
  }
}

TEST(TorchSaveTest, DTypeNames) {
  EXPECT_EQ(DTypeFromTorchName("bfloat16"), DType::kBF16);
  EXPECT_EQ(DTypeFromTorchName("float"), DType::kF32);
  EXPECT_EQ(DTypeFromTorchName("half"), DType::kF16);
  EXPECT_EQ(DTypeFromTorchName("long"), DType::kI64);
  EXPECT_EQ(DTypeFromTorchName("float8_e5m2"), DType::kF8E5M2);
  EXPECT_EQ(DTypeFromTorchName("float8_e5m2fnuz"), DType::kInvalid);
  EXPECT_EQ(DTypeFromTorchName("complex32"), DType::kInvalid);
  EXPECT_EQ(DTypeFromTorchName("qint8"), DType::kInvalid);
  EXPECT_EQ(CanonicalTorchDTypeName("cdouble"), "complex128");
  EXPECT_EQ(CanonicalTorchDTypeName("int8"), "int8");
}

}  // namespace
}  // namespace distckpt
