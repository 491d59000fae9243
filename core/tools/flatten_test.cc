// FlattenCheckpoint: a self-contained copy of an incremental checkpoint through the real engine and POSIX storage, in
// place too, that outlives its bases; damage in a base is caught and leaves no copy.
#include "core/tools/flatten.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/tools/leftovers.h"

namespace distckpt {
namespace {

using testing_util::MakeTempDir;

struct Weights {
  std::vector<float> frozen = std::vector<float>(700000);  // 2.8 MB: three checksum blocks
  std::vector<int32_t> head = std::vector<int32_t>(5000);
  explicit Weights(int step) {
    for (size_t i = 0; i < frozen.size(); ++i) frozen[i] = static_cast<float>(i % 4093);
    for (size_t i = 0; i < head.size(); ++i) head[i] = static_cast<int32_t>(i * step);
  }
};

Status SaveWeights(Weights& w, const std::string& path, const std::string& base) {
  State s;
  DCKPT_RETURN_IF_ERROR(s.AddTensor("frozen", DType::kF32, {w.frozen.size()}));
  DCKPT_RETURN_IF_ERROR(s.AddPiece("frozen", {0}, {w.frozen.size() / 2}, w.frozen.data()));
  DCKPT_RETURN_IF_ERROR(
      s.AddPiece("frozen", {w.frozen.size() / 2}, {w.frozen.size() / 2}, w.frozen.data() + w.frozen.size() / 2));
  DCKPT_RETURN_IF_ERROR(s.AddTensor("head", DType::kI32, {w.head.size()}));
  DCKPT_RETURN_IF_ERROR(s.AddPiece("head", {0}, {w.head.size()}, w.head.data()));
  SaveOptions o;
  o.base = base;
  o.sync = false;
  return Save(path, s, nullptr, o).status();
}

void ExpectHolds(const std::string& path, const Weights& want) {
  Weights got(0);
  std::fill(got.frozen.begin(), got.frozen.end(), -1.f);
  State s;
  ASSERT_TRUE(s.AddTensor("frozen", DType::kF32, {got.frozen.size()}).ok());
  ASSERT_TRUE(s.AddPiece("frozen", {0}, {got.frozen.size()}, got.frozen.data()).ok());
  ASSERT_TRUE(s.AddTensor("head", DType::kI32, {got.head.size()}).ok());
  ASSERT_TRUE(s.AddPiece("head", {0}, {got.head.size()}, got.head.data()).ok());
  auto loaded = Load(path, s, nullptr, ReadOptions());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(got.frozen, want.frozen);
  EXPECT_EQ(got.head, want.head);
}

size_t Bases(const std::string& path) {
  auto r = Reader::Open(path, nullptr, ReadOptions());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? (*r)->metadata().num_bases() : 99;
}

TEST(FlattenTest, ACopyHoldsEveryChunkAndOutlivesTheBases) {
  const std::string dir = MakeTempDir("flatten-");
  Weights w1(1), w2(2);
  ASSERT_TRUE(SaveWeights(w1, dir + "/a", "").ok());
  ASSERT_TRUE(SaveWeights(w2, dir + "/b", "a").ok());
  ASSERT_EQ(Bases(dir + "/b"), 1u);
  auto flat = FlattenCheckpoint(dir + "/b", dir + "/c", false);
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  EXPECT_EQ(flat->bytes_copied, w2.frozen.size() * 4 + w2.head.size() * 4);
  EXPECT_EQ(flat->bytes_from_bases, w2.frozen.size() * 4);
  EXPECT_EQ(Bases(dir + "/c"), 0u);
  auto reader = Reader::Open(dir + "/c", nullptr, ReadOptions());
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->metadata().format_major(), 1);
  EXPECT_TRUE((*reader)->VerifyAll(nullptr).ok());
  reader->reset();
  ASSERT_TRUE(RemoveCheckpoint(DefaultStorage(), dir + "/b").ok());
  ASSERT_TRUE(RemoveCheckpoint(DefaultStorage(), dir + "/a").ok());
  ExpectHolds(dir + "/c", w2);
  // Flattening a self-contained checkpoint copies it.
  auto again = FlattenCheckpoint(dir + "/c", dir + "/d", false);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->bytes_from_bases, 0u);
  ExpectHolds(dir + "/d", w2);
  EXPECT_EQ(FlattenCheckpoint(dir + "/c", dir + "/d", false).status().code(), StatusCode::kExists);
}

TEST(FlattenTest, InPlaceMakesACheckpointSelfContainedSoItsBaseCanGo) {
  const std::string dir = MakeTempDir("flatten-");
  Weights w1(1), w2(2);
  ASSERT_TRUE(SaveWeights(w1, dir + "/a", "").ok());
  ASSERT_TRUE(SaveWeights(w2, dir + "/b", "a").ok());
  EXPECT_EQ(RemoveCheckpoint(DefaultStorage(), dir + "/a").code(), StatusCode::kState);
  auto flat = FlattenCheckpoint(dir + "/b", dir + "/b", true);
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  EXPECT_EQ(Bases(dir + "/b"), 0u);
  ASSERT_TRUE(RemoveCheckpoint(DefaultStorage(), dir + "/a").ok());
  ExpectHolds(dir + "/b", w2);
}

TEST(FlattenTest, DamageInABaseIsCaughtAndLeavesNoCopy) {
  const std::string dir = MakeTempDir("flatten-");
  Weights w1(1), w2(2);
  ASSERT_TRUE(SaveWeights(w1, dir + "/a", "").ok());
  ASSERT_TRUE(SaveWeights(w2, dir + "/b", "a").ok());
  {
    std::fstream f(dir + "/a/data-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 * 3 + 7);
    f.put('\x42');
  }
  auto flat = FlattenCheckpoint(dir + "/b", dir + "/c", false);
  ASSERT_EQ(flat.status().code(), StatusCode::kCorrupt) << flat.status().ToString();
  EXPECT_NE(flat.status().message().find("/a/data-00000.bin"), std::string::npos) << flat.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir + "/c"));
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find("dckpt-staging"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace distckpt
