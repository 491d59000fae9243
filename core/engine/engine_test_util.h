// Helpers shared by the engine's tests: scratch directories and whole-file reads and writes.
#ifndef DISTCKPT_CORE_ENGINE_ENGINE_TEST_UTIL_H_
#define DISTCKPT_CORE_ENGINE_ENGINE_TEST_UTIL_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace distckpt {
namespace testing_util {

/// A new, empty directory under Bazel's per-test scratch space (or /tmp).
inline std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  static int counter = 0;
  const std::string dir = std::string(t ? t : "/tmp") + "/engine_test_" + std::to_string(getpid()) + "_" +
                          std::to_string(counter++);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

}  // namespace testing_util
}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_ENGINE_TEST_UTIL_H_
