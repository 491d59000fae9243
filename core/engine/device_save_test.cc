// Saves of device pieces through the staging pipeline, with the host copy engine standing in for CUDA: the pieces are
// host buffers marked as device memory, so everything but the copy itself runs exactly as on a GPU machine.
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/cuda/host_copy_engine.h"
#include "core/cuda/pinned_pool.h"
#include "core/engine/engine_test_util.h"
#include "core/engine/load.h"
#include "core/engine/save.h"
#include "core/engine/save_async.h"
#include "core/storage/fault/fault_storage.h"

namespace distckpt {
namespace {

using testing_util::MakeTempDir;

constexpr uint64_t kBlock = 4096;
constexpr uint64_t kBuffer = 4 * kBlock;  // 16 KiB staging buffers: many segments from small tensors

const MemoryLocation kDevice0{MemoryKind::kCuda, 0, reinterpret_cast<void*>(0x51)};
const MemoryLocation kDevice1{MemoryKind::kCuda, 1, reinterpret_cast<void*>(0x52)};

std::vector<float> Iota(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

uint64_t AlignUpForTest(uint64_t x) { return (x + 4095) / 4096 * 4096; }

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

std::vector<std::string> List(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) out.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

SaveOptions DeviceOptions(CopyEngine* engine, size_t buffers = 2) {
  SaveOptions o;
  o.copy_engine = engine;
  o.checksum_block_size = kBlock;
  o.staging_buffer_bytes = kBuffer;
  o.staging_buffers = buffers;
  o.io_threads = 4;
  o.sync = false;
  return o;
}

// A state with a device tensor "w" (split in two pieces on two devices), a host tensor "h" and a bytes entry.
struct Fixture {
  std::vector<float> w0 = Iota(10000, 0), w1 = Iota(7001, 10000), h = Iota(100, -50);
  std::string blob = "opaque bytes";
  State state;
  Fixture() {
    EXPECT_TRUE(state.AddTensor("w", DType::kF32, {17001}).ok());
    EXPECT_TRUE(state.AddPieceIn("w", {0}, {10000}, w0.data(), kDevice0).ok());
    EXPECT_TRUE(state.AddPieceIn("w", {10000}, {7001}, w1.data(), kDevice1).ok());
    EXPECT_TRUE(state.AddTensor("h", DType::kF32, {100}).ok());
    EXPECT_TRUE(state.AddPiece("h", {0}, {100}, h.data()).ok());
    EXPECT_TRUE(state.AddConstBytes("b", blob.data(), blob.size()).ok());
  }
  // Loads the checkpoint back into host memory and compares.
  void ExpectSaved(const std::string& path) const {
    std::vector<float> w(17001), hh(100);
    std::string b(64, '\0');
    State s;
    ASSERT_TRUE(s.AddTensor("w", DType::kF32, {17001}).ok());
    ASSERT_TRUE(s.AddPiece("w", {0}, {17001}, w.data()).ok());
    ASSERT_TRUE(s.AddTensor("h", DType::kF32, {100}).ok());
    ASSERT_TRUE(s.AddPiece("h", {0}, {100}, hh.data()).ok());
    ASSERT_TRUE(s.AddBytes("b", b.data(), b.size()).ok());
    auto r = Load(path, s, nullptr, ReadOptions{});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(std::equal(w0.begin(), w0.end(), w.begin()));
    EXPECT_TRUE(std::equal(w1.begin(), w1.end(), w.begin() + 10000));
    EXPECT_EQ(hh, h);
    EXPECT_EQ(b.substr(0, s.FindBytes("b")->loaded_size), blob);
  }
  uint64_t device_segments() const {
    return (w0.size() * 4 + kBuffer - 1) / kBuffer + (w1.size() * 4 + kBuffer - 1) / kBuffer;
  }
};

TEST(DeviceSaveTest, DevicePiecesAreStagedThroughTheBoundedPoolAndSavedExactly) {
  HostCopyEngine engine;
  Fixture f;
  const std::string path = MakeTempDir() + "/ckpt";
  auto r = Save(path, f.state, nullptr, DeviceOptions(&engine));
  ASSERT_TRUE(r.ok()) << r.status().message();
  f.ExpectSaved(path);
  EXPECT_EQ(engine.copies_issued(), f.device_segments());
  EXPECT_EQ(engine.order_after_calls(), 2u) << "one wait per (device, stream)";
  auto pool = engine.StagingPool(kBuffer, 2).value();
  EXPECT_GE(pool->allocated(), 1u);  // 1 when every write kept up with the copies
  EXPECT_LE(pool->allocated(), 2u);
  EXPECT_LE(pool->max_in_use(), 2u);
  EXPECT_EQ(pool->in_use(), 0u);
}

TEST(DeviceSaveTest, StagingMemoryDoesNotGrowWithTheState) {
  HostCopyEngine engine;
  const std::string dir = MakeTempDir();
  for (size_t n : {size_t{1000}, size_t{200000}}) {  // 4 KB, then 800 KB: 50 segments through 3 buffers
    std::vector<float> big = Iota(n, 1);
    State s;
    ASSERT_TRUE(s.AddTensor("big", DType::kF32, {n}).ok());
    ASSERT_TRUE(s.AddPieceIn("big", {0}, {n}, big.data(), kDevice0).ok());
    auto r = Save(dir + "/n" + std::to_string(n), s, nullptr, DeviceOptions(&engine, 3));
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  auto pool = engine.StagingPool(kBuffer, 3).value();
  EXPECT_LE(pool->allocated(), 3u);
  EXPECT_LE(engine.live_allocations(), 3) << "the pool is reused across saves, never grown";
}

// Copy k+1 runs while the write of buffer k is still going on: the progress callback (called from inside the write
// task of a segment, which still holds its buffer) blocks until the engine has started the next copy. A serial
// pipeline (copy, write, copy, write...) would never start it and the wait would time out.
TEST(DeviceSaveTest, CopyOfTheNextBufferOverlapsTheWriteOfThisOne) {
  HostCopyEngine engine;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t started = 0;
  engine.set_before_copy([&](uint64_t index) {
    std::lock_guard<std::mutex> lock(mu);
    started = index + 1;
    cv.notify_all();
    return OkStatus();
  });
  std::vector<float> w = Iota(8 * kBuffer / 4, 0);  // 8 segments
  State s;
  ASSERT_TRUE(s.AddTensor("w", DType::kF32, {w.size()}).ok());
  ASSERT_TRUE(s.AddPieceIn("w", {0}, {w.size()}, w.data(), kDevice0).ok());
  SaveOptions o = DeviceOptions(&engine, 2);
  // One writer: with several, two writes could hold both buffers (one waiting here, one for the serialised progress
  // call), and copy k+1 would rightly wait for a buffer: that measures the test, not the pipeline's overlap.
  o.io_threads = 1;
  int writes = 0, overlapped = 0;
  o.progress = [&](uint64_t done, uint64_t total) {
    ++writes;  // progress calls are serialised
    if (done == total) return 0;
    std::unique_lock<std::mutex> lock(mu);
    // At least one more copy than writes so far has started: the next buffer's copy, while this write is running.
    if (cv.wait_for(lock, std::chrono::seconds(10), [&] { return started >= uint64_t(writes) + 1; })) ++overlapped;
    return 0;
  };
  const std::string path = MakeTempDir() + "/ckpt";
  auto r = Save(path, s, nullptr, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(writes, 8);
  EXPECT_EQ(overlapped, 7) << "every write but the last overlapped the next copy";
  EXPECT_LE(engine.StagingPool(kBuffer, 2).value()->max_in_use(), 2u);
}

// With writes slower than copies, the producer waits for buffers instead of allocating more.
TEST(DeviceSaveTest, SlowWritesApplyBackPressure) {
  HostCopyEngine engine;
  auto rules = ParseFaultRules("write:data-:every:stall=5ms");
  ASSERT_TRUE(rules.ok()) << rules.status().message();
  FaultStorage slow(DefaultStorage(), *rules);
  std::vector<float> w = Iota(12 * kBuffer / 4, 0);
  State s;
  ASSERT_TRUE(s.AddTensor("w", DType::kF32, {w.size()}).ok());
  ASSERT_TRUE(s.AddPieceIn("w", {0}, {w.size()}, w.data(), kDevice0).ok());
  SaveOptions o = DeviceOptions(&engine, 2);
  o.storage = &slow;
  auto r = Save(MakeTempDir() + "/ckpt", s, nullptr, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto pool = engine.StagingPool(kBuffer, 2).value();
  EXPECT_GT(pool->waits(), 0u);
  EXPECT_EQ(pool->allocated(), 2u);
  EXPECT_EQ(pool->in_use(), 0u);
}

TEST(DeviceSaveTest, ACopyFailureMidPipelineNamesTheCheckpointAndEntryAndLeavesNothing) {
  HostCopyEngine engine;
  engine.set_before_copy([](uint64_t index) {
    return index == 3 ? Status(StatusCode::kUnknown, "injected: an illegal memory access was encountered") : OkStatus();
  });
  Fixture f;
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/ckpt";
  auto r = Save(path, f.state, nullptr, DeviceOptions(&engine));
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("saving '" + path + "'"), std::string::npos) << m;
  EXPECT_NE(m.find("tensor 'w' piece"), std::string::npos) << m;
  EXPECT_NE(m.find(" to host failed"), std::string::npos) << m;  // "copying bytes a..b from cuda:N"
  EXPECT_NE(m.find("illegal memory access"), std::string::npos) << m;
  EXPECT_FALSE(Exists(path));
  EXPECT_TRUE(List(dir).empty()) << "no staging directory is left behind";
  EXPECT_EQ(engine.StagingPool(kBuffer, 2).value()->in_use(), 0u) << "every buffer went back to the pool";
}

TEST(DeviceSaveTest, CancellingFromTheProgressCallbackStopsTheCopies) {
  HostCopyEngine engine;
  std::vector<float> w = Iota(32 * kBuffer / 4, 0);  // 32 segments
  State s;
  ASSERT_TRUE(s.AddTensor("w", DType::kF32, {w.size()}).ok());
  ASSERT_TRUE(s.AddPieceIn("w", {0}, {w.size()}, w.data(), kDevice0).ok());
  SaveOptions o = DeviceOptions(&engine, 2);
  int calls = 0;
  o.progress = [&](uint64_t, uint64_t) { return ++calls == 2 ? 1 : 0; };
  const std::string dir = MakeTempDir();
  auto r = Save(dir + "/ckpt", s, nullptr, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUser);
  EXPECT_TRUE(List(dir).empty());
  EXPECT_LT(engine.copies_issued(), 32u) << "the pipeline stopped issuing copies";
  EXPECT_EQ(engine.StagingPool(kBuffer, 2).value()->in_use(), 0u);
}

TEST(DeviceSaveTest, AsyncSaveStagesDevicePiecesBeforeReturning) {
  HostCopyEngine engine;
  Fixture f;
  const std::vector<float> w0 = f.w0;
  const std::string path = MakeTempDir() + "/ckpt";
  auto fut = SaveAsync(path, f.state, nullptr, DeviceOptions(&engine));
  ASSERT_TRUE(fut.ok()) << fut.status().message();
  // Straight into one page-locked buffer of the engine: one copy per device piece, no pipeline segments.
  EXPECT_EQ(engine.copies_issued(), 2u) << "every device piece was copied, once, before the call returned";
  std::fill(f.w0.begin(), f.w0.end(), -1.0f);  // the caller reuses its "device" memory at once
  std::fill(f.w1.begin(), f.w1.end(), -1.0f);
  auto r = (*fut)->Wait(std::chrono::minutes(1));
  ASSERT_TRUE(r.ok()) << r.status().message();
  f.w0 = w0;
  f.w1 = Iota(7001, 10000);
  f.ExpectSaved(path);
  fut->reset();
  EXPECT_EQ(engine.live_allocations(), 0) << "a caller's own engine's buffer is freed with the save, not pooled";
}

// Where the host cannot page-lock the whole device part (cuMemHostAlloc fails), the device pieces go through the
// bounded staging pipeline into the pageable buffer instead: the save still returns with every byte copied.
TEST(DeviceSaveTest, AsyncSaveFallsBackToThePipelineWithoutPinnedMemoryForTheState) {
  HostCopyEngine engine;
  engine.set_host_allocation_limit(kBuffer);  // the pipeline's buffers fit; one buffer for the state does not
  Fixture f;
  const std::vector<float> w0 = f.w0;
  const std::string path = MakeTempDir() + "/ckpt";
  auto fut = SaveAsync(path, f.state, nullptr, DeviceOptions(&engine));
  ASSERT_TRUE(fut.ok()) << fut.status().message();
  EXPECT_EQ(engine.copies_issued(), f.device_segments()) << "every device byte was copied before the call returned";
  std::fill(f.w0.begin(), f.w0.end(), -1.0f);
  auto r = (*fut)->Wait(std::chrono::minutes(1));
  ASSERT_TRUE(r.ok()) << r.status().message();
  f.w0 = w0;
  f.ExpectSaved(path);
}

// device_snapshot: the call returns once the device pieces are copied into device memory distckpt owns (no host
// staging, no device-to-host copy yet); the background save drains the snapshot to host while the caller changes
// its tensors, and the checkpoint holds the values of the call. The snapshot is freed when the save finishes.
TEST(DeviceSaveTest, AsyncSaveWithADeviceSnapshotReturnsBeforeAnyDeviceToHostCopy) {
  HostCopyEngine engine;
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  // The copies after the two snapshot copies (issue order: the snapshots come first, in the call) are the background
  // save's copies to host: they block until the test has checked what happened before the call returned.
  engine.set_before_copy([&](uint64_t index) {
    std::unique_lock<std::mutex> lock(mu);
    if (index >= 2) cv.wait_for(lock, std::chrono::seconds(20), [&] { return released; });
    return OkStatus();
  });
  Fixture f;
  const std::vector<float> w0 = f.w0, w1 = f.w1;
  SaveOptions o = DeviceOptions(&engine);
  o.device_snapshot = true;
  const std::string path = MakeTempDir() + "/ckpt";
  auto fut = SaveAsync(path, f.state, nullptr, o);
  ASSERT_TRUE(fut.ok()) << fut.status().message();
  EXPECT_EQ(engine.on_device_copies_issued(), 2u) << "one snapshot copy per device piece";
  EXPECT_FALSE((*fut)->done()) << "the copies to host are held back: the save cannot have finished";
  EXPECT_EQ((*fut)->snapshot_bytes(), (w0.size() + w1.size()) * 4);
  EXPECT_EQ((*fut)->staged_bytes(), AlignUpForTest(f.h.size() * 4) + f.blob.size()) << "only host data in host memory";
  EXPECT_EQ(engine.live_device_allocations(), 2);
  std::fill(f.w0.begin(), f.w0.end(), -1.0f);  // training changes its tensors at once
  std::fill(f.w1.begin(), f.w1.end(), -2.0f);
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  auto r = (*fut)->Wait(std::chrono::minutes(1));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(engine.live_device_allocations(), 0) << "the snapshot is freed when the save finishes";
  f.w0 = w0;
  f.w1 = w1;
  f.ExpectSaved(path);
}

// A snapshot takes one device allocation per device however many pieces it has (each cuMemAlloc/cuMemFree may
// synchronize the device behind training), and every piece lands in it intact.
TEST(DeviceSaveTest, ADeviceSnapshotIsOneAllocationPerDevice) {
  HostCopyEngine engine;
  std::vector<std::vector<float>> pieces;
  State s;
  ASSERT_TRUE(s.AddTensor("t", DType::kF32, {10 * 1001}).ok());
  for (int i = 0; i < 10; ++i) {
    pieces.push_back(Iota(1001, 1001 * i));  // odd sizes: each piece's place is aligned in the arena
    ASSERT_TRUE(s.AddPieceIn("t", {uint64_t(1001 * i)}, {1001}, pieces.back().data(), kDevice0).ok());
  }
  SaveOptions o = DeviceOptions(&engine);
  o.device_snapshot = true;
  const std::string path = MakeTempDir() + "/ckpt";
  auto fut = SaveAsync(path, s, nullptr, o);
  ASSERT_TRUE(fut.ok()) << fut.status().message();
  EXPECT_EQ(engine.on_device_copies_issued(), 10u);
  EXPECT_EQ((*fut)->snapshot_bytes(), 10u * 1001 * 4);
  for (auto& p : pieces) std::fill(p.begin(), p.end(), -1.0f);
  ASSERT_TRUE((*fut)->Wait(std::chrono::minutes(1)).ok());
  EXPECT_EQ(engine.live_device_allocations(), 0);
  std::vector<float> back(10 * 1001);
  State l;
  ASSERT_TRUE(l.AddTensor("t", DType::kF32, {back.size()}).ok());
  ASSERT_TRUE(l.AddPiece("t", {0}, {back.size()}, back.data()).ok());
  ASSERT_TRUE(Load(path, l, nullptr, ReadOptions{}).ok());
  EXPECT_EQ(back, Iota(10 * 1001, 0));
}

// Only running out of device memory falls back to host staging: any other allocation failure fails the save,
// naming the device, and leaves nothing behind.
TEST(DeviceSaveTest, ADeviceSnapshotAllocationErrorIsAnErrorNotAFallback) {
  HostCopyEngine engine;
  engine.set_device_allocation_error(Status(StatusCode::kUnknown, "cuMemAlloc failed: CUDA error 999 (unknown)"));
  Fixture f;
  SaveOptions o = DeviceOptions(&engine);
  o.device_snapshot = true;
  const std::string dir = MakeTempDir();
  auto fut = SaveAsync(dir + "/ckpt", f.state, nullptr, o);
  ASSERT_FALSE(fut.ok());
  EXPECT_NE(fut.status().message().find("snapshotting cuda:0"), std::string::npos) << fut.status().message();
  EXPECT_NE(fut.status().message().find("CUDA error 999"), std::string::npos) << fut.status().message();
  EXPECT_TRUE(List(dir).empty());
}

// Out of device memory for a snapshot: the pieces that did not fit are staged in host memory instead; the save
// succeeds with every value.
TEST(DeviceSaveTest, ADeviceSnapshotThatDoesNotFitFallsBackToHostStaging) {
  HostCopyEngine engine;
  engine.set_device_memory_limit(48 << 10);  // room for w0 (40 KB), not for w1 too
  Fixture f;
  SaveOptions o = DeviceOptions(&engine);
  o.device_snapshot = true;
  const std::string path = MakeTempDir() + "/ckpt";
  auto fut = SaveAsync(path, f.state, nullptr, o);
  ASSERT_TRUE(fut.ok()) << fut.status().message();
  EXPECT_EQ((*fut)->snapshot_bytes(), f.w0.size() * 4);
  EXPECT_EQ((*fut)->snapshot_fallback_bytes(), f.w1.size() * 4);
  EXPECT_GE((*fut)->staged_bytes(), f.w1.size() * 4);
  const std::vector<float> w0 = f.w0, w1 = f.w1;
  std::fill(f.w0.begin(), f.w0.end(), -1.0f);
  std::fill(f.w1.begin(), f.w1.end(), -2.0f);
  ASSERT_TRUE((*fut)->Wait(std::chrono::minutes(1)).ok());
  EXPECT_EQ(engine.live_device_allocations(), 0);
  f.w0 = w0;
  f.w1 = w1;
  f.ExpectSaved(path);
}

// A snapshot leaves training room: on a device whose free memory, less 1/16 of the device (at least 512 MiB), cannot
// hold it, the pieces are staged in host memory (nothing allocated on the device), and the future says how much.
TEST(DeviceSaveTest, ADeviceSnapshotLeavesHeadroomForTraining) {
  HostCopyEngine engine;
  const uint64_t gib = 1ull << 30;
  engine.set_device_memory_info(/*free=*/gib / 2 + (16 << 10), /*total=*/8 * gib);  // 512 MiB + 16 KiB left
  Fixture f;
  SaveOptions o = DeviceOptions(&engine);
  o.device_snapshot = true;
  const std::string path = MakeTempDir() + "/ckpt";
  auto fut = SaveAsync(path, f.state, nullptr, o);
  ASSERT_TRUE(fut.ok()) << fut.status().message();
  EXPECT_EQ((*fut)->snapshot_bytes(), 0u);
  EXPECT_EQ((*fut)->snapshot_fallback_bytes(), (f.w0.size() + f.w1.size()) * 4);
  EXPECT_EQ(engine.live_device_allocations(), 0) << "nothing taken from the device";
  ASSERT_TRUE((*fut)->Wait(std::chrono::minutes(1)).ok());
  f.ExpectSaved(path);
  // With room beyond the headroom, the same state is snapshotted.
  engine.set_device_memory_info(gib + (1 << 20), 8 * gib);
  auto again = SaveAsync(MakeTempDir() + "/again", f.state, nullptr, o);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ((*again)->snapshot_bytes(), (f.w0.size() + f.w1.size()) * 4);
  EXPECT_EQ((*again)->snapshot_fallback_bytes(), 0u);
  ASSERT_TRUE((*again)->Wait(std::chrono::minutes(1)).ok());
}

// With a cap on the staging of unfinished async saves, a save past it waits for the earlier one to finish (and free
// its staging) instead of allocating another state-sized buffer; past options.timeout it gives up with kTimeout.
TEST(DeviceSaveTest, AsyncSavesPastTheStagingCapWaitForEarlierOnes) {
  HostCopyEngine engine;
  auto rules = ParseFaultRules("write:data-:every:stall=300ms");
  ASSERT_TRUE(rules.ok()) << rules.status().message();
  FaultStorage slow(DefaultStorage(), *rules);
  Fixture f;
  SaveOptions o = DeviceOptions(&engine);
  o.storage = &slow;
  o.max_async_staging_bytes = 1;  // one save's staging at a time
  const std::string dir = MakeTempDir();
  auto first = SaveAsync(dir + "/a", f.state, nullptr, o);
  ASSERT_TRUE(first.ok()) << first.status().message();
  auto second = SaveAsync(dir + "/b", f.state, nullptr, o);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_TRUE((*first)->done()) << "the second call returned while the first save still held its staging";
  ASSERT_TRUE((*first)->Wait(std::chrono::minutes(1)).ok());

  SaveOptions impatient = o;
  impatient.timeout = std::chrono::milliseconds(50);
  auto third = SaveAsync(dir + "/c", f.state, nullptr, impatient);
  ASSERT_FALSE(third.ok()) << "the second save (300 ms per write) was still staging";
  EXPECT_EQ(third.status().code(), StatusCode::kTimeout);
  EXPECT_NE(third.status().message().find("max_async_staging_bytes"), std::string::npos) << third.status().message();

  auto r = (*second)->Wait(std::chrono::minutes(1));
  ASSERT_TRUE(r.ok()) << r.status().message();
  f.ExpectSaved(dir + "/a");
  f.ExpectSaved(dir + "/b");
  EXPECT_FALSE(Exists(dir + "/c"));
}

TEST(DeviceSaveTest, AsyncSaveReportsAFailedCopy) {
  HostCopyEngine engine;
  engine.set_before_copy(
      [](uint64_t index) { return index == 1 ? Status(StatusCode::kUnknown, "injected copy failure") : OkStatus(); });
  Fixture f;
  const std::string dir = MakeTempDir();
  auto fut = SaveAsync(dir + "/ckpt", f.state, nullptr, DeviceOptions(&engine));
  ASSERT_FALSE(fut.ok());
  EXPECT_NE(fut.status().message().find("tensor 'w' piece"), std::string::npos) << fut.status().message();
  EXPECT_TRUE(List(dir).empty());
}

// A copy stuck behind the caller's stream (a kernel that never ends, a collective waiting for a dead peer) ends the
// save at its timeout with kTimeout naming the checkpoint, the tensor and the stream, instead of hanging; the buffers
// the copies may still write are quarantined in the engine (never reused or freed while the engine lives: under ASan a
// late copy into freed memory would fail the test), nothing half-written looks complete, and the next save works.
constexpr auto kShortTimeout = std::chrono::milliseconds(300);

template <typename Fn>
double Seconds(Fn fn) {
  const auto t = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(DeviceSaveTest, ACopyThatNeverFinishesIsATimeoutNotAHang) {
  Fixture f;  // the source outlives the engine, whose stuck copies still read it after the save gave up
  testing_util::StuckCopies stuck;
  HostCopyEngine engine;
  stuck.Install(&engine);
  const std::string dir = MakeTempDir();
  SaveOptions o = DeviceOptions(&engine);
  o.timeout = kShortTimeout;
  Status st;
  const double took = Seconds([&] { st = Save(dir + "/ckpt", f.state, nullptr, o).status(); });
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.message();
  EXPECT_LT(took, 10.0) << "bounded by the timeout, not by the copy";
  EXPECT_NE(st.message().find("tensor 'w'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("cuda:"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("ckpt"), std::string::npos) << st.message();
  EXPECT_GE(engine.quarantined(), 1u) << "the stuck copies' staging buffers are set aside";
  EXPECT_FALSE(Exists(dir + "/ckpt/" + std::string(kMetadataFileName)));
  stuck.Release();  // the kernel ends after all: the late copies land in quarantined memory
  o.timeout = std::chrono::minutes(1);
  auto again = Save(dir + "/again", f.state, nullptr, o);
  ASSERT_TRUE(again.ok()) << again.status().message();
  f.ExpectSaved(dir + "/again");
}

TEST(DeviceSaveTest, AsyncSaveOfAStuckStreamTimesOutAndSetsItsBufferAside) {
  for (bool snapshot : {false, true}) {
    SCOPED_TRACE(snapshot ? "device_snapshot" : "page-locked staging");
    Fixture f;
    testing_util::StuckCopies stuck;
    HostCopyEngine engine;
    stuck.Install(&engine);
    const std::string dir = MakeTempDir();
    SaveOptions o = DeviceOptions(&engine);
    o.timeout = kShortTimeout;
    o.device_snapshot = snapshot;
    Status st;
    const double took = Seconds([&] { st = SaveAsync(dir + "/ckpt", f.state, nullptr, o).status(); });
    EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.message();
    EXPECT_LT(took, 10.0);
    EXPECT_NE(st.message().find("not finished"), std::string::npos) << st.message();
    // The page-locked buffer of the state, or the two devices' snapshot arenas.
    EXPECT_EQ(engine.quarantined(), snapshot ? 2u : 1u);
    EXPECT_TRUE(List(dir).empty());
    stuck.Release();
  }
}

TEST(DeviceSaveTest, WithoutADriverDevicePiecesAreUnsupported) {
  if (void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    ::dlclose(h);
    GTEST_SKIP() << "libcuda.so.1 is present";
  }
  Fixture f;
  const std::string dir = MakeTempDir();
  SaveOptions o = DeviceOptions(nullptr);  // the default engine: CUDA
  auto r = Save(dir + "/ckpt", f.state, nullptr, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("libcuda.so.1 not found"), std::string::npos) << r.status().message();
  EXPECT_TRUE(List(dir).empty());
}

// A device piece is a writable load target too (core/engine/device_load_test.cc loads into them); a negative ordinal
// is refused when it is added.
TEST(DeviceSaveTest, DevicePiecesAreWritableAndCheckedWhenAdded) {
  std::vector<float> w(4);
  State s;
  ASSERT_TRUE(s.AddTensor("w", DType::kF32, {4}).ok());
  ASSERT_TRUE(s.AddPieceIn("w", {0}, {4}, w.data(), kDevice0).ok());
  EXPECT_FALSE(s.tensors()[0].pieces[0].memory.is_host());
  EXPECT_FALSE(s.tensors()[0].pieces[0].read_only);
  EXPECT_FALSE(s.AddPieceIn("w", {0}, {4}, w.data(), MemoryLocation{MemoryKind::kCuda, -1, nullptr}).ok());
  EXPECT_FALSE(s.AddPieceIn("w", {0}, {4}, w.data(), MemoryLocation{static_cast<MemoryKind>(7), 0, nullptr}).ok());
}

}  // namespace
}  // namespace distckpt
