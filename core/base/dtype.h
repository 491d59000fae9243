// Element types. The numeric values are stored in checkpoints and exposed in the C ABI: never renumber.
#ifndef DISTCKPT_CORE_BASE_DTYPE_H_
#define DISTCKPT_CORE_BASE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace distckpt {

/// All element types are stored little-endian.
enum class DType : uint8_t {
  kInvalid = 0,
  kBool = 1,
  kU8 = 2,
  kI8 = 3,
  kU16 = 4,
  kI16 = 5,
  kU32 = 6,
  kI32 = 7,
  kU64 = 8,
  kI64 = 9,
  kF16 = 10,
  kBF16 = 11,
  kF32 = 12,
  kF64 = 13,
  kC64 = 14,
  kC128 = 15,
  kF8E4M3FN = 16,
  kF8E5M2 = 17,
};

constexpr int kNumDTypes = 18;  // including kInvalid

/// True for every defined dtype except kInvalid.
bool IsValidDType(uint32_t raw);
/// Size of one element in bytes; 0 for kInvalid.
size_t DTypeSize(DType dtype);
/// The canonical name, matching safetensors' strings where it has one ("F32", "BF16", "F8_E4M3").
const char* DTypeName(DType dtype);
/// Parses a canonical name (case-insensitive; also accepts numpy-like aliases such as "float32").
DType DTypeFromName(std::string_view name);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_DTYPE_H_
