// Helpers shared by the engine's tests: whole-file writes and copies that get stuck (scratch directories and
// whole-file reads are core/base/testing's).
#ifndef DISTCKPT_CORE_ENGINE_ENGINE_TEST_UTIL_H_
#define DISTCKPT_CORE_ENGINE_ENGINE_TEST_UTIL_H_

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <string>

#include "core/base/status.h"

namespace distckpt {
namespace testing_util {

inline void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

// A copy stream that does not move (a kernel that never ends on the caller's stream): install() makes every copy of a
// HostCopyEngine from the `from`-th on block until Release() (or 60 s); the engine's worker runs copies in order, so
// those after it wait too. Release before the engine is destroyed (its destructor joins the worker, which then runs
// the late copies: declare what they read and write, and this, before the engine).
class StuckCopies {
 public:
  template <typename Engine>
  void Install(Engine* engine, uint64_t from = 0) {
    engine->set_before_copy([this, from](uint64_t index) {
      std::unique_lock<std::mutex> lock(mu_);
      if (index >= from) cv_.wait_for(lock, std::chrono::seconds(60), [this] { return released_; });
      return Status();
    });
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

}  // namespace testing_util
}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_ENGINE_TEST_UTIL_H_
