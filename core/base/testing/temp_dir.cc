// MakeTempDir: mkdtemp(3) under $TEST_TMPDIR or /tmp.
#include "core/base/testing/temp_dir.h"

#include <stdio.h>
#include <stdlib.h>

#include <vector>

namespace distckpt {
namespace testing_util {

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/" + prefix + "XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    std::perror(("mkdtemp " + pattern).c_str());
    std::abort();
  }
  return std::string(buf.data());
}

}  // namespace testing_util
}  // namespace distckpt
