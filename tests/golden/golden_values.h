// The values stored in the golden checkpoints: a pure function of (tensor name, element index, byte), so the test
// that reads the committed checkpoints does not depend on the program that wrote them.
#ifndef DISTCKPT_TESTS_GOLDEN_GOLDEN_VALUES_H_
#define DISTCKPT_TESTS_GOLDEN_GOLDEN_VALUES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/dtype.h"

namespace distckpt {
namespace golden {

struct GoldenTensor {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  uint64_t row_pieces;  // saved as this many row slabs (1 = whole)
};

inline uint8_t GoldenByte(const std::string& name, uint64_t element, uint64_t byte) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return static_cast<uint8_t>((h >> 24) + element * 29 + byte * 7 + (element >> 7));
}

/// The tensors of golden checkpoint "v1_all_dtypes".
inline std::vector<GoldenTensor> AllDtypesTensors() {
  std::vector<GoldenTensor> t;
  const DType dtypes[] = {DType::kBool, DType::kU8,  DType::kI8,  DType::kU16, DType::kI16, DType::kU32,
                          DType::kI32,  DType::kU64, DType::kI64, DType::kF16, DType::kBF16, DType::kF32,
                          DType::kF64,  DType::kC64, DType::kC128, DType::kF8E4M3FN, DType::kF8E5M2};
  for (DType d : dtypes) t.push_back({std::string("dtypes.") + DTypeName(d), d, {5, 3}, 2});
  t.push_back({"shapes.scalar", DType::kF64, {}, 1});
  t.push_back({"shapes.empty", DType::kF32, {0, 4}, 1});
  t.push_back({"shapes.rank8", DType::kU8, {2, 1, 2, 1, 2, 1, 2, 3}, 2});
  // 40 KB in 3 row pieces with 4 KiB checksum blocks: multi-block chunks with block tables.
  t.push_back({"model.layers.0.weight", DType::kF32, {100, 100}, 3});
  t.push_back({"model.embed", DType::kBF16, {64, 32}, 4});
  return t;
}

inline const char* GoldenBytesValue() { return "{\"step\": 42, \"rng\": [1, 2, 3]}"; }

}  // namespace golden
}  // namespace distckpt

#endif  // DISTCKPT_TESTS_GOLDEN_GOLDEN_VALUES_H_
