#include "core/foreign/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/status_matchers.h"
#include "core/base/testing/temp_dir.h"
#include "core/foreign/foreign.h"
#include "core/foreign/testing/safetensors_file.h"

namespace distckpt {
namespace {

using testing_util::SafetensorsFile;
using testing_util::WriteStringToFile;

Result<SafetensorsHeader> Parse(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  std::string_view json;
  if (n <= file.size() - 8) json = std::string_view(file).substr(8, n);
  return ParseSafetensorsHeader(json, n, file.size(), "x.safetensors");
}

const char kTwo[] = R"({"b":{"dtype":"F16","shape":[3],"data_offsets":[24,30]},)"
                    R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"__metadata__":{"format":"pt"}})";

TEST(SafetensorsTest, ParsesAValidHeader) {
  const std::string f = SafetensorsFile(kTwo, std::string(30, 'x'));
  DCKPT_ASSERT_OK_AND_ASSIGN(SafetensorsHeader h, Parse(f));
  EXPECT_EQ(h.data_start % 8, 0u);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(h.tensors[0].dtype, DType::kF32);
  EXPECT_EQ(h.tensors[0].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].begin, 24u);
  ASSERT_EQ(h.metadata.size(), 1u);
  EXPECT_EQ(h.metadata[0].second, "pt");
}

TEST(SafetensorsTest, ScalarsEmptyTensorsAndNoTensors) {
  DCKPT_ASSERT_OK_AND_ASSIGN(
      SafetensorsHeader h,
      Parse(SafetensorsFile(R"({"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0,4],)"
                            R"("data_offsets":[8,8]}})",
                            std::string(8, '\0'))));
  EXPECT_EQ(h.tensors.size(), 2u);
  DCKPT_ASSERT_OK_AND_ASSIGN(SafetensorsHeader empty, Parse(SafetensorsFile("{}", "")));
  EXPECT_TRUE(empty.tensors.empty());
}

TEST(SafetensorsTest, RefusesWhatSafetensorsRefuses) {
  struct Case {
    const char* header;
    size_t data;
    const char* says;
  };
  const Case cases[] = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "overlaps"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
       20, "a gap"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "past its end"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12, "no tensor holds"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "needs 12"},
      {R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8, "unknown dtype"},
      {R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8, "not a non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "not a non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "end before they begin"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "data_offsets is not"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", 8, "lacks \"data_offsets\""},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8, "unknown field"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       8, "twice"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", 8, "overflows"},
      {R"({"__metadata__":{"k":1}})", 0, "not a string"},
      {R"({"a":5})", 0, "not an object"},
      {R"([1])", 0, "does not start with '{'"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8, "invalid JSON"},
  };
  for (const Case& c : cases) {
    auto r = Parse(SafetensorsFile(c.header, std::string(c.data, 'x')));
    EXPECT_TRUE(StatusIs(r.status(), StatusCode::kCorrupt, {"safetensors file 'x.safetensors'", c.says})) << c.header;
  }
  EXPECT_TRUE(StatusIs(Parse(SafetensorsFile(R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", "x")).status(),
                       StatusCode::kUnsupported, {"F4"}));
  EXPECT_TRUE(StatusIs(
      Parse(SafetensorsFile(R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", "x")).status(),
      StatusCode::kUnsupported, {"9 dimensions"}));
}

TEST(SafetensorsTest, RefusesBadHeaderLengths) {
  std::string f = SafetensorsFile(kTwo, std::string(30, 'x'));
  f[0] = static_cast<char>(0xff);  // longer than the file
  EXPECT_TRUE(StatusIs(Parse(f).status(), StatusCode::kCorrupt, {"runs past the end of the file"}));
  std::string huge(8, '\0');
  const uint64_t n = kMaxSafetensorsHeader + 8;
  for (int i = 0; i < 8; ++i) huge[i] = static_cast<char>(n >> (8 * i));
  EXPECT_TRUE(StatusIs(ParseSafetensorsHeader("", n, 1ull << 40, "x.safetensors").status(), StatusCode::kCorrupt,
                       {"over safetensors' limit"}));
  EXPECT_TRUE(
      StatusIs(ParseSafetensorsHeader("", 0, 4, "x.safetensors").status(), StatusCode::kCorrupt, {"too short"}));
}

// Any damage to any byte of the header or its length: a clean error, or a header whose tensors still tile the data
// exactly (a flipped digit of a name, say). Never a tensor outside the file.
TEST(SafetensorsTest, EveryFlippedByteFailsCleanlyOrStaysInBounds) {
  const std::string good = SafetensorsFile(kTwo, std::string(30, 'x'));
  const uint64_t data_len = 30;
  int refused = 0, accepted = 0;
  for (size_t i = 0; i < good.size() - data_len; ++i) {
    for (unsigned char flip : {0x01, 0x20, 0x80, 0xff}) {
      std::string f = good;
      f[i] = static_cast<char>(f[i] ^ flip);
      auto r = Parse(f);
      if (!r.ok()) {
        ++refused;
        continue;
      }
      ++accepted;
      uint64_t at = 0;
      for (const auto& t : r->tensors) {
        EXPECT_EQ(t.begin, at);
        at = t.end;
      }
      EXPECT_EQ(r->data_start + at, f.size());
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(accepted, 0);
}

class SafetensorsDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::MakeTempDir("safetensors-");
    WriteStringToFile(
        dir_ + "/model-00001-of-00002.safetensors",
        SafetensorsFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})",
                        std::string(8, 'a')));
    WriteStringToFile(dir_ + "/model-00002-of-00002.safetensors",
                      SafetensorsFile(R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", "bbb"));
    Index(R"({"metadata":{"total_size":11},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
          R"("b":"model-00002-of-00002.safetensors"}})");
  }
  void Index(const std::string& json) { WriteStringToFile(dir_ + "/model.safetensors.index.json", json); }
  Result<std::optional<MetadataRecord>> Describe() {
    Storage* s = DefaultStorage();
    DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<Directory> d, s->OpenDirectory(dir_));
    return DescribeForeignDirectory(s, d.get(), dir_, dir_);
  }
  std::string dir_;
};

TEST_F(SafetensorsDirTest, DescribesAHubDirectory) {
  DCKPT_ASSERT_OK_AND_ASSIGN(std::optional<MetadataRecord> r, Describe());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->source, "safetensors");
  ASSERT_EQ(r->files.size(), 2u);
  ASSERT_EQ(r->entries.size(), 2u);
  EXPECT_EQ(r->entries[0].name, "a");
  EXPECT_EQ(r->entries[0].chunks[0].file, 0u);
  EXPECT_EQ(r->entries[1].chunks[0].file, 1u);
  EXPECT_EQ(r->entries[1].chunks[0].offset % 8, 0u);
  ASSERT_EQ(r->user.size(), 1u);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string bytes, EncodeMetadata(*r));
  DCKPT_ASSERT_OK_AND_ASSIGN(MetadataView v,
                             MetadataView::ParseForeign(std::make_shared<const std::string>(bytes), dir_));
  EXPECT_FALSE(v.checksummed());
}

TEST_F(SafetensorsDirTest, TheIndexMustMatchTheFiles) {
  Index(R"({"weight_map":{"a":"model-00002-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  EXPECT_TRUE(StatusIs(Describe().status(), StatusCode::kCorrupt, {"maps tensor \"a\"", "does not hold it"}));
  Index(R"({"weight_map":{"a":"model-00001-of-00002.safetensors","c":"model-00003-of-00002.safetensors"}})");
  EXPECT_TRUE(StatusIs(Describe().status(), StatusCode::kNotFound, {"model-00003-of-00002.safetensors", "missing"}));
  Index(R"({"weight_map":{"a":"../model-00001-of-00002.safetensors"}})");
  EXPECT_TRUE(StatusIs(Describe().status(), StatusCode::kCorrupt, {"not a .safetensors file in the same directory"}));
  Index(R"({"weight_map":{"a":"/etc/passwd.safetensors"}})");
  EXPECT_TRUE(StatusIs(Describe().status(), StatusCode::kCorrupt, {"not a .safetensors file"}));
  Index(R"({"metadata":{}})");
  EXPECT_TRUE(StatusIs(Describe().status(), StatusCode::kCorrupt, {"no \"weight_map\""}));
  WriteStringToFile(dir_ + "/other.safetensors.index.json", "{}");
  EXPECT_TRUE(StatusIs(Describe().status(), StatusCode::kInvalidArgument, {"several safetensors indexes"}));
}

TEST_F(SafetensorsDirTest, WithoutAnIndexEveryFileAndNoTensorTwice) {
  ASSERT_EQ(::unlink((dir_ + "/model.safetensors.index.json").c_str()), 0);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::optional<MetadataRecord> r, Describe());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->entries.size(), 2u);
  WriteStringToFile(dir_ + "/model-00003.safetensors",
                    SafetensorsFile(R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "c"));
  EXPECT_TRUE(StatusIs(Describe().status(), StatusCode::kCorrupt, {"tensor \"b\" is in both"}));
}

TEST_F(SafetensorsDirTest, ASymlinkedShardIsNotFollowed) {
  const std::string outside = testing_util::MakeTempDir("outside-") + "/secret.safetensors";
  WriteStringToFile(outside, SafetensorsFile(R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", "sss"));
  ASSERT_EQ(::unlink((dir_ + "/model-00002-of-00002.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (dir_ + "/model-00002-of-00002.safetensors").c_str()), 0);
  auto r = Describe();
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model-00002-of-00002.safetensors"), std::string::npos) << r.status().ToString();
}

TEST_F(SafetensorsDirTest, NotAForeignCheckpoint) {
  const std::string empty = testing_util::MakeTempDir("empty-");
  Storage* s = DefaultStorage();
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Directory> d, s->OpenDirectory(empty));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::optional<MetadataRecord> r, DescribeForeignDirectory(s, d.get(), empty, empty));
  EXPECT_FALSE(r);
}

}  // namespace
}  // namespace distckpt
