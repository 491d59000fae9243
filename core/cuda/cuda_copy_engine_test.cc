// The real CudaCopyEngine against the stand-in driver (testdata/fake_cuda.cc, loaded through
// DCKPT_CUDA_DRIVER_LIBRARY before anything touches CUDA): copies in every direction, ordering after the caller's
// stream, the contexts each call runs under, and the defects a host copy engine hides (pinned memory made under
// GPU 0, fences that spin, pointer checks on a thread with no current context, a retained context leaked on a
// failure). The fake's counters and knobs are reached with dlsym on the same library.
#include "core/cuda/cuda_copy_engine.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda/copy_engine.h"
#include "core/cuda/cuda_driver.h"

namespace distckpt {
namespace {

std::string FakeDriverPath() {
  const char* dir = std::getenv("TEST_SRCDIR");
  if (dir == nullptr) return "";
  const std::string path = std::string(dir) + "/distckpt/core/cuda/libfake_cuda.so";
  return ::access(path.c_str(), R_OK) == 0 ? path : "";
}

// Before main: the engine reads DCKPT_CUDA_DRIVER_LIBRARY once, on the first CUDA call.
const std::string kFake = [] {
  const std::string path = FakeDriverPath();
  if (!path.empty()) ::setenv("DCKPT_CUDA_DRIVER_LIBRARY", path.c_str(), 1);
  ::setenv("DCKPT_FAKE_CUDA_DEVICES", "3", 1);  // cuda:2 is used by one test only
  return path;
}();

// The fake's controls.
struct Fake {
  long (*count)(const char*);
  void (*fail)(const char*, int, long);
  void (*hold_stream)(void*, int);
  void (*strict_pointer_queries)(int);
  void (*map_in_chunks)(uintptr_t, size_t);
  void (*capture_stream)(void*, int);
  int (*thread_capture_mode)();
};

Fake Controls() {
  void* lib = ::dlopen(kFake.c_str(), RTLD_NOW | RTLD_LOCAL);  // the engine's handle: the same globals
  EXPECT_NE(lib, nullptr) << ::dlerror();
  Fake f{};
  f.count = reinterpret_cast<long (*)(const char*)>(::dlsym(lib, "fake_cuda_count"));
  f.fail = reinterpret_cast<void (*)(const char*, int, long)>(::dlsym(lib, "fake_cuda_fail"));
  f.hold_stream = reinterpret_cast<void (*)(void*, int)>(::dlsym(lib, "fake_cuda_hold_stream"));
  f.strict_pointer_queries = reinterpret_cast<void (*)(int)>(::dlsym(lib, "fake_cuda_strict_pointer_queries"));
  f.map_in_chunks = reinterpret_cast<void (*)(uintptr_t, size_t)>(::dlsym(lib, "fake_cuda_map_in_chunks"));
  f.capture_stream = reinterpret_cast<void (*)(void*, int)>(::dlsym(lib, "fake_cuda_capture_stream"));
  f.thread_capture_mode = reinterpret_cast<int (*)()>(::dlsym(lib, "fake_cuda_thread_capture_mode"));
  return f;
}

class CudaCopyEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kFake.empty()) GTEST_SKIP() << "no runfiles: the stand-in driver is not here";
    auto e = DefaultCopyEngine(MemoryKind::kCuda);
    ASSERT_TRUE(e.ok()) << e.status().message();
    engine_ = *e;
    ASSERT_EQ(engine_->name(), "cuda");
    auto d = cuda::LoadCudaDriver();
    ASSERT_TRUE(d.ok());
    d_ = *d;
    fake_ = Controls();
  }
  // A stream of the caller's own on `device` (as a framework's), made under that device's context.
  cuda::CUstream CallerStream(int device) {
    auto ctx = static_cast<CudaCopyEngine*>(engine_)->Context(device);
    EXPECT_TRUE(ctx.ok());
    EXPECT_EQ(d_->cuCtxPushCurrent(*ctx), 0);
    cuda::CUstream s = nullptr;
    EXPECT_EQ(d_->cuStreamCreate(&s, cuda::kStreamNonBlocking), 0);
    cuda::CUcontext popped;
    EXPECT_EQ(d_->cuCtxPopCurrent(&popped), 0);
    return s;
  }
  CopyEngine* engine_ = nullptr;
  const cuda::CudaDriver* d_ = nullptr;
  Fake fake_{};
};

TEST_F(CudaCopyEngineTest, CopiesInEveryDirectionOnTheRealEngine) {
  const MemoryLocation dev1{MemoryKind::kCuda, 1, nullptr};
  auto mem = engine_->AllocateDevice(4096, 1);
  ASSERT_TRUE(mem.ok()) << mem.status().message();
  auto other = engine_->AllocateDevice(4096, 1);
  ASSERT_TRUE(other.ok());
  // 8 rows of 16 bytes, from a host layout with 32-byte rows into a device layout with 64-byte rows.
  std::vector<char> host(8 * 32);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<char>(i * 7);
  auto f = engine_->CopyToDeviceAsync(*mem, 64, host.data(), 32, 16, 8, dev1);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_TRUE((*f)->Wait().ok());
  auto g = engine_->CopyOnDeviceAsync(*other, *mem, 4096, dev1);
  ASSERT_TRUE(g.ok()) << g.status().message();
  std::vector<char> back(4096);
  auto h = engine_->CopyToHostAsync(back.data(), *other, back.size(), dev1);
  ASSERT_TRUE(h.ok()) << h.status().message();
  ASSERT_TRUE((*g)->Wait().ok());
  ASSERT_TRUE((*h)->Wait().ok());
  for (int row = 0; row < 8; ++row) {
    EXPECT_EQ(std::memcmp(back.data() + row * 64, host.data() + row * 32, 16), 0) << "row " << row;
  }
  EXPECT_EQ(fake_.count("context_mismatch"), 0) << "every call ran under its stream's device's context";
  engine_->FreeDevice(*mem, 1);
  engine_->FreeDevice(*other, 1);
}

TEST_F(CudaCopyEngineTest, CopiesWaitForTheWorkQueuedOnTheCallersStream) {
  cuda::CUstream training = CallerStream(0);
  auto mem = engine_->AllocateDevice(64, 0);
  ASSERT_TRUE(mem.ok());
  const MemoryLocation loc{MemoryKind::kCuda, 0, training};
  fake_.hold_stream(training, 1);  // a long kernel still running on the caller's stream
  ASSERT_TRUE(engine_->OrderAfter(loc).ok());
  std::vector<char> out(64, 'x');
  auto f = engine_->CopyToHostAsync(out.data(), *mem, out.size(), loc);
  ASSERT_TRUE(f.ok()) << f.status().message();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(out[0], 'x') << "the copy ran before the caller's stream got there";
  fake_.hold_stream(training, 0);
  ASSERT_TRUE((*f)->Wait().ok());
  EXPECT_EQ(out[0], 0);
  engine_->FreeDevice(*mem, 0);
}

// Defect: one copy stream per device served everything, so a foreground save waiting for the training stream made a
// running background save's copies (of its snapshot, data that waits for nothing) wait too.
TEST_F(CudaCopyEngineTest, CopiesOfReadyDataDoNotQueueBehindAWaitOnTheCallersStream) {
  cuda::CUstream training = CallerStream(1);
  auto snapshot = engine_->AllocateDevice(128, 1);
  auto live = engine_->AllocateDevice(128, 1);
  ASSERT_TRUE(snapshot.ok() && live.ok());
  const MemoryLocation waiting{MemoryKind::kCuda, 1, training};
  const MemoryLocation ready{MemoryKind::kCuda, 1, nullptr, /*ready=*/true};
  fake_.hold_stream(training, 1);
  ASSERT_TRUE(engine_->OrderAfter(waiting).ok());  // a foreground save, behind the training stream
  std::vector<char> fg(128, 'x'), bg(128, 'x');
  auto f = engine_->CopyToHostAsync(fg.data(), *live, fg.size(), waiting);
  ASSERT_TRUE(f.ok());
  auto b = engine_->CopyToHostAsync(bg.data(), *snapshot, bg.size(), ready);  // the background drain
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*b)->Wait().ok()) << "the background copy finished while the training stream is still busy";
  EXPECT_EQ(bg[0], 0);
  EXPECT_EQ(fg[0], 'x');
  fake_.hold_stream(training, 0);
  ASSERT_TRUE((*f)->Wait().ok());
  EXPECT_EQ(fg[0], 0);
  engine_->FreeDevice(*snapshot, 1);
  engine_->FreeDevice(*live, 1);
}

// Defect: fences were events without CU_EVENT_BLOCKING_SYNC, so every waiting I/O thread spun a core in
// cuEventSynchronize while the copy stream waited for the caller's.
TEST_F(CudaCopyEngineTest, WaitingForAFenceDoesNotSpin) {
  auto mem = engine_->AllocateDevice(64, 1);
  ASSERT_TRUE(mem.ok());
  std::vector<char> out(64);
  const long spins = fake_.count("spinning_waits");
  auto f = engine_->CopyToHostAsync(out.data(), *mem, out.size(), MemoryLocation{MemoryKind::kCuda, 1, nullptr});
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Wait().ok());
  EXPECT_EQ(fake_.count("spinning_waits"), spins);
  engine_->FreeDevice(*mem, 1);
}

double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// Defect: fence waits had no deadline, so a copy stream stuck behind the caller's stream (a kernel that never ends,
// an NCCL kernel waiting for a dead peer) hung save, async save and load forever whatever their timeout. A wait now
// ends at its deadline with kTimeout naming the copy, the copy stream, the device and the caller's stream; the
// waiting threads sleep meanwhile; and the copy still lands if the stream moves later.
TEST_F(CudaCopyEngineTest, AFenceOnAStuckStreamTimesOutNamingTheStreams) {
  cuda::CUstream training = CallerStream(1);
  auto mem = engine_->AllocateDevice(64, 1);
  ASSERT_TRUE(mem.ok());
  const MemoryLocation loc{MemoryKind::kCuda, 1, training};
  fake_.hold_stream(training, 1);  // a kernel that never ends
  ASSERT_TRUE(engine_->OrderAfter(loc).ok());
  std::vector<char> out(64, 'x');
  auto f = engine_->CopyToHostAsync(out.data(), *mem, out.size(), loc);
  ASSERT_TRUE(f.ok()) << f.status().message();
  // Four threads wait at once, as a save's I/O threads do.
  std::vector<Status> got(4);
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> waiters;
  for (Status& g : got) {
    waiters.emplace_back([&] { g = (*f)->WaitUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(400)); });
  }
  for (auto& t : waiters) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = CpuSeconds() - cpu0;
  for (const Status& g : got) {
    EXPECT_EQ(g.code(), StatusCode::kTimeout) << g.message();
    EXPECT_NE(g.message().find("cuda:1"), std::string::npos) << g.message();
    EXPECT_NE(g.message().find(Hex(training)), std::string::npos) << "names the caller's stream: " << g.message();
  }
  EXPECT_GE(wall, 0.39);
  EXPECT_LT(wall, 5.0);
  EXPECT_LT(cpu, 0.25 * wall) << "four waiting threads used " << cpu << " s of CPU in " << wall << " s";
  EXPECT_EQ(out[0], 'x');
  fake_.hold_stream(training, 0);  // the kernel ends after all: the copy lands, and a later wait sees it
  ASSERT_TRUE((*f)->Wait().ok());
  EXPECT_EQ(out[0], 0);
  engine_->FreeDevice(*mem, 1);
}

// Fences complete in the order of their stream, each as soon as its copy is done (one waiter thread per stream): a
// copy on the second stream is not held behind a stuck one on the first.
TEST_F(CudaCopyEngineTest, FencesOfTheTwoStreamsCompleteIndependently) {
  cuda::CUstream training = CallerStream(0);
  auto mem = engine_->AllocateDevice(256, 0);
  ASSERT_TRUE(mem.ok());
  fake_.hold_stream(training, 1);
  const MemoryLocation waiting{MemoryKind::kCuda, 0, training};
  ASSERT_TRUE(engine_->OrderAfter(waiting).ok());
  std::vector<char> a(128), b(128);
  auto stuck = engine_->CopyToHostAsync(a.data(), *mem, a.size(), waiting);
  auto ready = engine_->CopyToHostAsync(b.data(), static_cast<char*>(*mem) + 128, b.size(),
                                        MemoryLocation{MemoryKind::kCuda, 0, nullptr, /*ready=*/true});
  ASSERT_TRUE(stuck.ok() && ready.ok());
  EXPECT_TRUE((*ready)->WaitUntil(std::chrono::steady_clock::now() + std::chrono::seconds(5)).ok());
  EXPECT_EQ((*stuck)->WaitUntil(std::chrono::steady_clock::now()).code(), StatusCode::kTimeout);
  fake_.hold_stream(training, 0);
  EXPECT_TRUE((*stuck)->Wait().ok());
  engine_->FreeDevice(*mem, 0);
}

// Defect: nothing handled fork() after the driver was loaded: a child inherits the driver's state but not its
// threads (nor the engine's fence threads), and CUDA calls there fail or hang. The child gets a clear error.
TEST_F(CudaCopyEngineTest, AChildForkedAfterTheDriverLoadedIsRefusedClearly) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto e = DefaultCopyEngine(MemoryKind::kCuda);
    Status check = CheckDeviceBuffer(MemoryLocation{MemoryKind::kCuda, 0, nullptr}, nullptr);
    const bool refused = !e.ok() && e.status().code() == StatusCode::kState &&
                         e.status().message().find("fork") != std::string::npos &&
                         e.status().message().find("spawn") != std::string::npos && check.code() == StatusCode::kState;
    ::_exit(refused ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the forked child was not refused with a kState error naming fork and spawn";
  EXPECT_TRUE(DefaultCopyEngine(MemoryKind::kCuda).ok()) << "the parent keeps its engine";
}

// Defect 6: a __cuda_array_interface__ without a device fell back to device 0. DCKPT_DEVICE_OF_POINTER asks the
// driver, from a thread with no current context, without making a context on an idle GPU; and a buffer that overruns
// its allocation is refused.
TEST_F(CudaCopyEngineTest, TheDeviceComesFromThePointerAndOverrunsAreRefused) {
  auto mem = engine_->AllocateDevice(256, 1);
  ASSERT_TRUE(mem.ok());
  fake_.strict_pointer_queries(1);
  const long idle_retains = fake_.count("retain:2");
  MemoryLocation loc{MemoryKind::kCuda, kDeviceOfPointer, nullptr};
  Status resolved, overrun, inside;
  std::thread t([&] {  // no current context
    resolved = ResolveDeviceBuffer(&loc, *mem, 256);
    MemoryLocation again{MemoryKind::kCuda, kDeviceOfPointer, nullptr};
    overrun = ResolveDeviceBuffer(&again, static_cast<char*>(*mem) + 128, 256);
    MemoryLocation tail{MemoryKind::kCuda, 1, nullptr};
    inside = ResolveDeviceBuffer(&tail, static_cast<char*>(*mem) + 128, 128);
  });
  t.join();
  ASSERT_TRUE(resolved.ok()) << resolved.message();
  EXPECT_EQ(loc.device, 1);
  EXPECT_EQ(overrun.code(), StatusCode::kInvalidArgument) << overrun.message();
  EXPECT_NE(overrun.message().find("overruns"), std::string::npos) << overrun.message();
  EXPECT_TRUE(inside.ok()) << inside.message();
  EXPECT_EQ(fake_.count("retain:2"), idle_retains) << "no context was made on an idle GPU to ask";
  std::vector<char> host(64);
  MemoryLocation nowhere{MemoryKind::kCuda, kDeviceOfPointer, nullptr};
  EXPECT_EQ(ResolveDeviceBuffer(&nowhere, host.data(), host.size()).code(), StatusCode::kInvalidArgument);
  engine_->FreeDevice(*mem, 1);
}

// Found on an H100: with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True a tensor spans several physical mappings
// of one virtual range, and cuMemGetAddressRange answers with one mapping; the overrun check refused the tensor.
TEST_F(CudaCopyEngineTest, ABufferOverSeveralMappingsOfOneRangeIsAccepted) {
  constexpr uint64_t kChunk = 4096;
  auto mem = engine_->AllocateDevice(5 * kChunk + 100, 1);
  ASSERT_TRUE(mem.ok());
  fake_.map_in_chunks(reinterpret_cast<uintptr_t>(*mem), kChunk);
  char* p = static_cast<char*>(*mem);
  MemoryLocation loc{MemoryKind::kCuda, 1, nullptr};
  Status across = ResolveDeviceBuffer(&loc, p + kChunk / 2, 4 * kChunk + 50);  // from inside one chunk to the last
  EXPECT_TRUE(across.ok()) << across.message();
  EXPECT_TRUE(ResolveDeviceBuffer(&loc, p, 5 * kChunk + 100).ok());
  Status past = ResolveDeviceBuffer(&loc, p + kChunk, 4 * kChunk + 101);  // one byte past the last mapping
  EXPECT_EQ(past.code(), StatusCode::kInvalidArgument) << past.message();
  EXPECT_NE(past.message().find("overruns"), std::string::npos) << past.message();
  EXPECT_NE(past.message().find("then unmapped"), std::string::npos) << past.message();
  engine_->FreeDevice(*mem, 1);
}

// Found on an H100: torch.cuda.graph (global capture mode) on the training thread was invalidated by a background
// save's driver calls (a capture in global mode forbids "unsafe" calls on every thread). Every call the engine makes
// runs in relaxed mode, and the calling thread gets its own mode back.
TEST_F(CudaCopyEngineTest, EngineCallsRunInRelaxedCaptureModeAndLeaveTheThreadsModeAlone) {
  cuda::CUstream training = CallerStream(1);
  const long unrelaxed = fake_.count("unrelaxed");
  int mode_after = -1;
  Status order, copy, wait, info;
  std::thread t([&] {  // a fresh thread: global mode, no context
    const MemoryLocation loc{MemoryKind::kCuda, 1, training};
    auto dev = engine_->AllocateDevice(256, 1);
    auto host = engine_->AllocateHost(256);
    if (!dev.ok() || !host.ok()) return;
    MemoryLocation resolved{MemoryKind::kCuda, kDeviceOfPointer, training};
    order = ResolveDeviceBuffer(&resolved, *dev, 256);
    if (order.ok()) order = engine_->OrderAfter(loc);
    auto f = engine_->CopyToHostAsync(*host, *dev, 256, loc);
    copy = f.status();
    if (f.ok()) wait = (*f)->Wait();
    info = engine_->DeviceMemoryInfo(1).status();
    engine_->FreeHost(*host);
    engine_->FreeDevice(*dev, 1);
    mode_after = fake_.thread_capture_mode();
  });
  t.join();
  EXPECT_TRUE(order.ok() && copy.ok() && wait.ok() && info.ok())
      << order.message() << copy.message() << wait.message() << info.message();
  EXPECT_EQ(fake_.count("unrelaxed"), unrelaxed) << "a driver call ran in the thread's global capture mode";
  EXPECT_EQ(mode_after, 0) << "the thread's own capture mode was not restored";
}

// Ordering the copies after a stream that is capturing a graph would make them part of the graph: refused.
TEST_F(CudaCopyEngineTest, ACallersStreamThatIsCapturingAGraphIsRefused) {
  cuda::CUstream training = CallerStream(1);
  const MemoryLocation loc{MemoryKind::kCuda, 1, training};
  fake_.capture_stream(training, 1);
  Status st = engine_->OrderAfter(loc);
  EXPECT_EQ(st.code(), StatusCode::kState) << st.message();
  EXPECT_NE(st.message().find("capturing a CUDA graph"), std::string::npos) << st.message();
  fake_.capture_stream(training, 0);
  EXPECT_TRUE(engine_->OrderAfter(loc).ok());
}

// Defect: pinned staging memory was allocated under GPU 0's primary context whatever the data's device, so every
// rank of a node made a context on GPU 0.
TEST_F(CudaCopyEngineTest, PinnedMemoryIsMadeUnderTheCallersContextNotGpu0) {
  auto* cuda_engine = static_cast<CudaCopyEngine*>(engine_);
  auto ctx1 = cuda_engine->Context(1);
  ASSERT_TRUE(ctx1.ok());
  const long under0 = fake_.count("host_alloc_under:0");
  const long under1 = fake_.count("host_alloc_under:1");
  ASSERT_EQ(d_->cuCtxPushCurrent(*ctx1), 0);  // a framework thread on cuda:1
  auto p = engine_->AllocateHost(1 << 16);
  cuda::CUcontext popped;
  ASSERT_EQ(d_->cuCtxPopCurrent(&popped), 0);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(fake_.count("host_alloc_under:0"), under0);
  EXPECT_EQ(fake_.count("host_alloc_under:1"), under1 + 1);
  engine_->FreeHost(*p);
}

// Defect: cuPointerGetAttribute ran with whatever context the calling thread had (none, on a fresh thread or JAX's
// main thread), so valid device memory was rejected; and a failed ordinal query was taken as a match.
TEST_F(CudaCopyEngineTest, DeviceBuffersAreCheckedFromAThreadWithNoCurrentContext) {
  auto mem = engine_->AllocateDevice(256, 1);
  ASSERT_TRUE(mem.ok());
  fake_.strict_pointer_queries(1);
  Status on_thread;
  Status wrong_device;
  Status host_memory;
  std::vector<char> plain(64);
  std::thread t([&] {  // a fresh thread: no current context
    on_thread = CheckDeviceBuffer(MemoryLocation{MemoryKind::kCuda, 1, nullptr}, *mem);
    wrong_device = CheckDeviceBuffer(MemoryLocation{MemoryKind::kCuda, 0, nullptr}, *mem);
    host_memory = CheckDeviceBuffer(MemoryLocation{MemoryKind::kCuda, 1, nullptr}, plain.data());
  });
  t.join();
  EXPECT_TRUE(on_thread.ok()) << on_thread.message();
  EXPECT_EQ(wrong_device.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_device.message().find("cuda:1"), std::string::npos) << wrong_device.message();
  EXPECT_EQ(host_memory.code(), StatusCode::kInvalidArgument);
  // A failed ordinal query is an error, not a match.
  fake_.fail("cuPointerGetAttribute", 999, 1);  // the second query (the ordinal) of the next check
  Status failed = CheckDeviceBuffer(MemoryLocation{MemoryKind::kCuda, 1, nullptr}, *mem);
  fake_.fail("cuPointerGetAttribute", 0, 0);
  EXPECT_FALSE(failed.ok());
  engine_->FreeDevice(*mem, 1);
}

// Defect: every device allocation failure was kNoMemory, so an async save fell back to host staging silently on
// errors that were not about memory. Only CUDA_ERROR_OUT_OF_MEMORY is kNoMemory now.
TEST_F(CudaCopyEngineTest, OnlyOutOfMemoryIsNoMemory) {
  fake_.fail("cuMemAlloc", 2, 0);  // CUDA_ERROR_OUT_OF_MEMORY
  auto oom = engine_->AllocateDevice(1024, 0);
  ASSERT_FALSE(oom.ok());
  EXPECT_EQ(oom.status().code(), StatusCode::kNoMemory);
  fake_.fail("cuMemAlloc", 999, 0);  // CUDA_ERROR_UNKNOWN
  auto other = engine_->AllocateDevice(1024, 0);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().code(), StatusCode::kNoMemory);
  EXPECT_NE(other.status().message().find("cuda:0"), std::string::npos) << other.status().message();
}

// Defect: when the copy stream could not be made, the primary context retained just before stayed retained.
TEST_F(CudaCopyEngineTest, AFailedDeviceSetupReleasesThePrimaryContext) {
  auto* cuda_engine = static_cast<CudaCopyEngine*>(engine_);
  fake_.fail("cuStreamCreate", 2, 0);  // CUDA_ERROR_OUT_OF_MEMORY, once
  auto ctx = cuda_engine->Context(2);
  ASSERT_FALSE(ctx.ok());
  EXPECT_NE(ctx.status().message().find("cuStreamCreate"), std::string::npos) << ctx.status().message();
  EXPECT_EQ(fake_.count("retain:2"), 0) << "the context retained for the failed setup was released";
  auto again = cuda_engine->Context(2);  // the failure is not kept: the next use sets the device up
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(fake_.count("retain:2"), 1);
}

}  // namespace
}  // namespace distckpt
