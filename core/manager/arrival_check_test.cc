// ArrivalCheck against real parts' files: fed in pieces of every size, a clean part passes; a flipped byte anywhere in
// a data file's chunks is named (entry, file, bytes) the moment its block arrives; damaged metadata, data before the
// metadata, bytes out of order and a file cut short are refused.
#include "core/manager/arrival_check.h"

#include <fstream>
#include <sstream>

#include "core/base/testing/temp_dir.h"
#include "core/engine/save.h"
#include "core/format/metadata.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace manager_internal {
namespace {

struct Saved {
  std::vector<std::string> names;
  std::vector<std::string> bytes;
};

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A checkpoint of two tensors (several checksum blocks of 4 KiB each, and one small chunk) and a bytes entry.
Saved SaveOne() {
  const std::string dir = testing_util::MakeTempDir("arrival-") + "/ckpt";
  static std::vector<float> big(10000), small(7);
  static std::string note = "hello";
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<float>(i);
  State state;
  EXPECT_TRUE(state.AddTensor("big", DType::kF32, {100, 100}).ok());
  EXPECT_TRUE(state.AddPiece("big", {0, 0}, {100, 100}, big.data()).ok());
  EXPECT_TRUE(state.AddTensor("small", DType::kF32, {7}).ok());
  EXPECT_TRUE(state.AddPiece("small", {0}, {7}, small.data()).ok());
  EXPECT_TRUE(state.AddBytes("note", note.data(), note.size()).ok());
  SaveOptions o;
  o.checksum_block_size = 4096;
  auto saved = Save(dir, state, nullptr, o);
  EXPECT_TRUE(saved.ok()) << saved.status().ToString();
  Saved s;
  s.names = {kMetadataFileName, "data-00000.bin"};
  for (const auto& n : s.names) s.bytes.push_back(ReadAll(dir + "/" + n));
  return s;
}

Status FeedAll(const Saved& s, size_t piece, std::vector<std::string> bytes = {}) {
  if (bytes.empty()) bytes = s.bytes;
  std::vector<uint64_t> sizes;
  for (const auto& b : bytes) sizes.push_back(b.size());
  ArrivalCheck check("the replica under test", s.names, sizes);
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint64_t at = 0; at < bytes[i].size(); at += piece) {
      const uint64_t n = std::min<uint64_t>(piece, bytes[i].size() - at);
      check.Feed(i, at, bytes[i].data() + at, n);
    }
  }
  return check.Finish();
}

TEST(ArrivalCheck, ACleanPartPassesInPiecesOfEverySize) {
  const Saved s = SaveOne();
  for (size_t piece : {1, 7, 100, 4095, 4096, 4097, 10000, 1 << 20}) {
    EXPECT_TRUE(FeedAll(s, piece).ok()) << piece << ": " << FeedAll(s, piece).ToString();
  }
}

TEST(ArrivalCheck, AFlippedDataByteIsNamedWhereverItIs) {
  const Saved s = SaveOne();
  auto view = MetadataView::Parse(std::make_shared<const std::string>(s.bytes[0]), "test").value();
  int caught = 0, padding = 0;
  for (uint64_t at = 0; at < s.bytes[1].size(); at += 97) {
    std::vector<std::string> bytes = s.bytes;
    bytes[1][at] ^= 0x20;
    Status st = FeedAll(s, 3000, bytes);
    // A byte inside a chunk must be caught; padding between chunks is not part of any chunk.
    bool in_chunk = false;
    for (size_t e = 0; e < view.num_entries(); ++e) {
      for (size_t c = 0; c < view.entry(e).num_chunks; ++c) {
        const ChunkLocation loc = view.entry(e).chunk(c);
        in_chunk = in_chunk || (at >= loc.offset && at < loc.offset + loc.length);
      }
    }
    if (!in_chunk) {
      ++padding;
      continue;
    }
    ASSERT_EQ(st.code(), StatusCode::kCorrupt) << at << ": " << st.ToString();
    EXPECT_NE(st.message().find("checksum mismatch in 'data-00000.bin' bytes"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("the replica under test: entry '"), std::string::npos) << st.message();
    ++caught;
  }
  EXPECT_GT(caught, 100);
  EXPECT_GT(padding, 0);
}

TEST(ArrivalCheck, DamagedMetadataOrdersAndShortFilesAreRefused) {
  const Saved s = SaveOne();
  for (uint64_t at = 0; at < s.bytes[0].size(); at += 11) {
    std::vector<std::string> bytes = s.bytes;
    bytes[0][at] ^= 0x01;
    EXPECT_FALSE(FeedAll(s, 512, bytes).ok()) << "metadata byte " << at;
  }
  std::vector<uint64_t> sizes = {s.bytes[0].size(), s.bytes[1].size()};
  {
    ArrivalCheck check("r", s.names, sizes);
    check.Feed(1, 0, s.bytes[1].data(), 10);  // data before the metadata
    EXPECT_EQ(check.Finish().code(), StatusCode::kInternal);
  }
  {
    ArrivalCheck check("r", s.names, sizes);
    check.Feed(0, 0, s.bytes[0].data(), s.bytes[0].size());
    check.Feed(1, 100, s.bytes[1].data() + 100, 10);  // a gap
    EXPECT_NE(check.Finish().message().find("out of order"), std::string::npos) << check.Finish().ToString();
  }
  {
    ArrivalCheck check("r", s.names, sizes);
    check.Feed(0, 0, s.bytes[0].data(), s.bytes[0].size());
    check.Feed(1, 0, s.bytes[1].data(), s.bytes[1].size() - 1);  // cut short
    EXPECT_NE(check.Finish().message().find("did not arrive whole"), std::string::npos);
  }
  {
    ArrivalCheck check("r", {"data-00000.bin", kMetadataFileName}, {sizes[1], sizes[0]});  // metadata not first
    EXPECT_FALSE(check.Finish().ok());
  }
}

}  // namespace
}  // namespace manager_internal
}  // namespace distckpt
