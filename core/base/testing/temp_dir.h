// Scratch directories for tests and test tools: one fresh directory per call.
#ifndef DISTCKPT_CORE_BASE_TESTING_TEMP_DIR_H_
#define DISTCKPT_CORE_BASE_TESTING_TEMP_DIR_H_

#include <string>

namespace distckpt {
namespace testing_util {

/// A fresh, empty directory under $TEST_TMPDIR (Bazel's per-test scratch space, removed afterwards), or under /tmp
/// where that is unset or empty, whose name starts with `prefix`. Aborts the process (after perror) if it cannot be
/// made: nothing a test checks afterwards would mean anything.
std::string MakeTempDir(const std::string& prefix = "test-");

}  // namespace testing_util
}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_TESTING_TEMP_DIR_H_
