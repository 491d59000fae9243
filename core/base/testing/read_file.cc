// ReadFileToString / WriteStringToFile: one binary read or write of a whole file.
#include "core/base/testing/read_file.h"

#include <fstream>
#include <iterator>

namespace distckpt {
namespace testing_util {

std::string ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteStringToFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace testing_util
}  // namespace distckpt
