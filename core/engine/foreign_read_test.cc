// The engine reading foreign checkpoints in place (core/foreign, FORMAT.md 2.4): a hub-style safetensors directory
// and one safetensors file, through every read path (regions, resharded loads, mappings), with verification
// reported as impossible rather than passed. The files are made here byte by byte; python/tests/test_foreign.py
// reads the real libraries' files through the C ABI.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/status_matchers.h"
#include "core/base/testing/temp_dir.h"
#include "core/cuda/host_copy_engine.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/foreign/testing/safetensors_file.h"

namespace distckpt {
namespace {

using testing_util::SafetensorsFile;
using testing_util::WriteStringToFile;

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class ForeignReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::MakeTempDir("hub-");
    w_.resize(4 * 6);
    std::iota(w_.begin(), w_.end(), 0.5f);
    b_ = {7, 8, 9, 10, 11};
    // Shard 1: a 1-byte tensor first, so that "w" starts at an odd offset of the data.
    WriteStringToFile(dir_ + "/model-00001-of-00002.safetensors",
                      SafetensorsFile(R"({"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                      R"("w":{"dtype":"F32","shape":[4,6],"data_offsets":[1,97]}})",
                                      "P" + Bytes(w_)));
    WriteStringToFile(dir_ + "/model-00002-of-00002.safetensors",
                      SafetensorsFile(R"({"b":{"dtype":"I64","shape":[5],"data_offsets":[0,40]}})", Bytes(b_)));
    WriteStringToFile(dir_ + "/model.safetensors.index.json",
                      R"({"metadata":{"total_size":137},"weight_map":{"pad":"model-00001-of-00002.safetensors",)"
                      R"("w":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  }
  std::string dir_;
  std::vector<float> w_;
  std::vector<int64_t> b_;
};

TEST_F(ForeignReadTest, RegionsAndResharding) {
  DCKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir_, nullptr, ReadOptions()));
  EXPECT_EQ(reader->metadata().source(), "safetensors");
  EXPECT_EQ(reader->metadata().num_entries(), 3u);
  // Rows 1..3, columns 2..5 of w.
  Box box;
  box.ndim = 2;
  box.offset[0] = 1, box.offset[1] = 2, box.length[0] = 2, box.length[1] = 3;
  std::vector<float> got(6);
  DCKPT_ASSERT_OK(reader->ReadRegion("w", box, got.data(), got.size() * 4));
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(got[r * 3 + c], w_[(1 + r) * 6 + 2 + c]);
  }
  // A load into two pieces split by columns (another sharding than the file's one chunk).
  std::vector<float> left(4 * 2), right(4 * 4);
  std::vector<int64_t> b(5);
  State state;
  DCKPT_ASSERT_OK(state.AddTensor("w", DType::kF32, {4, 6}));
  DCKPT_ASSERT_OK(state.AddPiece("w", {0, 0}, {4, 2}, left.data()));
  DCKPT_ASSERT_OK(state.AddPiece("w", {0, 2}, {4, 4}, right.data()));
  DCKPT_ASSERT_OK(state.AddTensor("b", DType::kI64, {5}));
  DCKPT_ASSERT_OK(state.AddPiece("b", {0}, {5}, b.data()));
  DCKPT_ASSERT_OK_AND_ASSIGN(LoadSummary s, Load(dir_, state, nullptr, ReadOptions()));
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 2; ++c) EXPECT_EQ(left[r * 2 + c], w_[r * 6 + c]);
    for (int c = 0; c < 4; ++c) EXPECT_EQ(right[r * 4 + c], w_[r * 6 + 2 + c]);
  }
  EXPECT_EQ(b, b_);
  EXPECT_EQ(s.io.bytes_verified, 0u);
}

// Device destinations go through the load staging pipeline (pinned reads, then copies), with the host copy engine
// standing in for CUDA as in device_load_test.cc: the unaligned chunk of "w" is staged like any other.
TEST_F(ForeignReadTest, LoadsIntoDeviceMemoryThroughStaging) {
  HostCopyEngine engine;
  ReadOptions o;
  o.copy_engine = &engine;
  o.staging_buffer_bytes = 64;  // several buffers' worth for "w" (96 bytes)
  o.staging_buffers = 2;
  const MemoryLocation device{MemoryKind::kCuda, 0, reinterpret_cast<void*>(0x51)};
  std::vector<float> top(2 * 6), bottom(2 * 6);
  State state;
  DCKPT_ASSERT_OK(state.AddTensor("w", DType::kF32, {4, 6}));
  DCKPT_ASSERT_OK(state.AddPieceIn("w", {0, 0}, {2, 6}, top.data(), device));
  DCKPT_ASSERT_OK(state.AddPieceIn("w", {2, 0}, {2, 6}, bottom.data(), device));
  DCKPT_ASSERT_OK_AND_ASSIGN(LoadSummary s, Load(dir_, state, nullptr, o));
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(top[i], w_[i]);
    EXPECT_EQ(bottom[i], w_[12 + i]);
  }
  EXPECT_EQ(s.io.bytes_verified, 0u);
}

TEST_F(ForeignReadTest, MappingsShowTheFileInPlace) {
  DCKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir_, nullptr, ReadOptions()));
  DCKPT_ASSERT_OK(reader->MapAll({}, nullptr));
  const size_t w = *reader->metadata().Find("w");
  const ChunkLocation loc = reader->metadata().entry(w).chunk(0);
  DCKPT_ASSERT_OK_AND_ASSIGN(const char* base, reader->MappedFile(loc.file));
  EXPECT_EQ(std::memcmp(base + loc.offset, w_.data(), loc.length), 0);
}

TEST_F(ForeignReadTest, VerifySaysThereAreNoChecksums) {
  DCKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir_, nullptr, ReadOptions()));
  EXPECT_TRUE(
      StatusIs(reader->VerifyAll(nullptr), StatusCode::kUnsupported, {dir_, "safetensors checkpoint", "no checksums"}));
  EXPECT_TRUE(StatusIs(reader->VerifyChunk(0, 0), StatusCode::kUnsupported, {"no checksums"}));
}

TEST_F(ForeignReadTest, OneFileOpensOnItsOwn) {
  const std::string file = dir_ + "/model-00002-of-00002.safetensors";
  DCKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(file, nullptr, ReadOptions()));
  ASSERT_EQ(reader->metadata().num_entries(), 1u);
  std::vector<int64_t> b(5);
  Box box;
  box.ndim = 1;
  box.length[0] = 5;
  DCKPT_ASSERT_OK(reader->ReadRegion("b", box, b.data(), 40));
  EXPECT_EQ(b, b_);
  EXPECT_TRUE(StatusIs(Reader::Open(dir_ + "/nope.safetensors", nullptr, ReadOptions()).status(), StatusCode::kNotFound,
                       {"nope.safetensors"}));
}

TEST_F(ForeignReadTest, DamageNamesTheCheckpointAndTheFile) {
  // A shard cut short: its tensors run past its end.
  const std::string shard = dir_ + "/model-00001-of-00002.safetensors";
  ASSERT_EQ(::truncate(shard.c_str(), 200), 0);
  EXPECT_TRUE(StatusIs(Reader::Open(dir_, nullptr, ReadOptions()).status(), StatusCode::kCorrupt,
                       {dir_, "model-00001-of-00002.safetensors", "truncated"}));
  // Neither distckpt nor foreign.
  const std::string empty = testing_util::MakeTempDir("empty-");
  EXPECT_TRUE(StatusIs(Reader::Open(empty, nullptr, ReadOptions()).status(), StatusCode::kNotFound,
                       {"not a safetensors or PyTorch DCP checkpoint"}));
}

TEST_F(ForeignReadTest, AShardReplacedAfterOpenIsRefused) {
  DCKPT_ASSERT_OK_AND_ASSIGN(auto reader, Reader::Open(dir_, nullptr, ReadOptions(), FilePinning::kOnFirstUse));
  // Same name, other size: the description no longer matches the file.
  const std::string shard = dir_ + "/model-00002-of-00002.safetensors";
  ASSERT_EQ(::unlink(shard.c_str()), 0);
  WriteStringToFile(
      shard, SafetensorsFile(R"({"b":{"dtype":"I64","shape":[6],"data_offsets":[0,48]}})", std::string(48, 'z')));
  std::vector<int64_t> b(5);
  Box box;
  box.ndim = 1;
  box.length[0] = 5;
  EXPECT_TRUE(
      StatusIs(reader->ReadRegion("b", box, b.data(), 40), StatusCode::kCorrupt, {"model-00002-of-00002.safetensors"}));
}

}  // namespace
}  // namespace distckpt
