// ReadFileToString: one binary read of a whole file.
#include "core/base/testing/read_file.h"

#include <fstream>
#include <iterator>

namespace distckpt {
namespace testing_util {

std::string ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace testing_util
}  // namespace distckpt
