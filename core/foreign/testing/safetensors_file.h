// Safetensors files made by hand, byte by byte, for tests of the parser and of the readers (the real library's files
// are in tests/fixtures/safetensors).
#ifndef DISTCKPT_CORE_FOREIGN_TESTING_SAFETENSORS_FILE_H_
#define DISTCKPT_CORE_FOREIGN_TESTING_SAFETENSORS_FILE_H_

#include <string>

namespace distckpt {
namespace testing_util {

/// A safetensors file: the 8-byte little-endian header length, `header` padded with spaces to a multiple of 8 bytes
/// (as the safetensors library writes it), then `data`.
std::string SafetensorsFile(const std::string& header, const std::string& data);

}  // namespace testing_util
}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_TESTING_SAFETENSORS_FILE_H_
