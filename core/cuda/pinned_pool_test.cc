#include "core/cuda/pinned_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/cuda/host_copy_engine.h"

namespace distckpt {
namespace {

TEST(PinnedPoolTest, NeverAllocatesMoreThanCountAndReusesBuffers) {
  HostCopyEngine engine;
  {
    PinnedPool pool(&engine, 1 << 16, 3);
    for (int round = 0; round < 50; ++round) {
      std::vector<char*> held;
      for (int i = 0; i < 3; ++i) held.push_back(pool.Acquire().value());
      for (char* b : held) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 4096, 0u);
        pool.Release(b);
      }
    }
    EXPECT_EQ(pool.allocated(), 3u);
    EXPECT_EQ(pool.max_in_use(), 3u);
    EXPECT_EQ(pool.in_use(), 0u);
    EXPECT_EQ(engine.live_allocations(), 3);
  }
  EXPECT_EQ(engine.live_allocations(), 0);
}

TEST(PinnedPoolTest, AcquireBlocksUntilABufferIsReleased) {
  HostCopyEngine engine;
  PinnedPool pool(&engine, 4096, 2);
  char* a = pool.Acquire().value();
  char* b = pool.Acquire().value();
  std::atomic<bool> got{false};
  std::thread t([&] {
    char* c = pool.Acquire().value();
    got = true;
    pool.Release(c);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(got.load()) << "a third buffer was handed out while two were in use";
  pool.Release(a);
  t.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(pool.waits(), 1u);
  EXPECT_EQ(pool.allocated(), 2u);
  pool.Release(b);
}

TEST(PinnedPoolTest, CancelledWaitReturnsTheCancellationStatus) {
  HostCopyEngine engine;
  PinnedPool pool(&engine, 4096, 1);
  char* a = pool.Acquire().value();
  std::atomic<bool> cancel{false};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cancel = true;
  });
  auto r = pool.Acquire([&] { return cancel ? Status(StatusCode::kUser, "stop") : OkStatus(); });
  t.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUser);
  EXPECT_EQ(pool.in_use(), 1u);
  pool.Release(a);
}

TEST(PinnedPoolTest, EngineCachesOnePoolPerShape) {
  HostCopyEngine engine;
  auto p1 = engine.StagingPool(8192, 2).value();
  auto p2 = engine.StagingPool(8192, 2).value();
  EXPECT_EQ(p1.get(), p2.get());
  auto p3 = engine.StagingPool(8192, 4).value();
  EXPECT_NE(p1.get(), p3.get());
}

}  // namespace
}  // namespace distckpt
