// Compressed saves (SaveOptions::compression, FORMAT.md "Compressed chunks") through the real engine and the POSIX
// backend: every read path returns the exact bytes (resharded loads, region reads, device destinations, verification
// off), a block or chunk that does not shrink is stored raw, incremental saves refer to compressed chunks, and damage
// to any byte of a data file is an error naming the checkpoint, entry and file, never wrong data.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/cuda/host_copy_engine.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"

namespace distckpt {
namespace {

using testing_util::MakeTempDir;

constexpr uint64_t kBlock = 64 << 10;
constexpr uint64_t kRows = 256, kCols = 2048;  // bf16: 1 MiB, 16 checksum blocks
const MemoryLocation kDevice0{MemoryKind::kCuda, 0, reinterpret_cast<void*>(0x51)};

// bf16 weights as training leaves them: random mantissas, exponents in a narrow band.
std::vector<uint16_t> Weights(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = static_cast<uint16_t>((rng() & 0x807f) | ((0x3c + rng() % 4) << 7));
  return v;
}

struct Model {
  std::vector<uint16_t> w = Weights(kRows * kCols, 1);
  std::vector<float> adam = [] {
    std::vector<float> v(64 * 1024);
    std::mt19937 rng(2);
    std::normal_distribution<float> d(0.f, 1e-3f);
    for (auto& x : v) x = d(rng);
    return v;
  }();
  std::vector<uint8_t> noise = [] {
    std::vector<uint8_t> v(3 * kBlock + 100);
    std::mt19937 rng(3);
    for (auto& x : v) x = static_cast<uint8_t>(rng());
    return v;
  }();
  std::vector<float> on_device = std::vector<float>(40000, 0.25f);
  std::string text = std::string(5000, 'x') + "tokenizer state";
  int64_t step = 7;

  State AsState() {
    State s;
    EXPECT_TRUE(s.AddTensor("w", DType::kBF16, {kRows, kCols}).ok());
    for (uint64_t r = 0; r < kRows; r += kRows / 4) {
      EXPECT_TRUE(s.AddConstPiece("w", {r, 0}, {kRows / 4, kCols}, w.data() + r * kCols).ok());
    }
    EXPECT_TRUE(s.AddTensor("adam", DType::kF32, {64, 1024}).ok());
    EXPECT_TRUE(s.AddConstPiece("adam", {0, 0}, {64, 1024}, adam.data()).ok());
    EXPECT_TRUE(s.AddTensor("noise", DType::kU8, {noise.size()}).ok());
    EXPECT_TRUE(s.AddConstPiece("noise", {0}, {noise.size()}, noise.data()).ok());
    EXPECT_TRUE(s.AddTensor("dev", DType::kF32, {on_device.size()}).ok());
    EXPECT_TRUE(s.AddPieceIn("dev", {0}, {on_device.size()}, on_device.data(), kDevice0).ok());
    EXPECT_TRUE(s.AddBytes("text", text.data(), text.size()).ok());
    EXPECT_TRUE(s.AddTensor("step", DType::kI64, {}).ok());
    EXPECT_TRUE(s.AddPiece("step", {}, {}, &step).ok());
    EXPECT_TRUE(s.AddTensor("empty", DType::kF16, {0, 4}).ok());
    return s;
  }
};

SaveOptions Compressed(CopyEngine* engine, const std::string& base = "") {
  SaveOptions o;
  o.checksum_block_size = kBlock;
  o.compression = Codec::kZstdGrouped;
  o.sync = false;
  o.copy_engine = engine;
  o.base = base;
  return o;
}

uint64_t DirBytes(const std::string& dir, const char* prefix) {
  uint64_t n = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().filename().string().rfind(prefix, 0) == 0) n += f.file_size();
  }
  return n;
}

// Loads `path` with another sharding (column halves of "w", "adam" to a device) and compares with `want`.
Status LoadAndCompare(const std::string& path, const Model& want, bool verify = true) {
  HostCopyEngine engine;
  std::vector<uint16_t> left(kRows * kCols / 2), right(kRows * kCols / 2);
  std::vector<float> adam(want.adam.size()), dev(want.on_device.size());
  std::vector<uint8_t> noise(want.noise.size());
  std::string text(want.text.size(), '\0');
  int64_t step = 0;
  State s;
  DCKPT_RETURN_IF_ERROR(s.AddTensor("w", DType::kBF16, {kRows, kCols}));
  DCKPT_RETURN_IF_ERROR(s.AddPiece("w", {0, 0}, {kRows, kCols / 2}, left.data()));
  DCKPT_RETURN_IF_ERROR(s.AddPiece("w", {0, kCols / 2}, {kRows, kCols / 2}, right.data()));
  DCKPT_RETURN_IF_ERROR(s.AddTensor("adam", DType::kF32, {64, 1024}));
  DCKPT_RETURN_IF_ERROR(s.AddPieceIn("adam", {0, 0}, {64, 1024}, adam.data(), kDevice0));
  DCKPT_RETURN_IF_ERROR(s.AddTensor("noise", DType::kU8, {noise.size()}));
  DCKPT_RETURN_IF_ERROR(s.AddPiece("noise", {0}, {noise.size()}, noise.data()));
  DCKPT_RETURN_IF_ERROR(s.AddTensor("dev", DType::kF32, {dev.size()}));
  DCKPT_RETURN_IF_ERROR(s.AddPiece("dev", {0}, {dev.size()}, dev.data()));
  DCKPT_RETURN_IF_ERROR(s.AddBytes("text", text.data(), text.size()));
  DCKPT_RETURN_IF_ERROR(s.AddTensor("step", DType::kI64, {}));
  DCKPT_RETURN_IF_ERROR(s.AddPiece("step", {}, {}, &step));
  ReadOptions o;
  o.verify = verify;
  o.copy_engine = &engine;
  DCKPT_RETURN_IF_ERROR(Load(path, s, nullptr, o).status());
  for (uint64_t r = 0; r < kRows; ++r) {
    if (std::memcmp(left.data() + r * kCols / 2, want.w.data() + r * kCols, kCols) != 0 ||
        std::memcmp(right.data() + r * kCols / 2, want.w.data() + r * kCols + kCols / 2, kCols) != 0) {
      return Internal("w row " + std::to_string(r) + " differs");
    }
  }
  if (adam != want.adam) return Internal("adam differs");
  if (noise != want.noise) return Internal("noise differs");
  if (dev != want.on_device) return Internal("dev differs");
  if (text != want.text) return Internal("text differs");
  if (step != want.step) return Internal("step differs");
  return OkStatus();
}

TEST(Compression, SavesSmallerAndEveryReadIsExact) {
  HostCopyEngine engine;
  Model m;
  const std::string dir = MakeTempDir();
  State s = m.AsState();
  auto saved = Save(dir + "/c", s, nullptr, Compressed(&engine));
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  SaveOptions raw_options = Compressed(&engine);
  raw_options.compression = Codec::kRaw;
  ASSERT_TRUE(Save(dir + "/r", s, nullptr, raw_options).ok());
  const uint64_t compressed = DirBytes(dir + "/c", "data-"), raw = DirBytes(dir + "/r", "data-");
  EXPECT_LT(compressed, raw * 85 / 100) << compressed << " vs " << raw;
  EXPECT_LT(saved->bytes_written, saved->total_bytes);

  auto reader = Reader::Open(dir + "/c", nullptr, ReadOptions());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const MetadataView& meta = (*reader)->metadata();
  EXPECT_EQ(meta.format_major(), kFormatMajorCompression);
  const EntryView w = meta.entry(*meta.Find("w"));
  for (size_t c = 0; c < w.num_chunks; ++c) EXPECT_TRUE(w.compressed(c)) << c;
  EXPECT_FALSE(meta.entry(*meta.Find("noise")).compressed(0));  // random bytes do not shrink: a raw chunk
  EXPECT_FALSE(meta.entry(*meta.Find("dev")).compressed(0));    // device pieces are written raw
  EXPECT_TRUE(meta.entry(*meta.Find("text")).compressed(0));

  ASSERT_TRUE(LoadAndCompare(dir + "/c", m).ok()) << LoadAndCompare(dir + "/c", m).ToString();
  ASSERT_TRUE(LoadAndCompare(dir + "/c", m, /*verify=*/false).ok());

  // A region that starts and ends inside checksum blocks and crosses chunks.
  const std::vector<uint64_t> off = {60, 100}, len = {10, 1500};
  const Box box = *Box::Make(Span<const uint64_t>(off.data(), 2), Span<const uint64_t>(len.data(), 2));
  std::vector<uint16_t> region(10 * 1500);
  ASSERT_TRUE((*reader)->ReadRegion("w", box, region.data(), region.size() * 2).ok());
  for (uint64_t r = 0; r < 10; ++r) {
    ASSERT_EQ(std::memcmp(region.data() + r * 1500, m.w.data() + (60 + r) * kCols + 100, 3000), 0) << r;
  }
  EXPECT_TRUE((*reader)->VerifyAll(nullptr).ok());
  // Compressed chunks have no bytes to map: MapAll decodes them into memory the reader keeps, and MapChunk returns
  // their decoded bytes (beside raw chunks' mapped ones); a reader that maps nothing still decodes them.
  auto expect_w_chunks = [&](Reader* r) {
    const EntryView e = r->metadata().entry(*r->metadata().Find("w"));
    for (uint32_t c = 0; c < e.num_chunks; ++c) {
      auto bytes = r->MapChunk(*r->metadata().Find("w"), c);
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      const uint64_t r0 = e.chunk_offsets[2 * c], c0 = e.chunk_offsets[2 * c + 1];
      const uint64_t rows = e.chunk_lengths[2 * c], cols = e.chunk_lengths[2 * c + 1];
      ASSERT_EQ(bytes->size(), rows * cols * 2);
      for (uint64_t row = 0; row < rows; ++row) {
        ASSERT_EQ(std::memcmp(bytes->data() + row * cols * 2, m.w.data() + (r0 + row) * kCols + c0, cols * 2), 0)
            << "chunk " << c << " row " << row;
      }
    }
  };
  ASSERT_TRUE((*reader)->MapAll({}, nullptr).ok());
  expect_w_chunks(reader->get());
  auto noise = (*reader)->MapChunk(*meta.Find("noise"), 0);  // raw: in the mapping
  ASSERT_TRUE(noise.ok());
  ReadOptions unmapped;
  unmapped.map_files = false;
  auto plain = Reader::Open(dir + "/c", nullptr, unmapped);
  ASSERT_TRUE(plain.ok());
  expect_w_chunks(plain->get());
  EXPECT_EQ((*plain)->MapChunk(*meta.Find("noise"), 0).status().code(), StatusCode::kUnsupported);
}

TEST(Compression, LevelsAndOptionsAreChecked) {
  HostCopyEngine engine;
  Model m;
  State s = m.AsState();
  SaveOptions o = Compressed(&engine);
  o.compression_level = 1000;
  auto r = Save(MakeTempDir() + "/c", s, nullptr, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("compression level 1000"), std::string::npos);
  o.compression_level = 1;
  o.compression = static_cast<Codec>(9);
  EXPECT_EQ(Save(MakeTempDir() + "/c", s, nullptr, o).status().code(), StatusCode::kInvalidArgument);
  o.compression = Codec::kZstdGrouped;
  o.compression_level = -5;  // zstd's fast levels
  const std::string path = MakeTempDir() + "/fast";
  ASSERT_TRUE(Save(path, s, nullptr, o).ok());
  EXPECT_TRUE(LoadAndCompare(path, m).ok());
}

TEST(Compression, IncrementalSavesReferToCompressedChunks) {
  HostCopyEngine engine;
  Model m;
  const std::string dir = MakeTempDir();
  State s = m.AsState();
  ASSERT_TRUE(Save(dir + "/step-1", s, nullptr, Compressed(&engine)).ok());
  m.adam[5] += 1.0f;
  m.step = 8;
  State s2 = m.AsState();
  auto second = Save(dir + "/step-2", s2, nullptr, Compressed(&engine, dir + "/step-1"));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_GE(second->bytes_reused, kRows * kCols * 2);  // "w" is the base's, compressed there
  ASSERT_TRUE(LoadAndCompare(dir + "/step-2", m).ok()) << LoadAndCompare(dir + "/step-2", m).ToString();
  // And a raw incremental save of a compressed base.
  m.step = 9;
  State s3 = m.AsState();
  SaveOptions raw = Compressed(&engine, dir + "/step-2");
  raw.compression = Codec::kRaw;
  ASSERT_TRUE(Save(dir + "/step-3", s3, nullptr, raw).ok());
  EXPECT_TRUE(LoadAndCompare(dir + "/step-3", m).ok());
}

// Every byte of the data file, damaged in turn (a stride over the large chunks): the load fails naming the
// checkpoint and the file, or (a padding byte) returns exactly the saved values. Never wrong data, never a crash.
TEST(Compression, DamageToAnyByteIsDetected) {
  HostCopyEngine engine;
  Model m;
  const std::string dir = MakeTempDir();
  State s = m.AsState();
  ASSERT_TRUE(Save(dir + "/c", s, nullptr, Compressed(&engine)).ok());
  std::string data_file;
  for (const auto& f : std::filesystem::directory_iterator(dir + "/c")) {
    if (f.path().filename().string().rfind("data-", 0) == 0) data_file = f.path().string();
  }
  ASSERT_FALSE(data_file.empty());
  const uint64_t size = std::filesystem::file_size(data_file);
  int detected = 0, harmless = 0;
  for (uint64_t at = 0; at < size; at += 1 + at % 997) {
    std::fstream f(data_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x20));
    f.close();
    Status st = LoadAndCompare(dir + "/c", m);
    if (st.ok()) {
      ++harmless;
    } else {
      ASSERT_EQ(st.code(), StatusCode::kCorrupt) << "byte " << at << ": " << st.ToString();
      EXPECT_NE(st.message().find("checkpoint '" + dir + "/c'"), std::string::npos) << st.ToString();
      EXPECT_NE(st.message().find("data-"), std::string::npos) << st.ToString();
      ++detected;
    }
    std::fstream g(data_file, std::ios::in | std::ios::out | std::ios::binary);
    g.seekp(static_cast<std::streamoff>(at));
    g.put(c);
  }
  EXPECT_GT(detected, 100);
  EXPECT_TRUE(LoadAndCompare(dir + "/c", m).ok());
  (void)harmless;

  // A damaged compressed chunk is never handed out decoded: MapAll and MapChunk fail naming the checkpoint.
  {
    auto probe = Reader::Open(dir + "/c", nullptr, ReadOptions());
    ASSERT_TRUE(probe.ok());
    const size_t w = *(*probe)->metadata().Find("w");
    const ChunkLocation loc = (*probe)->metadata().entry(w).chunk(0);
    std::fstream f(data_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(loc.offset + 100));
    f.put('\x5a');
  }
  for (bool all : {true, false}) {
    auto r = Reader::Open(dir + "/c", nullptr, ReadOptions());
    ASSERT_TRUE(r.ok());
    const size_t w = *(*r)->metadata().Find("w");
    Status st = all ? (*r)->MapAll({w}, nullptr) : (*r)->MapChunk(w, 0).status();
    ASSERT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
    EXPECT_NE(st.message().find("checkpoint '" + dir + "/c'"), std::string::npos) << st.ToString();
  }
}

}  // namespace
}  // namespace distckpt
