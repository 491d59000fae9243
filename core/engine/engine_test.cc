// Single-process save/load through the engine: round trips of many mixed-dtype tensors saved in K pieces and
// loaded as M pieces, partial reads, corruption and truncation, and the atomic-commit guarantees.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/temp_dir.h"
#include "core/engine/engine_test_util.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/engine/save_async.h"

namespace distckpt {
namespace {

using testing_util::MakeTempDir;
using testing_util::ReadFileToString;
using testing_util::WriteAll;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The byte of element `linear` at byte `k`, for a tensor identified by `salt`.
uint8_t Pattern(uint64_t salt, uint64_t linear, uint64_t k) {
  return static_cast<uint8_t>((salt * 131 + linear * 7 + k * 3 + (linear >> 8)) % 251);
}

// A tensor split along dimension 0 into `parts` uneven row slabs (or the whole tensor for 0-d).
std::vector<Box> RowSplit(const std::vector<uint64_t>& shape, uint64_t parts, std::mt19937_64& rng) {
  Box whole = Box::Whole(shape).value();
  if (shape.empty() || shape[0] == 0) return {whole};
  std::vector<uint64_t> cuts{0, shape[0]};
  for (uint64_t i = 1; i < parts; ++i) cuts.push_back(rng() % (shape[0] + 1));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<Box> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    Box b = whole;
    b.offset[0] = cuts[i];
    b.length[0] = cuts[i + 1] - cuts[i];
    out.push_back(b);
  }
  return out;
}

// Splits along the last dimension into `parts` column slabs.
std::vector<Box> ColSplit(const std::vector<uint64_t>& shape, uint64_t parts) {
  Box whole = Box::Whole(shape).value();
  if (shape.empty() || shape.back() == 0) return {whole};
  uint32_t d = whole.ndim - 1;
  std::vector<Box> out;
  for (uint64_t i = 0; i < parts; ++i) {
    uint64_t lo = shape[d] * i / parts, hi = shape[d] * (i + 1) / parts;
    if (hi == lo) continue;
    Box b = whole;
    b.offset[d] = lo;
    b.length[d] = hi - lo;
    out.push_back(b);
  }
  return out;
}

struct TestTensor {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  uint64_t salt;
};

// Fills a row-major buffer of `box` with the pattern of the global tensor.
std::vector<uint8_t> FillBox(const TestTensor& t, const Box& box) {
  const uint64_t item = DTypeSize(t.dtype);
  std::vector<uint8_t> buf(box.volume() * item);
  std::vector<uint64_t> idx(box.ndim, 0);
  for (uint64_t e = 0; e < box.volume(); ++e) {
    uint64_t rem = e, linear = 0;
    for (int d = static_cast<int>(box.ndim) - 1; d >= 0; --d) {
      idx[d] = rem % box.length[d];
      rem /= box.length[d];
    }
    for (uint32_t d = 0; d < box.ndim; ++d) linear = linear * t.shape[d] + box.offset[d] + idx[d];
    for (uint64_t k = 0; k < item; ++k) buf[e * item + k] = Pattern(t.salt, linear, k);
  }
  return buf;
}

std::vector<TestTensor> MakeTensors(std::mt19937_64& rng, int count) {
  const DType dtypes[] = {DType::kF32,      DType::kBF16, DType::kI64, DType::kU8, DType::kC128,
                          DType::kF8E4M3FN, DType::kBool, DType::kF64, DType::kI16};
  std::vector<TestTensor> out;
  for (int i = 0; i < count; ++i) {
    TestTensor t;
    t.name = "t" + std::to_string(i) + (i % 3 == 0 ? ".weight" : ".bias");
    t.dtype = dtypes[rng() % (sizeof dtypes / sizeof dtypes[0])];
    uint32_t ndim = static_cast<uint32_t>(rng() % 4);
    for (uint32_t d = 0; d < ndim; ++d) t.shape.push_back(rng() % 9 == 0 ? 0 : 1 + rng() % 40);
    t.salt = i + 1;
    out.push_back(t);
  }
  // One large tensor so that chunks span several checksum blocks and several write segments.
  out.push_back(TestTensor{"big.matrix", DType::kF32, {1500, 2048}, 999});
  return out;
}

TEST(EngineTest, RoundTripKPiecesToMPieces) {
  std::mt19937_64 rng(42);
  std::vector<TestTensor> tensors = MakeTensors(rng, 40);
  const std::string path = MakeTempDir() + "/ckpt";

  // Save: every tensor in K row pieces.
  State save_state;
  std::vector<std::vector<uint8_t>> keep;
  for (const TestTensor& t : tensors) {
    ASSERT_TRUE(save_state.AddTensor(t.name, t.dtype, t.shape).ok());
    for (const Box& b : RowSplit(t.shape, 1 + rng() % 4, rng)) {
      keep.push_back(FillBox(t, b));
      std::vector<uint64_t> off(b.offset, b.offset + b.ndim), len(b.length, b.length + b.ndim);
      ASSERT_TRUE(save_state.AddPiece(t.name, off, len, keep.back().data()).ok());
    }
  }
  std::string blob = "rng-state-\x01\x02\x03";
  ASSERT_TRUE(save_state.AddBytes("rng", blob.data(), blob.size()).ok());
  save_state.SetUserMetadata("step", "100");
  SaveOptions so;
  so.checksum_block_size = 64 * 1024;  // several blocks per big chunk
  auto saved = Save(path, save_state, nullptr, so);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->num_entries, tensors.size() + 1);
  EXPECT_FALSE(Exists(path + "/STAGING"));

  // Load: every tensor in M column pieces (different from the save side), values checked byte by byte.
  State load_state;
  struct Dest {
    const TestTensor* t;
    Box box;
    std::vector<uint8_t> buf;
  };
  std::vector<Dest> dests;
  for (const TestTensor& t : tensors) {
    for (const Box& b : ColSplit(t.shape, 1 + rng() % 3)) dests.push_back(Dest{&t, b, {}});
  }
  for (const TestTensor& t : tensors) ASSERT_TRUE(load_state.AddTensor(t.name, t.dtype, t.shape).ok());
  for (Dest& d : dests) {
    d.buf.assign(d.box.volume() * DTypeSize(d.t->dtype), 0xEE);
    std::vector<uint64_t> off(d.box.offset, d.box.offset + d.box.ndim), len(d.box.length, d.box.length + d.box.ndim);
    ASSERT_TRUE(load_state.AddPiece(d.t->name, off, len, d.buf.data()).ok());
  }
  std::string blob_back(64, '\0');
  ASSERT_TRUE(load_state.AddBytes("rng", blob_back.data(), blob_back.size()).ok());
  auto loaded = Load(path, load_state, nullptr, ReadOptions{});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  for (const Dest& d : dests) {
    EXPECT_EQ(d.buf, FillBox(*d.t, d.box)) << d.t->name << " " << d.box.ToString();
  }
  EXPECT_EQ(load_state.FindBytes("rng")->loaded_size, blob.size());
  EXPECT_EQ(blob_back.substr(0, blob.size()), blob);

  auto reader = Reader::Open(path, nullptr, ReadOptions{});
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->metadata().FindUser("step").value(), "100");
  EXPECT_TRUE((*reader)->VerifyAll(nullptr).ok());
}

// Saves tensor `t` whole, in one chunk with 1 MiB checksum blocks, at `path`; returns its bytes.
std::vector<uint8_t> SaveOneChunk(const std::string& path, const TestTensor& t) {
  std::vector<uint8_t> data = FillBox(t, Box::Whole(t.shape).value());
  State s;
  EXPECT_TRUE(s.AddTensor(t.name, t.dtype, t.shape).ok());
  EXPECT_TRUE(s.AddPiece(t.name, std::vector<uint64_t>(t.shape.size(), 0), t.shape, data.data()).ok());
  SaveOptions so;
  so.checksum_block_size = 1 << 20;
  auto saved = Save(path, s, nullptr, so);
  EXPECT_TRUE(saved.ok()) << saved.status().ToString();
  return data;
}

TEST(EngineTest, PartialReadReadsOnlyNeededBytes) {
  const std::string path = MakeTempDir() + "/ckpt";
  TestTensor t{"m", DType::kF32, {4096, 1024}, 7};  // 16 MiB, one chunk
  const std::vector<uint8_t> data = SaveOneChunk(path, t);

  Box rows = Box::Make(std::vector<uint64_t>{1000, 0}, std::vector<uint64_t>{10, 1024}).value();  // 40 KiB
  std::vector<uint8_t> out(rows.volume() * 4);
  // The counts below are of preads; mapped reads of cached data are checked in MappedReadsOfCachedData.
  ReadOptions pread_only;
  pread_only.map_files = false;
  {
    ReadOptions ro = pread_only;
    ro.verify = false;
    auto r = Reader::Open(path, nullptr, ro).value();
    ASSERT_TRUE(r->ReadRegion("m", rows, out.data(), out.size()).ok());
    EXPECT_EQ(out, FillBox(t, rows));
    EXPECT_EQ(r->io_stats().bytes_read, out.size());  // exactly the bytes needed
  }
  {
    auto r = Reader::Open(path, nullptr, pread_only).value();
    ASSERT_TRUE(r->ReadRegion("m", rows, out.data(), out.size()).ok());
    EXPECT_EQ(out, FillBox(t, rows));
    // Verified: only the checksum block that holds the rows (1 MiB of 16 MiB).
    EXPECT_EQ(r->io_stats().bytes_read, 1u << 20);
  }
  {
    // A column: strided, sparse. Without verification the reader reads run by run, not the whole chunk.
    ReadOptions ro = pread_only;
    ro.verify = false;
    auto r = Reader::Open(path, nullptr, ro).value();
    Box col = Box::Make(std::vector<uint64_t>{0, 5}, std::vector<uint64_t>{4096, 1}).value();
    std::vector<uint8_t> c(4096 * 4);
    ASSERT_TRUE(r->ReadRegion("m", col, c.data(), c.size()).ok());
    EXPECT_EQ(c, FillBox(t, col));
    EXPECT_LT(r->io_stats().bytes_read, data.size() / 8);
  }
}

// Data in the page cache is read through a mapping of the file: the same bytes, no preads, and only the needed bytes
// (plus the checksum blocks that hold them, hashed) are touched.
TEST(EngineTest, MappedReadsOfCachedData) {
  const std::string path = MakeTempDir() + "/ckpt";
  TestTensor t{"m", DType::kF32, {4096, 1024}, 11};  // 16 MiB, one chunk
  const std::vector<uint8_t> data = SaveOneChunk(path, t);
  const std::string file = path + "/data-00000.bin";
  ASSERT_EQ(ReadFileToString(file).size(), data.size());  // now in the page cache (large saves bypass it)

  auto r = Reader::Open(path, nullptr, ReadOptions{}).value();
  auto f = r->File(0);
  ASSERT_TRUE(f.ok());
  if ((*f)->Map() == nullptr || !(*f)->Resident(0, data.size())) GTEST_SKIP() << "this filesystem cannot be mapped";
  Box cols = Box::Make(std::vector<uint64_t>{0, 300}, std::vector<uint64_t>{4096, 100}).value();
  std::vector<uint8_t> out(cols.volume() * 4);
  ASSERT_TRUE(r->ReadRegion("m", cols, out.data(), out.size()).ok());
  EXPECT_EQ(out, FillBox(t, cols));
  IoStats io = r->io_stats();
  EXPECT_EQ(io.bytes_read, 0u);
  EXPECT_EQ(io.read_calls, 0u);
  EXPECT_EQ(io.bytes_mapped, out.size());
  EXPECT_EQ(io.bytes_verified, data.size());  // every block holds some of the columns

  // The same through pread, for comparison: identical bytes.
  ReadOptions ro;
  ro.map_files = false;
  auto r2 = Reader::Open(path, nullptr, ro).value();
  std::vector<uint8_t> out2(out.size());
  ASSERT_TRUE(r2->ReadRegion("m", cols, out2.data(), out2.size()).ok());
  EXPECT_EQ(out2, out);
  EXPECT_EQ(r2->io_stats().bytes_mapped, 0u);
  EXPECT_EQ(r2->io_stats().bytes_read, data.size());

  // A byte flipped in the cached file is caught on the mapped path too, naming the tensor, the file and the range.
  {
    std::fstream fs(file, std::ios::in | std::ios::out | std::ios::binary);
    fs.seekp(5 * (1 << 20) + 12345);
    fs.put(static_cast<char>(data[5 * (1 << 20) + 12345] ^ 0x10));
  }
  auto r3 = Reader::Open(path, nullptr, ReadOptions{}).value();
  Status st = r3->ReadRegion("m", cols, out.data(), out.size());
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("'m'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("data-00000.bin"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("bytes 5242880..6291456"), std::string::npos) << st.message();
  EXPECT_GT(r3->io_stats().bytes_mapped + r3->io_stats().bytes_verified, 0u);
}

// Saves a small two-tensor checkpoint and returns its path.
std::string SaveSmall(const std::string& dir, const std::string& name = "ckpt") {
  static std::vector<float> a(1000), b(3000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i) * 2;
  State s;
  EXPECT_TRUE(s.AddTensor("layer.a", DType::kF32, {1000}).ok());
  EXPECT_TRUE(s.AddPiece("layer.a", {0}, {1000}, a.data()).ok());
  EXPECT_TRUE(s.AddTensor("layer.b", DType::kF32, {30, 100}).ok());
  EXPECT_TRUE(s.AddPiece("layer.b", {0, 0}, {30, 100}, b.data()).ok());
  std::string path = dir + "/" + name;
  auto r = Save(path, s, nullptr, SaveOptions{});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return path;
}

Status LoadSmall(const std::string& path, bool verify = true, bool map_files = true) {
  std::vector<float> a(1000), b(3000);
  State s;
  (void)s.AddTensor("layer.a", DType::kF32, {1000});
  (void)s.AddPiece("layer.a", {0}, {1000}, a.data());
  (void)s.AddTensor("layer.b", DType::kF32, {30, 100});
  (void)s.AddPiece("layer.b", {0, 0}, {30, 100}, b.data());
  ReadOptions ro;
  ro.verify = verify;
  ro.map_files = map_files;
  return Load(path, s, nullptr, ro).status();
}

TEST(EngineBadInputTest, FlippedDataByteNamesTensorAndFile) {
  std::string path = SaveSmall(MakeTempDir());
  auto r = Reader::Open(path, nullptr, ReadOptions{}).value();
  EntryView e = r->metadata().entry(r->metadata().Find("layer.b").value());
  ChunkLocation loc = e.chunk(0);
  std::string file = path + "/" + std::string(r->metadata().file_name(loc.file));
  std::string data = ReadFileToString(file);
  data[loc.offset + 17] ^= 0x40;
  WriteAll(file, data);
  Status st = LoadSmall(path);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("layer.b"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("data-00000.bin"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
  // With verification off the (wrong) bytes load: that is what "off" means.
  EXPECT_TRUE(LoadSmall(path, /*verify=*/false).ok());
  // verify reports it too.
  auto r2 = Reader::Open(path, nullptr, ReadOptions{}).value();
  EXPECT_EQ(r2->VerifyAll(nullptr).code(), StatusCode::kCorrupt);
}

TEST(EngineBadInputTest, TruncatedAndMissingDataFiles) {
  std::string path = SaveSmall(MakeTempDir());
  std::string file = path + "/data-00000.bin";
  std::string data = ReadFileToString(file);
  WriteAll(file, data.substr(0, data.size() - 100));
  Status st = LoadSmall(path);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("data-00000.bin"), std::string::npos) << st.message();
  ::unlink(file.c_str());
  st = LoadSmall(path);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("missing"), std::string::npos) << st.message();
}

TEST(EngineBadInputTest, CorruptAndTruncatedMetadataNeverCrash) {
  std::string path = SaveSmall(MakeTempDir());
  std::string meta_path = path + "/" + kMetadataFileName;
  const std::string meta = ReadFileToString(meta_path);
  std::mt19937_64 rng(7);
  int rejected = 0;
  for (int i = 0; i < 300; ++i) {
    std::string bad = meta;
    if (i % 3 == 0) {
      bad.resize(rng() % meta.size());
    } else {
      for (int k = 0; k < 1 + i % 4; ++k) bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    }
    WriteAll(meta_path, bad);
    // The metadata is mapped (the default) or read into memory: both paths see the same bytes.
    Status st = LoadSmall(path, /*verify=*/true, /*map_files=*/i % 2 == 0);
    // Either rejected with a clear error, or (a flip in padding/unused bytes) loads the right values.
    if (!st.ok()) {
      ++rejected;
      EXPECT_FALSE(st.message().empty());
    }
  }
  EXPECT_GT(rejected, 100);
  for (bool map : {true, false}) {
    WriteAll(meta_path, "");
    Status empty = LoadSmall(path, true, map);
    EXPECT_EQ(empty.code(), StatusCode::kCorrupt) << empty.ToString();
    EXPECT_NE(empty.message().find(path), std::string::npos) << empty.message();
  }
  WriteAll(meta_path, meta);
  EXPECT_TRUE(LoadSmall(path).ok());
  ::unlink(meta_path.c_str());
  Status st = LoadSmall(path);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
}

TEST(EngineBadInputTest, WrongDtypeShapeAndMissingEntry) {
  std::string path = SaveSmall(MakeTempDir());
  std::vector<double> a(1000);
  State s;
  ASSERT_TRUE(s.AddTensor("layer.a", DType::kF64, {1000}).ok());
  ASSERT_TRUE(s.AddPiece("layer.a", {0}, {1000}, a.data()).ok());
  Status st = Load(path, s, nullptr, ReadOptions{}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("F32"), std::string::npos) << st.message();
  State s2;
  ASSERT_TRUE(s2.AddTensor("layer.zzz", DType::kF32, {1000}).ok());
  st = Load(path, s2, nullptr, ReadOptions{}).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("layer.zzz"), std::string::npos);
  State s3;
  std::vector<float> f(1000);
  ASSERT_TRUE(s3.AddTensor("layer.a", DType::kF32, {10, 100}).ok());
  st = Load(path, s3, nullptr, ReadOptions{}).status();
  EXPECT_NE(st.message().find("shape"), std::string::npos) << st.message();
}

TEST(EngineCommitTest, ExistingPathIsNotOverwrittenUnlessAsked) {
  std::string dir = MakeTempDir();
  std::string path = SaveSmall(dir);
  std::vector<float> a(1000, 1.0f);
  State s;
  ASSERT_TRUE(s.AddTensor("layer.a", DType::kF32, {1000}).ok());
  ASSERT_TRUE(s.AddPiece("layer.a", {0}, {1000}, a.data()).ok());
  EXPECT_EQ(Save(path, s, nullptr, SaveOptions{}).status().code(), StatusCode::kExists);
  EXPECT_TRUE(LoadSmall(path).ok());
  SaveOptions so;
  so.overwrite = true;
  ASSERT_TRUE(Save(path, s, nullptr, so).ok());
  EXPECT_EQ(LoadSmall(path).code(), StatusCode::kNotFound);  // layer.b is gone: the new checkpoint replaced it
}

TEST(EngineCommitTest, SaveThatFailsHalfwayLeavesNothing) {
  // A real write failure: the child process may not write files over 1 MiB (RLIMIT_FSIZE -> EFBIG), so its 8 MiB save
  // fails after writing part of the data. Nothing may appear at the target, and an earlier checkpoint is untouched.
  std::string dir = MakeTempDir();
  std::string earlier = SaveSmall(dir, "earlier");
  std::string before_meta = ReadFileToString(earlier + "/" + kMetadataFileName);
  std::string before_data = ReadFileToString(earlier + "/data-00000.bin");
  std::string target = dir + "/failed";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &lim);
    std::vector<float> big(2 << 20, 3.0f);
    State s;
    (void)s.AddTensor("big", DType::kF32, {big.size()});
    (void)s.AddPiece("big", {0}, {big.size()}, big.data());
    SaveOptions so;
    so.io_threads = 2;
    Status st = Save(target, s, nullptr, so).status();
    _exit(st.ok() ? 0 : (st.code() == StatusCode::kIo || st.code() == StatusCode::kNoSpace ? 3 : 4));
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 3) << "the save should fail with an I/O error";
  EXPECT_FALSE(Exists(target));
  // The staging directory was removed by the abort.
  auto names = DefaultStorage()->ListDir(dir).value();
  for (const std::string& n : names) EXPECT_EQ(n.find("dckpt-staging"), std::string::npos) << n;
  EXPECT_EQ(ReadFileToString(earlier + "/" + kMetadataFileName), before_meta);
  EXPECT_EQ(ReadFileToString(earlier + "/data-00000.bin"), before_data);
  EXPECT_TRUE(LoadSmall(earlier).ok());
}

TEST(EngineCommitTest, InvalidStateFailsBeforeWritingAnything) {
  std::string dir = MakeTempDir();
  std::vector<float> a(10);
  State s;
  ASSERT_TRUE(s.AddTensor("x", DType::kF32, {20}).ok());
  ASSERT_TRUE(s.AddPiece("x", {0}, {10}, a.data()).ok());  // hole: rows 10..20 missing
  Status st = Save(dir + "/holey", s, nullptr, SaveOptions{}).status();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'x'"), std::string::npos) << st.message();
  EXPECT_FALSE(Exists(dir + "/holey"));
  EXPECT_TRUE(DefaultStorage()->ListDir(dir).value().empty());
}

TEST(EngineAsyncTest, CallerMayMutateRightAfterReturn) {
  std::string dir = MakeTempDir();
  std::vector<float> w(3 << 20);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  std::string blob = "step=5";
  State s;
  ASSERT_TRUE(s.AddTensor("w", DType::kF32, {3, 1 << 20}).ok());
  ASSERT_TRUE(s.AddPiece("w", {0, 0}, {3, 1 << 20}, w.data()).ok());
  ASSERT_TRUE(s.AddBytes("meta", blob.data(), blob.size()).ok());
  auto f = SaveAsync(dir + "/async", s, nullptr, SaveOptions{});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->staged_bytes(), 4096 * ((w.size() * 4 + 4095) / 4096) + blob.size());
  // The caller's buffers are free again: scribble over them while the save runs.
  std::fill(w.begin(), w.end(), -1.0f);
  blob.assign(blob.size(), 'x');
  auto r = (*f)->Wait(std::chrono::milliseconds(60000));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*f)->done());
  std::vector<float> back(w.size());
  auto reader = Reader::Open(dir + "/async", nullptr, ReadOptions{}).value();
  ASSERT_TRUE(
      reader->ReadRegion("w", Box::Whole(std::vector<uint64_t>{3, 1 << 20}).value(), back.data(), back.size() * 4)
          .ok());
  for (size_t i = 0; i < back.size(); i += 4099) ASSERT_EQ(back[i], static_cast<float>(i));
  std::string meta(16, '\0');
  EXPECT_EQ(reader->ReadBytes("meta", meta.data(), meta.size()).value(), 6u);
  EXPECT_EQ(meta.substr(0, 6), "step=5");
}

TEST(EngineAsyncTest, FailureIsReportedThroughTheFuture) {
  std::string dir = MakeTempDir();
  std::string path = SaveSmall(dir);
  std::vector<float> a(1000);
  State s;
  ASSERT_TRUE(s.AddTensor("layer.a", DType::kF32, {1000}).ok());
  ASSERT_TRUE(s.AddPiece("layer.a", {0}, {1000}, a.data()).ok());
  auto f = SaveAsync(path, s, nullptr, SaveOptions{});  // the path exists
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->Wait(std::chrono::milliseconds(60000)).status().code(), StatusCode::kExists);
}

}  // namespace
}  // namespace distckpt
