// The committed golden checkpoints load to their known values, forever. If this test fails after a format change,
// the change broke compatibility: fix the reader, never regenerate the goldens.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/temp_dir.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/format/checksum.h"
#include "tests/golden/golden_values.h"

namespace distckpt {
namespace golden {
namespace {

// One committed golden checkpoint per format version, with the exact bytes it must keep (XXH3-64 of each file): a
// golden is never regenerated, so a changed digest means someone rewrote history.
struct Golden {
  const char* dir;
  uint16_t format_minor;
  bool has_metadata_checksum;
  uint64_t metadata_digest;
  uint64_t data_digest;
  uint16_t format_major = 1;
  const char* base = nullptr;  // 2.0: the sibling golden it refers to (copied beside it)
};

const Golden kGoldens[] = {
    {"v1_all_dtypes", 0, false, 0x062661bd2ba7ceb7ull, 0xcc879087ad328e58ull},
    {"v1_1_all_dtypes", 1, true, 0xc2aa5804ac3575abull, 0xcc879087ad328e58ull},
    {"v1_2_all_dtypes", 2, true, 0xf3ff41b4a013a94bull, 0xcc879087ad328e58ull},
    {"v2_0_all_dtypes", 0, true, 0x960460d114ea58b9ull, 0x4a739a7cd1e8831full, 2, "v1_2_all_dtypes"},
    {"v3_0_all_dtypes", 0, true, 0xecb5da517a3f3d7full, 0x17fcc4a1edbd64caull, 3},
};

std::string GoldenDir(const std::string& dir) {
  const char* src = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(src ? src : ".") + "/" + (ws ? ws : "distckpt") + "/tests/golden/" + dir;
}
std::string GoldenDir(const Golden& g) { return GoldenDir(g.dir); }

// Bazel's runfiles are a tree of symbolic links, and a reader never follows a link inside a checkpoint: the test
// reads a real copy of the golden (and of its base, beside it), in its scratch directory.
std::string RealCopyOf(const Golden& g) {
  const std::string parent = testing_util::MakeTempDir(std::string(g.dir) + "-");
  for (const char* dir : {g.dir, g.base}) {
    if (dir == nullptr) continue;
    ::mkdir((parent + "/" + dir).c_str(), 0755);
    for (const char* name : {"metadata.dckpt", "data-00000.bin"}) {
      std::ifstream in(GoldenDir(dir) + "/" + name, std::ios::binary);
      std::ofstream out(parent + "/" + dir + "/" + name, std::ios::binary | std::ios::trunc);
      out << in.rdbuf();
    }
  }
  return parent + "/" + g.dir;
}

uint64_t FileDigest(const std::string& path) {
  const std::string bytes = testing_util::ReadFileToString(path);
  EXPECT_FALSE(bytes.empty()) << path;
  return Xxh3(bytes.data(), bytes.size());
}

std::vector<uint8_t> Expected(const GoldenTensor& t, const Box& box) {
  const uint64_t item = DTypeSize(t.dtype);
  std::vector<uint8_t> out(box.volume() * item);
  std::vector<uint64_t> idx(box.ndim);
  for (uint64_t e = 0; e < box.volume(); ++e) {
    uint64_t rem = e, linear = 0;
    for (int d = static_cast<int>(box.ndim) - 1; d >= 0; --d) {
      idx[d] = rem % box.length[d];
      rem /= box.length[d];
    }
    for (uint32_t d = 0; d < box.ndim; ++d) linear = linear * t.shape[d] + box.offset[d] + idx[d];
    for (uint64_t k = 0; k < item; ++k) out[e * item + k] = GoldenByte(t.name, linear, k);
  }
  return out;
}

class GoldenTest : public ::testing::TestWithParam<Golden> {};

TEST_P(GoldenTest, FilesAreByteForByteAsCommitted) {
  EXPECT_EQ(FileDigest(GoldenDir(GetParam()) + "/metadata.dckpt"), GetParam().metadata_digest);
  EXPECT_EQ(FileDigest(GoldenDir(GetParam()) + "/data-00000.bin"), GetParam().data_digest);
}

TEST_P(GoldenTest, AllDtypesLoadToKnownValues) {
  auto reader = Reader::Open(RealCopyOf(GetParam()), nullptr, ReadOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const MetadataView& m = (*reader)->metadata();
  EXPECT_EQ(m.format_major(), GetParam().format_major);
  EXPECT_EQ(m.format_minor(), GetParam().format_minor);
  if (GetParam().base != nullptr) {
    ASSERT_EQ(m.num_bases(), 1u);
    EXPECT_EQ(m.base_name(0), GetParam().base);
    EXPECT_EQ(m.chain_length(), 1u);
  }
  EXPECT_EQ(m.checksum().has_value(), GetParam().has_metadata_checksum);
  EXPECT_EQ(m.FindUser("step").value(), "42");
  EXPECT_EQ(std::string(m.structure()), "{\"golden\": true}");
  ASSERT_TRUE((*reader)->VerifyAll(nullptr).ok());

  for (const GoldenTensor& t : AllDtypesTensors()) {
    SCOPED_TRACE(t.name);
    auto idx = m.Find(t.name);
    ASSERT_TRUE(idx.has_value());
    EntryView e = m.entry(*idx);
    EXPECT_EQ(e.dtype, t.dtype);
    EXPECT_EQ(std::vector<uint64_t>(e.shape.begin(), e.shape.end()), t.shape);
    // The whole tensor, then every single row (a partial read that crosses piece boundaries).
    Box whole = Box::Whole(t.shape).value();
    std::vector<uint8_t> got(whole.volume() * DTypeSize(t.dtype));
    ASSERT_TRUE((*reader)->ReadRegion(t.name, whole, got.data(), got.size()).ok());
    EXPECT_EQ(got, Expected(t, whole));
    if (!t.shape.empty()) {
      for (uint64_t r = 0; r < t.shape[0]; ++r) {
        Box row = whole;
        row.offset[0] = r;
        row.length[0] = 1;
        std::vector<uint8_t> g(row.volume() * DTypeSize(t.dtype));
        ASSERT_TRUE((*reader)->ReadRegion(t.name, row, g.data(), g.size()).ok());
        EXPECT_EQ(g, Expected(t, row));
      }
    }
  }
  std::string blob(256, '\0');
  auto size = (*reader)->ReadBytes("train.state", blob.data(), blob.size());
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(blob.substr(0, *size), GoldenBytesValue());
}

// As committed, through Bazel's links: refused, naming the link (a reader never follows a link inside a checkpoint).
TEST_P(GoldenTest, ThroughSymbolicLinksItIsRefused) {
  auto reader = Reader::Open(GoldenDir(GetParam()), nullptr, ReadOptions{});
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(reader.status().message().find("metadata.dckpt' is a symbolic link"), std::string::npos)
      << reader.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(Versions, GoldenTest, ::testing::ValuesIn(kGoldens),
                         [](const ::testing::TestParamInfo<Golden>& i) { return std::string(i.param.dir); });

}  // namespace
}  // namespace golden
}  // namespace distckpt
