#include "core/base/dtype.h"

#include <cctype>
#include <string>

namespace distckpt {
namespace {

struct DTypeRow {
  DType dtype;
  size_t size;
  const char* name;
  const char* alias;  // numpy / torch style
};

constexpr DTypeRow kRows[] = {
    {DType::kInvalid, 0, "INVALID", "invalid"},
    {DType::kBool, 1, "BOOL", "bool"},
    {DType::kU8, 1, "U8", "uint8"},
    {DType::kI8, 1, "I8", "int8"},
    {DType::kU16, 2, "U16", "uint16"},
    {DType::kI16, 2, "I16", "int16"},
    {DType::kU32, 4, "U32", "uint32"},
    {DType::kI32, 4, "I32", "int32"},
    {DType::kU64, 8, "U64", "uint64"},
    {DType::kI64, 8, "I64", "int64"},
    {DType::kF16, 2, "F16", "float16"},
    {DType::kBF16, 2, "BF16", "bfloat16"},
    {DType::kF32, 4, "F32", "float32"},
    {DType::kF64, 8, "F64", "float64"},
    {DType::kC64, 8, "C64", "complex64"},
    {DType::kC128, 16, "C128", "complex128"},
    {DType::kF8E4M3FN, 1, "F8_E4M3", "float8_e4m3fn"},
    {DType::kF8E5M2, 1, "F8_E5M2", "float8_e5m2"},
};
static_assert(sizeof(kRows) / sizeof(kRows[0]) == kNumDTypes, "dtype table out of date");

bool EqualsIgnoreCase(std::string_view a, const char* b) {
  size_t i = 0;
  for (; i < a.size() && b[i] != '\0'; ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return i == a.size() && b[i] == '\0';
}

}  // namespace

bool IsValidDType(uint32_t raw) { return raw > 0 && raw < static_cast<uint32_t>(kNumDTypes); }

size_t DTypeSize(DType dtype) {
  auto i = static_cast<uint32_t>(dtype);
  return i < static_cast<uint32_t>(kNumDTypes) ? kRows[i].size : 0;
}

const char* DTypeName(DType dtype) {
  auto i = static_cast<uint32_t>(dtype);
  return i < static_cast<uint32_t>(kNumDTypes) ? kRows[i].name : "INVALID";
}

DType DTypeFromName(std::string_view name) {
  for (int i = 1; i < kNumDTypes; ++i) {
    if (EqualsIgnoreCase(name, kRows[i].name) || EqualsIgnoreCase(name, kRows[i].alias)) return kRows[i].dtype;
  }
  return DType::kInvalid;
}

}  // namespace distckpt
