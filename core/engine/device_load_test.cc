// Loads into device pieces through the load staging pipeline, with the host copy engine standing in for CUDA: the
// destinations are host buffers marked as device memory, so everything but the copy itself (pinned reads, host
// verification, strided batching, back-pressure, failures, ordering) runs exactly as on a GPU machine.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/temp_dir.h"
#include "core/cuda/host_copy_engine.h"
#include "core/cuda/pinned_pool.h"
#include "core/engine/engine_test_util.h"
#include "core/engine/load.h"
#include "core/engine/load_staging.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"

namespace distckpt {
namespace {

using testing_util::MakeTempDir;
using testing_util::ReadFileToString;
using testing_util::WriteAll;

constexpr uint64_t kBlock = 4096;
constexpr uint64_t kBuffer = 4 * kBlock;  // 16 KiB staging buffers: many segments from small tensors

const MemoryLocation kDevice0{MemoryKind::kCuda, 0, reinterpret_cast<void*>(0x51)};
const MemoryLocation kDevice1{MemoryKind::kCuda, 1, reinterpret_cast<void*>(0x52)};

constexpr uint64_t kRows = 96, kCols = 256;  // F32: 1 KiB rows, 96 KiB in all

float Value(uint64_t r, uint64_t c) { return static_cast<float>(r * 1000 + c); }

// Saves a [kRows, kCols] F32 tensor "m" in 3 row blocks (as 3 ranks would have), with 4 KiB checksum blocks, plus a
// small host tensor "h".
std::string SaveMatrix() {
  static std::vector<float> m = [] {
    std::vector<float> v(kRows * kCols);
    for (uint64_t r = 0; r < kRows; ++r)
      for (uint64_t c = 0; c < kCols; ++c) v[r * kCols + c] = Value(r, c);
    return v;
  }();
  static std::vector<float> h = {1, 2, 3, 4};
  State s;
  EXPECT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  for (uint64_t b = 0; b < 3; ++b) {
    EXPECT_TRUE(s.AddConstPiece("m", {b * 32, 0}, {32, kCols}, m.data() + b * 32 * kCols).ok());
  }
  EXPECT_TRUE(s.AddTensor("h", DType::kF32, {4}).ok());
  EXPECT_TRUE(s.AddConstPiece("h", {0}, {4}, h.data()).ok());
  SaveOptions o;
  o.checksum_block_size = kBlock;
  o.sync = false;
  const std::string path = MakeTempDir() + "/ckpt";
  auto r = Save(path, s, nullptr, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return path;
}

ReadOptions DeviceRead(CopyEngine* engine, size_t buffers = 2) {
  ReadOptions o;
  o.copy_engine = engine;
  o.staging_buffer_bytes = kBuffer;
  o.staging_buffers = buffers;
  o.io_threads = 3;
  return o;
}

// The box [r0, r0 + nr) x [c0, c0 + nc) of "m", checked element by element.
void ExpectBox(const std::vector<float>& got, uint64_t r0, uint64_t nr, uint64_t c0, uint64_t nc) {
  ASSERT_EQ(got.size(), nr * nc);
  for (uint64_t r = 0; r < nr; ++r)
    for (uint64_t c = 0; c < nc; ++c)
      ASSERT_EQ(got[r * nc + c], Value(r0 + r, c0 + c)) << "element (" << r0 + r << ", " << c0 + c << ")";
}

TEST(BatchRunsTest, EquallySpacedRunsBecomeOneStridedCopy) {
  char dst[1 << 12];
  std::vector<DeviceRun> runs;
  for (uint64_t k = 0; k < 8; ++k) runs.push_back(DeviceRun{k * 100, dst + k * 40, 16});
  auto copies = BatchRuns(runs);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].rows, 8u);
  EXPECT_EQ(copies[0].width, 16u);
  EXPECT_EQ(copies[0].src_pitch, 100u);
  EXPECT_EQ(copies[0].dst_pitch, 40u);
  // A shorter last run (a segment cut through a row), a change of spacing, and overlapping rows start new copies.
  runs.push_back(DeviceRun{800, dst + 320, 8});
  runs.push_back(DeviceRun{1000, dst + 1000, 8});
  runs.push_back(DeviceRun{1004, dst + 1004, 8});
  copies = BatchRuns(runs);
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_EQ(copies[1].rows, 2u);  // 800 and 1000: spaced 200 / 680
  EXPECT_EQ(copies[2].rows, 1u);  // 1004 overlaps the row at 1000
  EXPECT_TRUE(BatchRuns({}).empty());
}

TEST(DeviceLoadTest, ReshardedLoadFillsDevicePiecesWithStridedCopies) {
  const std::string path = SaveMatrix();
  HostCopyEngine engine;
  // Two "ranks'" column halves, as device pieces on two devices: every row of the box is a run of its own in the
  // saved row blocks, so each segment's rows must go as one strided copy, not one copy per row.
  std::vector<float> left(kRows * 100, -1), right(kRows * (kCols - 100), -1);
  std::vector<float> h(4);
  State s;
  ASSERT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  ASSERT_TRUE(s.AddPieceIn("m", {0, 0}, {kRows, 100}, left.data(), kDevice0).ok());
  ASSERT_TRUE(s.AddPieceIn("m", {0, 100}, {kRows, kCols - 100}, right.data(), kDevice1).ok());
  ASSERT_TRUE(s.AddTensor("h", DType::kF32, {4}).ok());
  ASSERT_TRUE(s.AddPiece("h", {0}, {4}, h.data()).ok());
  auto r = Load(path, s, nullptr, DeviceRead(&engine));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectBox(left, 0, kRows, 0, 100);
  ExpectBox(right, 0, kRows, 100, kCols - 100);
  EXPECT_EQ(h, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(engine.device_rows_copied(), 2 * kRows);
  // 96 KiB in 16 KiB segments (4 rows... 16 rows each) = 6 segments, two destinations: at most 12 copies (a segment
  // boundary inside a row could add one each), against 192 copies row by row.
  EXPECT_LE(engine.device_copies_issued(), 2 * (6 + 3));
  EXPECT_EQ(engine.order_after_calls(), 2u) << "one wait per (device, stream)";
  EXPECT_LE(r->io.bytes_mapped, 16u) << "device bytes are read into pinned buffers, not served from a mapping";
  EXPECT_EQ(r->io.bytes_delivered, kRows * kCols * 4 + 16);
  auto pool = engine.StagingPool(kBuffer, 2).value();
  EXPECT_LE(pool->max_in_use(), 2u);
  EXPECT_EQ(pool->in_use(), 0u);
}

TEST(DeviceLoadTest, ReaderReadsARegionIntoDeviceMemory) {
  const std::string path = SaveMatrix();
  HostCopyEngine engine;
  auto reader = Reader::Open(path, nullptr, DeviceRead(&engine));
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  std::vector<float> box(40 * 7, -1);
  const std::vector<uint64_t> off = {20, 3}, len = {40, 7};
  Box b = Box::Make(Span<const uint64_t>(off.data(), 2), Span<const uint64_t>(len.data(), 2)).value();
  Status st = (*reader)->ReadRegion("m", b, box.data(), box.size() * 4, kDevice0);
  ASSERT_TRUE(st.ok()) << st.message();
  ExpectBox(box, 20, 40, 3, 7);
  EXPECT_GE(engine.device_copies_issued(), 1u);
  EXPECT_EQ(engine.device_rows_copied(), 40u);
}

// A chunk that feeds a host piece and a device piece at once: the host bytes are copied from the pinned buffer, the
// device bytes from the same buffer through the engine.
TEST(DeviceLoadTest, OneChunkFeedsHostAndDevicePieces) {
  const std::string path = SaveMatrix();
  HostCopyEngine engine;
  std::vector<float> top(10 * kCols), bottom(6 * kCols);
  State s;
  ASSERT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  ASSERT_TRUE(s.AddPiece("m", {40, 0}, {10, kCols}, top.data()).ok());
  ASSERT_TRUE(s.AddPieceIn("m", {50, 0}, {6, kCols}, bottom.data(), kDevice0).ok());
  auto r = Load(path, s, nullptr, DeviceRead(&engine));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectBox(top, 40, 10, 0, kCols);
  ExpectBox(bottom, 50, 6, 0, kCols);
}

// A flipped byte: the load fails naming the checkpoint, the entry and the data file, and the block that holds it
// never reaches the device (verification comes before the copy).
TEST(DeviceLoadTest, CorruptBytesNeverReachTheDevice) {
  const std::string path = SaveMatrix();
  auto reader = Reader::Open(path, nullptr, ReadOptions{});
  ASSERT_TRUE(reader.ok());
  const MetadataView& meta = (*reader)->metadata();
  const EntryView m = meta.entry(*meta.Find("m"));
  const ChunkLocation c1 = m.chunk(1);  // rows 32..63
  const std::string file = path + "/" + std::string(meta.file_name(c1.file));
  std::string bytes = ReadFileToString(file);
  ASSERT_GT(bytes.size(), c1.offset + 5000);
  bytes[c1.offset + 5000] ^= 0x40;  // in rows 36..39 of the tensor (bytes 4096..8191 of chunk 1)
  WriteAll(file, bytes);

  HostCopyEngine engine;
  std::vector<float> all(kRows * kCols, -1);
  State s;
  ASSERT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  ASSERT_TRUE(s.AddPieceIn("m", {0, 0}, {kRows, kCols}, all.data(), kDevice0).ok());
  auto r = Load(path, s, nullptr, DeviceRead(&engine));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("checkpoint '" + path + "'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("entry 'm'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(std::string(meta.file_name(c1.file))), std::string::npos);
  reader->reset();
  for (uint64_t row = 36; row < 40; ++row) {
    for (uint64_t c = 0; c < kCols; ++c) ASSERT_EQ(all[row * kCols + c], -1) << "row " << row << " reached the device";
  }
  EXPECT_EQ(engine.StagingPool(kBuffer, 2).value()->in_use(), 0u);
}

TEST(DeviceLoadTest, ACopyFailureMidPipelineFailsTheLoadNamingTheEntryAndReturnsEveryBuffer) {
  const std::string path = SaveMatrix();
  HostCopyEngine engine;
  engine.set_before_copy([](uint64_t index) {
    return index == 2 ? Status(StatusCode::kUnknown, "injected: an illegal memory access was encountered") : OkStatus();
  });
  std::vector<float> all(kRows * kCols);
  State s;
  ASSERT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  ASSERT_TRUE(s.AddPieceIn("m", {0, 0}, {kRows, kCols}, all.data(), kDevice0).ok());
  auto r = Load(path, s, nullptr, DeviceRead(&engine));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("injected"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("entry 'm'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  EXPECT_EQ(engine.StagingPool(kBuffer, 2).value()->in_use(), 0u);
}

// A load whose copies never finish (the destination's stream is stuck) fails at its timeout naming the entry, instead
// of hanging in Drain; the buffers those copies read are quarantined, never reused while a DMA may still read them.
TEST(DeviceLoadTest, ACopyThatNeverFinishesIsATimeoutNotAHang) {
  const std::string path = SaveMatrix();
  std::vector<float> all(kRows * kCols);  // outlives the engine: the stuck copies land in it after the load gave up
  testing_util::StuckCopies stuck;
  HostCopyEngine engine;
  stuck.Install(&engine);
  State s;
  ASSERT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  ASSERT_TRUE(s.AddPieceIn("m", {0, 0}, {kRows, kCols}, all.data(), kDevice0).ok());
  ReadOptions o = DeviceRead(&engine);
  o.timeout = std::chrono::milliseconds(300);
  const auto t = std::chrono::steady_clock::now();
  auto r = Load(path, s, nullptr, o);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout) << r.status().message();
  EXPECT_LT(took, 10.0);
  EXPECT_NE(r.status().message().find("entry 'm'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  auto pool = engine.StagingPool(kBuffer, 2).value();
  EXPECT_EQ(pool->in_use(), 0u);
  EXPECT_GE(pool->quarantined(), 1u);
  EXPECT_EQ(engine.quarantined(), pool->quarantined());
  stuck.Release();
}

// Slow copies: the readers wait for buffers instead of allocating more, and the pool never exceeds its size.
TEST(DeviceLoadTest, SlowCopiesApplyBackPressure) {
  const std::string path = SaveMatrix();
  HostCopyEngine engine;
  engine.set_before_copy([](uint64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    return OkStatus();
  });
  std::vector<float> all(kRows * kCols);
  State s;
  ASSERT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  ASSERT_TRUE(s.AddPieceIn("m", {0, 0}, {kRows, kCols}, all.data(), kDevice0).ok());
  ReadOptions o = DeviceRead(&engine, 2);
  o.verify = false;
  auto r = Load(path, s, nullptr, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectBox(all, 0, kRows, 0, kCols);
  auto pool = engine.StagingPool(kBuffer, 2).value();
  EXPECT_GT(pool->waits(), 0u);
  EXPECT_EQ(pool->allocated(), 2u);
  EXPECT_LE(engine.live_allocations(), 2);
  EXPECT_EQ(pool->in_use(), 0u);
}

// Copies of a segment run while the I/O threads read the next ones: with one I/O thread, the progress callback
// (called after a segment's copies were submitted) sees a later read start before that segment's copy has finished.
TEST(DeviceLoadTest, DeviceCopiesOverlapTheNextReads) {
  const std::string path = SaveMatrix();
  HostCopyEngine engine;
  std::atomic<int> copying{0}, overlapped{0};
  engine.set_before_copy([&](uint64_t) {
    copying = 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    copying = 0;
    return OkStatus();
  });
  std::vector<float> all(kRows * kCols);
  State s;
  ASSERT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  ASSERT_TRUE(s.AddPieceIn("m", {0, 0}, {kRows, kCols}, all.data(), kDevice0).ok());
  ReadOptions o = DeviceRead(&engine, 3);
  o.io_threads = 1;
  o.progress = [&](uint64_t done, uint64_t) {
    if (done > kBuffer && copying.load()) ++overlapped;  // a read finished while an earlier copy was running
    return 0;
  };
  auto r = Load(path, s, nullptr, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectBox(all, 0, kRows, 0, kCols);
  EXPECT_GT(overlapped.load(), 0) << "reads waited for every copy: no overlap";
}

TEST(DeviceLoadTest, AbortingMidLoadReturnsEveryBuffer) {
  const std::string path = SaveMatrix();
  HostCopyEngine engine;
  std::vector<float> all(kRows * kCols);
  State s;
  ASSERT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  ASSERT_TRUE(s.AddPieceIn("m", {0, 0}, {kRows, kCols}, all.data(), kDevice0).ok());
  ReadOptions o = DeviceRead(&engine);
  o.progress = [](uint64_t done, uint64_t total) { return done * 2 >= total ? 1 : 0; };
  auto r = Load(path, s, nullptr, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUser);
  EXPECT_EQ(engine.StagingPool(kBuffer, 2).value()->in_use(), 0u);
}

// Without a copy engine given, device destinations need the CUDA driver: here (no GPU) a clean kUnsupported naming
// it, before anything is read.
TEST(DeviceLoadTest, WithoutADriverTheLoadIsUnsupportedNamingIt) {
  const std::string path = SaveMatrix();
  if (DefaultCopyEngine(MemoryKind::kCuda).ok()) GTEST_SKIP() << "a CUDA driver is present";
  std::vector<float> all(kRows * kCols);
  State s;
  ASSERT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  ASSERT_TRUE(s.AddPieceIn("m", {0, 0}, {kRows, kCols}, all.data(), kDevice0).ok());
  auto r = Load(path, s, nullptr, ReadOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("libcuda.so.1"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("cuda:0"), std::string::npos) << r.status().message();
}

// Drops the data files of the checkpoint at `path` from the page cache (written back first). False where the file
// system takes no O_DIRECT reads (then direct reads cannot be seen here).
bool EvictAndCanReadDirect(const std::string& path) {
  bool direct = true;
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return false;
  while (struct dirent* ent = ::readdir(d)) {
    const std::string name = ent->d_name;
    if (name.rfind("data-", 0) != 0) continue;
    const std::string file = path + "/" + name;
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) continue;
    (void)::fdatasync(fd);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    const int dfd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
    if (dfd < 0) direct = false;
    else ::close(dfd);
  }
  ::closedir(d);
  return direct;
}

// The whole matrix into one device piece: its values checked, and the load's counters.
Result<LoadSummary> LoadAllToDevice(const std::string& path, const ReadOptions& o) {
  std::vector<float> all(kRows * kCols, -1);
  State s;
  EXPECT_TRUE(s.AddTensor("m", DType::kF32, {kRows, kCols}).ok());
  EXPECT_TRUE(s.AddPieceIn("m", {0, 0}, {kRows, kCols}, all.data(), kDevice0).ok());
  auto r = Load(path, s, nullptr, o);
  if (r.ok()) ExpectBox(all, 0, kRows, 0, kCols);
  return r;
}

TEST(DeviceLoadTest, DataNotInThePageCacheIsReadPastItIntoTheStagingBuffers) {
  const std::string path = SaveMatrix();
  if (!EvictAndCanReadDirect(path)) GTEST_SKIP() << "the test directory's file system takes no O_DIRECT reads";
  HostCopyEngine engine;
  auto cold = LoadAllToDevice(path, DeviceRead(&engine));
  ASSERT_TRUE(cold.ok()) << cold.status().message();
  EXPECT_EQ(cold->io.bytes_read_direct, kRows * kCols * 4) << "every segment of the evicted file read with O_DIRECT";
  EXPECT_EQ(cold->io.bytes_read, kRows * kCols * 4);
  // Asked not to, or with the bytes in the page cache (the load above read past it: read them in), none is.
  ReadOptions off = DeviceRead(&engine);
  off.direct_io = false;
  ASSERT_TRUE(EvictAndCanReadDirect(path));
  auto buffered = LoadAllToDevice(path, off);
  ASSERT_TRUE(buffered.ok()) << buffered.status().message();
  EXPECT_EQ(buffered->io.bytes_read_direct, 0u);
  auto warm = LoadAllToDevice(path, DeviceRead(&engine));
  ASSERT_TRUE(warm.ok()) << warm.status().message();
  EXPECT_EQ(warm->io.bytes_read_direct, 0u) << "the buffered load above left every page in the cache";
}

// A damaged byte read past the page cache is caught as any other: the direct path verifies what it read.
TEST(DeviceLoadTest, ADamagedByteReadPastThePageCacheIsRefused) {
  const std::string path = SaveMatrix();
  const std::string data = path + "/data-00000.bin";
  std::string bytes = ReadFileToString(data);
  ASSERT_GT(bytes.size(), 5000u);
  bytes[5000] ^= 0x10;
  WriteAll(data, bytes);
  if (!EvictAndCanReadDirect(path)) GTEST_SKIP() << "the test directory's file system takes no O_DIRECT reads";
  HostCopyEngine engine;
  auto r = LoadAllToDevice(path, DeviceRead(&engine));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().message();
  EXPECT_NE(r.status().message().find("data-00000.bin"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace distckpt
