// Files a Bazel test finds in its runfiles (the `data` of its target).
#ifndef DISTCKPT_CORE_BASE_TESTING_RUNFILES_H_
#define DISTCKPT_CORE_BASE_TESTING_RUNFILES_H_

#include <string>

namespace distckpt {
namespace testing_util {

/// The absolute path of `path` (relative to the workspace root, e.g. "core/comm/gloo/libdistckpt_gloo.so") in the
/// test's runfiles, or "" where it is not there (a test binary run outside `bazel test`).
std::string Runfile(const std::string& path);

}  // namespace testing_util
}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_TESTING_RUNFILES_H_
