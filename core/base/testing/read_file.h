// Whole-file reads and writes for tests that look at the bytes a checkpoint left on disk, or make files by hand.
#ifndef DISTCKPT_CORE_BASE_TESTING_READ_FILE_H_
#define DISTCKPT_CORE_BASE_TESTING_READ_FILE_H_

#include <string>

namespace distckpt {
namespace testing_util {

/// Every byte of the file at `path`; empty if it cannot be opened (tests compare sizes or contents, so a missing
/// file shows up as a failed comparison naming the path).
std::string ReadFileToString(const std::string& path);

/// Writes `bytes` as the whole file at `path` (created or replaced).
void WriteStringToFile(const std::string& path, const std::string& bytes);

}  // namespace testing_util
}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_TESTING_READ_FILE_H_
