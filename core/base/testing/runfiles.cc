// Runfile: $TEST_SRCDIR/$TEST_WORKSPACE/path.
#include "core/base/testing/runfiles.h"

#include <unistd.h>

#include <cstdlib>

namespace distckpt {
namespace testing_util {

std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (dir == nullptr || *dir == '\0') return "";
  const std::string full =
      std::string(dir) + "/" + (workspace != nullptr && *workspace ? workspace : "distckpt") + "/" + path;
  return ::access(full.c_str(), R_OK) == 0 ? full : "";
}

}  // namespace testing_util
}  // namespace distckpt
