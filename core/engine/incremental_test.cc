// Incremental saves (FORMAT.md 4.1) through the real engine and the POSIX backend: only changed chunks are written,
// references are followed by every read, chains refer one hop, and a base that was replaced, removed or named wrongly
// is refused with a message naming both checkpoints, never read.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/engine/base_checkpoint.h"
#include "core/engine/engine_test_util.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"

namespace distckpt {
namespace {

using testing_util::MakeTempDir;

constexpr uint64_t kRows = 64, kCols = 1024;  // 256 KiB of float per tensor, saved as 4 row pieces

// A model: "frozen" (never changes), "adapter" (changes every step), a bytes entry and a step counter. Each tensor is
// held as 4 row pieces, so a save has 4 chunks per tensor.
struct Model {
  std::vector<float> frozen = std::vector<float>(kRows * kCols);
  std::vector<float> adapter = std::vector<float>(kRows * kCols);
  std::string rng = "rng-state-0";
  int64_t step = 0;

  explicit Model(int step_) : step(step_) {
    for (size_t i = 0; i < frozen.size(); ++i) frozen[i] = static_cast<float>(i % 977) * 0.5f;
    for (size_t i = 0; i < adapter.size(); ++i) adapter[i] = static_cast<float>((i + 31 * step_) % 613);
    rng = "rng-state-" + std::to_string(step_);
  }

  State AsState() {
    State s;
    for (auto* t : {&frozen, &adapter}) {
      const std::string name = t == &frozen ? "frozen" : "adapter";
      EXPECT_TRUE(s.AddTensor(name, DType::kF32, {kRows, kCols}).ok());
      for (uint64_t r = 0; r < kRows; r += kRows / 4) {
        EXPECT_TRUE(s.AddPiece(name, {r, 0}, {kRows / 4, kCols}, t->data() + r * kCols).ok());
      }
    }
    EXPECT_TRUE(s.AddBytes("rng", rng.data(), rng.size()).ok());
    EXPECT_TRUE(s.AddTensor("step", DType::kI64, {}).ok());
    EXPECT_TRUE(s.AddPiece("step", {}, {}, &step).ok());
    return s;
  }
};

Result<SaveSummary> SaveModel(Model& m, const std::string& path, const std::string& base, uint32_t full_every = 0) {
  SaveOptions o;
  o.base = base;
  o.full_every = full_every;
  o.sync = false;
  State s = m.AsState();
  return Save(path, s, nullptr, o);
}

// Loads `path` into a fresh model with another sharding (2 column halves) and compares every value with `want`.
void ExpectLoads(const std::string& path, const Model& want) {
  std::vector<float> frozen(kRows * kCols), adapter(kRows * kCols);
  std::string rng(want.rng.size(), '\0');
  int64_t step = -1;
  State s;
  ASSERT_TRUE(s.AddTensor("frozen", DType::kF32, {kRows, kCols}).ok());
  ASSERT_TRUE(s.AddTensor("adapter", DType::kF32, {kRows, kCols}).ok());
  std::vector<std::vector<float>> halves(4, std::vector<float>(kRows * kCols / 2));
  for (int h = 0; h < 2; ++h) {
    ASSERT_TRUE(s.AddPiece("frozen", {0, h * kCols / 2}, {kRows, kCols / 2}, halves[h].data()).ok());
    ASSERT_TRUE(s.AddPiece("adapter", {0, h * kCols / 2}, {kRows, kCols / 2}, halves[2 + h].data()).ok());
  }
  ASSERT_TRUE(s.AddBytes("rng", rng.data(), rng.size()).ok());
  ASSERT_TRUE(s.AddTensor("step", DType::kI64, {}).ok());
  ASSERT_TRUE(s.AddPiece("step", {}, {}, &step).ok());
  auto loaded = Load(path, s, nullptr, ReadOptions());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  for (uint64_t r = 0; r < kRows; ++r) {
    for (uint64_t c = 0; c < kCols; ++c) {
      const uint64_t h = c / (kCols / 2), hc = c % (kCols / 2);
      ASSERT_EQ(halves[h][r * kCols / 2 + hc], want.frozen[r * kCols + c]) << path << " frozen " << r << "," << c;
      ASSERT_EQ(halves[2 + h][r * kCols / 2 + hc], want.adapter[r * kCols + c]) << path << " adapter " << r << "," << c;
    }
  }
  EXPECT_EQ(rng, want.rng);
  EXPECT_EQ(step, want.step);
}

MetadataView Metadata(const std::string& path) {
  auto reader = Reader::Open(path, nullptr, ReadOptions());
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  return (*reader)->metadata();
}

constexpr uint64_t kTensorBytes = kRows * kCols * 4;

// Opens `path` and verifies every chunk (a failure to open counts too).
Status VerifyStatus(const std::string& path) {
  auto reader = Reader::Open(path, nullptr, ReadOptions());
  if (!reader.ok()) return reader.status();
  return (*reader)->VerifyAll(nullptr);
}

TEST(IncrementalTest, OnlyChangedChunksAreWrittenAndEveryReadFollowsTheReferences) {
  const std::string dir = MakeTempDir("incr-");
  Model m0(0), m1(1);
  auto full = SaveModel(m0, dir + "/step-0", "");
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_EQ(full->bytes_reused, 0u);
  EXPECT_EQ(Metadata(dir + "/step-0").format_major(), 1) << "a save without references stays 1.x";
  EXPECT_EQ(Metadata(dir + "/step-0").format_minor(), kFormatMinor);

  auto incr = SaveModel(m1, dir + "/step-1", dir + "/step-0");
  ASSERT_TRUE(incr.ok()) << incr.status().ToString();
  EXPECT_EQ(incr->bytes_reused, kTensorBytes) << "the frozen tensor is referred to";
  EXPECT_EQ(incr->bytes_written, kTensorBytes + m1.rng.size() + 8) << "the adapter, rng and step are written";
  const MetadataView meta = Metadata(dir + "/step-1");
  EXPECT_EQ(meta.format_major(), kFormatMajorReferences);
  ASSERT_EQ(meta.num_bases(), 1u);
  EXPECT_EQ(meta.base_name(0), "step-0");
  EXPECT_EQ(meta.chain_length(), 1u);
  EXPECT_EQ(meta.base_metadata_checksum(0), *Metadata(dir + "/step-0").checksum());
  ExpectLoads(dir + "/step-1", m1);
  ExpectLoads(dir + "/step-0", m0);
  EXPECT_LT(std::filesystem::file_size(dir + "/step-1/data-00000.bin"),
            std::filesystem::file_size(dir + "/step-0/data-00000.bin") * 2 / 3);

  // Verification reads the referenced bytes too.
  auto reader = Reader::Open(dir + "/step-1", nullptr, ReadOptions());
  ASSERT_TRUE(reader.ok());
  Status verified = (*reader)->VerifyAll(nullptr);
  EXPECT_TRUE(verified.ok()) << verified.ToString();
  EXPECT_GE((*reader)->io_stats().bytes_verified, 2 * kTensorBytes);

  // A damaged byte of the base's file is caught when reading the increment, naming the base's file.
  const std::string base_file = dir + "/step-0/data-00000.bin";
  {
    const MetadataView base = Metadata(dir + "/step-0");
    const uint64_t at = base.entry(*base.Find("frozen")).chunk(2).offset + 100;
    std::fstream f(base_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put('\x5a');
  }
  auto damaged = Reader::Open(dir + "/step-1", nullptr, ReadOptions());
  ASSERT_TRUE(damaged.ok());
  Status st = (*damaged)->VerifyAll(nullptr);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  EXPECT_NE(st.message().find("step-0/data-00000.bin"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("'frozen'"), std::string::npos) << st.ToString();
}

TEST(IncrementalTest, AChainRefersWhereTheBytesLieAndFullEveryBoundsIt) {
  const std::string dir = MakeTempDir("incr-");
  Model m0(0), m1(1), m2(2);
  ASSERT_TRUE(SaveModel(m0, dir + "/a", "").ok());
  ASSERT_TRUE(SaveModel(m1, dir + "/b", "a").ok());  // by name
  m2.rng = m1.rng;                                   // unchanged since b: its bytes lie in b
  auto c = SaveModel(m2, dir + "/c", dir + "/b");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->bytes_reused, kTensorBytes + m1.rng.size());
  const MetadataView meta = Metadata(dir + "/c");
  ASSERT_EQ(meta.num_bases(), 2u);
  std::vector<std::string> names{std::string(meta.base_name(0)), std::string(meta.base_name(1))};
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b"})) << "frozen from a directly, rng from b";
  EXPECT_EQ(meta.chain_length(), 2u);
  ExpectLoads(dir + "/c", m2);

  // The third save of a chain with full_every=3 is written whole, and the next one starts a chain again.
  auto d = SaveModel(m2, dir + "/d", "c", 3);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->bytes_reused, 0u);
  EXPECT_EQ(Metadata(dir + "/d").num_bases(), 0u);
  EXPECT_EQ(Metadata(dir + "/d").format_major(), 1);
  auto e = SaveModel(m2, dir + "/e", "d", 3);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->bytes_reused, 2 * kTensorBytes + m2.rng.size() + 8) << "nothing changed";
  EXPECT_EQ(e->bytes_written, 0u);
  ExpectLoads(dir + "/e", m2);
}

TEST(IncrementalTest, AReplacedOrRemovedBaseIsRefusedNamingBoth) {
  const std::string dir = MakeTempDir("incr-");
  Model m0(0), m1(1), other(7);
  ASSERT_TRUE(SaveModel(m0, dir + "/a", "").ok());
  ASSERT_TRUE(SaveModel(m1, dir + "/b", "a").ok());
  // Replaced by another checkpoint behind the library's back (an overwrite is refused: see below): b's references
  // would now read other bytes.
  std::filesystem::rename(dir + "/a", dir + "/a-moved");
  ASSERT_TRUE(SaveModel(other, dir + "/a", "").ok());
  const Status replaced = VerifyStatus(dir + "/b");
  EXPECT_EQ(replaced.code(), StatusCode::kCorrupt);
  EXPECT_NE(replaced.message().find("checkpoint '" + dir + "/b' refers to base checkpoint 'a'"), std::string::npos)
      << replaced.ToString();
  EXPECT_NE(replaced.message().find("metadata changed"), std::string::npos) << replaced.ToString();

  std::filesystem::remove_all(dir + "/a");
  const Status removed = VerifyStatus(dir + "/b");
  EXPECT_EQ(removed.code(), StatusCode::kCorrupt);
  EXPECT_NE(removed.message().find("cannot be read"), std::string::npos) << removed.ToString();
}

TEST(IncrementalTest, ABaseMustBeAnExistingSiblingThatIsNotTheCheckpoint) {
  const std::string dir = MakeTempDir("incr-");
  const std::string elsewhere = MakeTempDir("incr-other-");
  Model m0(0);
  ASSERT_TRUE(SaveModel(m0, dir + "/a", "").ok());
  ASSERT_TRUE(SaveModel(m0, elsewhere + "/x", "").ok());
  auto not_sibling = SaveModel(m0, dir + "/b", elsewhere + "/x");
  EXPECT_EQ(not_sibling.status().code(), StatusCode::kInvalidArgument) << not_sibling.status().ToString();
  EXPECT_NE(not_sibling.status().message().find("must be a sibling"), std::string::npos);
  auto escape = SaveModel(m0, dir + "/b", "..");
  EXPECT_EQ(escape.status().code(), StatusCode::kInvalidArgument) << escape.status().ToString();
  auto itself = SaveModel(m0, dir + "/a", "a");
  EXPECT_EQ(itself.status().code(), StatusCode::kInvalidArgument) << itself.status().ToString();
  auto missing = SaveModel(m0, dir + "/b", "nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir + "/b")) << "a refused save leaves nothing";
}

// A checkpoint whose reference names a file its base does not list as its own (here: the base's metadata itself) is
// refused before anything is read from it.
TEST(IncrementalTest, AReferenceToAFileTheBaseDoesNotListIsRefused) {
  const std::string dir = MakeTempDir("incr-");
  Model m0(0), m1(1);
  ASSERT_TRUE(SaveModel(m0, dir + "/a", "").ok());
  ASSERT_TRUE(SaveModel(m1, dir + "/b", "a").ok());
  MetadataRecord r = Metadata(dir + "/b").ToRecord();
  bool changed = false;
  for (DataFileRecord& f : r.files) {
    if (f.base != 0) f.name = "README", changed = true;
  }
  ASSERT_TRUE(changed);
  testing_util::WriteAll(dir + "/a/README", std::string(1 << 20, 'x'));
  auto encoded = EncodeMetadata(r);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  testing_util::WriteAll(dir + "/b/metadata.dckpt", *encoded);
  const Status st = VerifyStatus(dir + "/b");
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("does not list as a file of its own"), std::string::npos) << st.ToString();
}

// Hostile references: to itself, and two checkpoints referring to each other (a cycle no honest writer can make, as
// each would have to record the other's final checksum). Both are refused with the reason; nothing loops.
TEST(IncrementalTest, ASelfReferenceAndACycleAreRefused) {
  const std::string dir = MakeTempDir("incr-");
  Model m0(0), m1(1);
  ASSERT_TRUE(SaveModel(m0, dir + "/a", "").ok());
  ASSERT_TRUE(SaveModel(m1, dir + "/b", "a").ok());
  MetadataRecord self = Metadata(dir + "/b").ToRecord();
  self.bases[0].name = "b";
  testing_util::WriteAll(dir + "/b/metadata.dckpt", *EncodeMetadata(self));
  Status st = VerifyStatus(dir + "/b");
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  EXPECT_NE(st.message().find("which is itself"), std::string::npos) << st.ToString();

  // b -> a and a -> b, each recording the other's metadata as it is now.
  ASSERT_TRUE(SaveModel(m1, dir + "/c", "a").ok());
  MetadataRecord c = Metadata(dir + "/c").ToRecord();
  MetadataRecord a_rec = Metadata(dir + "/a").ToRecord();
  a_rec.bases = {{"c", *Metadata(dir + "/c").checksum(), Metadata(dir + "/c").buffer_size()}};
  a_rec.chain_length = 1;
  a_rec.files.push_back({c.files[0].name, c.files[0].size, 1});
  testing_util::WriteAll(dir + "/a/metadata.dckpt", *EncodeMetadata(a_rec));
  // c's base changed under it: refused. a (whose new reference no chunk uses) reads its own chunks: a reader follows
  // one hop and never a base's own references, so a cycle cannot make it loop.
  const Status cyc = VerifyStatus(dir + "/c");
  EXPECT_EQ(cyc.code(), StatusCode::kCorrupt) << cyc.ToString();
  EXPECT_NE(cyc.message().find("metadata changed"), std::string::npos) << cyc.ToString();
  EXPECT_TRUE(VerifyStatus(dir + "/a").ok());
}

// A checkpoint saved without chunk hashes (the manager's node-local parts) records none; as a base it offers nothing
// to compare with, so the next save is written whole (and is still a valid, self-contained checkpoint).
TEST(IncrementalTest, ABaseWithoutChunkHashesIsNotReused) {
  const std::string dir = MakeTempDir("incr-");
  Model m0(0);
  SaveOptions o;
  o.sync = false;
  o.chunk_hashes = false;
  State s = m0.AsState();
  ASSERT_TRUE(Save(dir + "/a", s, nullptr, o).ok());
  const MetadataView meta = Metadata(dir + "/a");
  for (size_t i = 0; i < meta.num_entries(); ++i) EXPECT_TRUE(meta.entry(i).chunk_hashes.empty());
  auto b = SaveModel(m0, dir + "/b", "a");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->bytes_reused, 0u);
  EXPECT_EQ(Metadata(dir + "/b").num_bases(), 0u);
  ExpectLoads(dir + "/b", m0);
}

// Overwriting a checkpoint that another refers to is refused, naming the dependents; once they are gone it works.
TEST(IncrementalTest, ABaseThatOthersReferToCannotBeOverwritten) {
  const std::string dir = MakeTempDir("incr-");
  Model m0(0), m1(1);
  ASSERT_TRUE(SaveModel(m0, dir + "/a", "").ok());
  ASSERT_TRUE(SaveModel(m1, dir + "/b", "a").ok());
  ASSERT_TRUE(SaveModel(m1, dir + "/c", "a").ok());
  auto deps = Dependents(DefaultStorage(), dir + "/a");
  ASSERT_TRUE(deps.ok());
  EXPECT_EQ(*deps, (std::vector<std::string>{"b", "c"}));
  SaveOptions o;
  o.overwrite = true;
  o.sync = false;
  State s = m1.AsState();
  auto over = Save(dir + "/a", s, nullptr, o);
  EXPECT_EQ(over.status().code(), StatusCode::kState) << over.status().ToString();
  EXPECT_NE(over.status().message().find("would break 2 incremental checkpoint(s)"), std::string::npos);
  EXPECT_NE(over.status().message().find("'b', 'c'"), std::string::npos) << over.status().ToString();
  ExpectLoads(dir + "/b", m1);
  std::filesystem::remove_all(dir + "/b");
  std::filesystem::remove_all(dir + "/c");
  EXPECT_TRUE(Save(dir + "/a", s, nullptr, o).ok());
}

}  // namespace
}  // namespace distckpt
