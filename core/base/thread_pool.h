// A fixed-size thread pool and a task group that collects the first error.
#ifndef DISTCKPT_CORE_BASE_THREAD_POOL_H_
#define DISTCKPT_CORE_BASE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/base/status.h"

namespace distckpt {

class ThreadPool {
 public:
  /// threads == 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(size_t threads);
  ~ThreadPool();  ///< Runs every queued task, then joins.
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Submit(std::function<void()> task);
  size_t size() const { return workers_.size(); }

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

/// Runs Status-returning tasks on a pool; Wait() returns the first error. After an error, tasks not yet started are
/// skipped (cancelled() turns true so long-running tasks can stop early). A task's captures are destroyed before
/// Wait() returns. Never call Wait() from inside a task of the same pool: it can deadlock a small pool.
class TaskGroup {
 public:
  explicit TaskGroup(ThreadPool* pool) : pool_(pool) {}
  ~TaskGroup() { (void)Wait(); }
  void Run(std::function<Status()> task);
  Status Wait();
  bool cancelled() const { return failed_.load(std::memory_order_relaxed); }

 private:
  ThreadPool* pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t pending_ = 0;
  Status first_error_;
  std::atomic<bool> failed_{false};
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_THREAD_POOL_H_
