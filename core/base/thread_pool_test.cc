#include "core/base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace distckpt {
namespace {

// A one-shot gate: tasks block in Wait() until the test calls Open().
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(ThreadPoolTest, ZeroThreadsMeansHardwareConcurrency) {
  ThreadPool pool(0);
  EXPECT_GE(pool.size(), 1u);
  ThreadPool three(3);
  EXPECT_EQ(three.size(), 3u);
}

TEST(ThreadPoolTest, DestructionRunsEveryQueuedTask) {
  std::atomic<int> ran{0};
  Gate gate;
  {
    ThreadPool pool(1);
    // The first task holds the only worker, so the rest are still queued when the destructor starts.
    pool.Submit([&] {
      gate.Wait();
      ran.fetch_add(1);
    });
    for (int i = 0; i < 50; ++i) pool.Submit([&] { ran.fetch_add(1); });
    gate.Open();
  }
  EXPECT_EQ(ran.load(), 51);
}

TEST(TaskGroupTest, RunsEverythingWhenNothingFails) {
  ThreadPool pool(4);
  std::atomic<int> ran{0};
  TaskGroup group(&pool);
  for (int i = 0; i < 1000; ++i) {
    group.Run([&] {
      ran.fetch_add(1);
      return OkStatus();
    });
  }
  EXPECT_TRUE(group.Wait().ok());
  EXPECT_EQ(ran.load(), 1000);
  EXPECT_FALSE(group.cancelled());
}

TEST(TaskGroupTest, WaitOnAnEmptyGroupIsOk) {
  ThreadPool pool(1);
  TaskGroup group(&pool);
  EXPECT_TRUE(group.Wait().ok());
}

TEST(TaskGroupTest, ReturnsTheFirstError) {
  // One worker runs tasks in submission order, so "first" is well defined.
  ThreadPool pool(1);
  TaskGroup group(&pool);
  group.Run([] { return OkStatus(); });
  group.Run([] { return NotFound("first"); });
  group.Run([] { return Corrupt("second"); });
  Status st = group.Wait();
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "first");
  EXPECT_TRUE(group.cancelled());
  // Wait is repeatable and keeps reporting the same error.
  EXPECT_EQ(group.Wait().message(), "first");
}

TEST(TaskGroupTest, ConcurrentFailuresReportExactlyOneOfThem) {
  ThreadPool pool(4);
  TaskGroup group(&pool);
  for (int i = 0; i < 100; ++i) group.Run([i] { return IoError("task " + std::to_string(i)); });
  Status st = group.Wait();
  EXPECT_EQ(st.code(), StatusCode::kIo);
  EXPECT_EQ(st.message().rfind("task ", 0), 0u) << st.message();
}

TEST(TaskGroupTest, CancelsTasksThatHaveNotStarted) {
  ThreadPool pool(1);
  TaskGroup group(&pool);
  Gate gate;
  std::atomic<int> ran_after_failure{0};
  // The failing task holds the only worker until everything else is queued behind it.
  group.Run([&] {
    gate.Wait();
    return IoError("disk on fire");
  });
  for (int i = 0; i < 20; ++i) {
    group.Run([&] {
      ran_after_failure.fetch_add(1);
      return OkStatus();
    });
  }
  gate.Open();
  Status st = group.Wait();
  EXPECT_EQ(st.code(), StatusCode::kIo);
  EXPECT_EQ(ran_after_failure.load(), 0);

  // Tasks added after the failure are skipped too.
  group.Run([&] {
    ran_after_failure.fetch_add(1);
    return OkStatus();
  });
  EXPECT_EQ(group.Wait().code(), StatusCode::kIo);
  EXPECT_EQ(ran_after_failure.load(), 0);
}

TEST(TaskGroupTest, RunningTasksCanObserveCancellation) {
  ThreadPool pool(2);
  TaskGroup group(&pool);
  Gate started;
  std::atomic<bool> saw_cancel{false};
  group.Run([&] {
    started.Open();
    // Stands in for a long copy loop that polls cancelled() between chunks.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!group.cancelled() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    saw_cancel = group.cancelled();
    return OkStatus();
  });
  group.Run([&] {
    started.Wait();
    return Corrupt("bad chunk");
  });
  EXPECT_EQ(group.Wait().code(), StatusCode::kCorrupt);
  EXPECT_TRUE(saw_cancel.load());
}

TEST(TaskGroupTest, GroupsSharingAPoolAreIndependent) {
  ThreadPool pool(2);
  TaskGroup failing(&pool);
  TaskGroup healthy(&pool);
  std::atomic<int> healthy_ran{0};
  failing.Run([] { return IoError("boom"); });
  EXPECT_FALSE(failing.Wait().ok());
  for (int i = 0; i < 10; ++i) {
    healthy.Run([&] {
      healthy_ran.fetch_add(1);
      return OkStatus();
    });
  }
  EXPECT_TRUE(healthy.Wait().ok());
  EXPECT_EQ(healthy_ran.load(), 10);
}

TEST(TaskGroupTest, DestructionWaitsForRunningAndQueuedTasks) {
  ThreadPool pool(2);
  std::atomic<int> finished{0};
  {
    TaskGroup group(&pool);
    for (int i = 0; i < 8; ++i) {
      group.Run([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        finished.fetch_add(1);
        return OkStatus();
      });
    }
    // No Wait(): the destructor must drain, or the tasks would touch a dead group.
  }
  EXPECT_EQ(finished.load(), 8);
}

}  // namespace
}  // namespace distckpt
