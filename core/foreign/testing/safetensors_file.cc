#include "core/foreign/testing/safetensors_file.h"

#include <cstdint>

namespace distckpt {
namespace testing_util {

std::string SafetensorsFile(const std::string& header, const std::string& data) {
  std::string h = header;
  while ((8 + h.size()) % 8 != 0) h += ' ';
  std::string out(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + h + data;
}

}  // namespace testing_util
}  // namespace distckpt
