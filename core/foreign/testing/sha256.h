// SHA-256 (FIPS 180-4) for the tests that compare tensors read in place with the hashes a Python generator wrote.
#ifndef DISTCKPT_CORE_FOREIGN_TESTING_SHA256_H_
#define DISTCKPT_CORE_FOREIGN_TESTING_SHA256_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace distckpt {
namespace testing_util {

/// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t size);
  /// The digest as 64 lower-case hex digits. The object is spent afterwards.
  std::string HexDigest();

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

/// The hex digest of `data`.
std::string Sha256Hex(std::string_view data);

}  // namespace testing_util
}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_TESTING_SHA256_H_
