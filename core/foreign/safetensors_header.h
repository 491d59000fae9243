// The safetensors header parser, with safetensors' own validation rules. The one parser of the project: Python, Rust
// and Go reach it through the C ABI (a reader opening a safetensors checkpoint). No I/O here, so that the fuzz target
// (core/foreign/fuzz) links it alone.
#ifndef DISTCKPT_CORE_FOREIGN_SAFETENSORS_HEADER_H_
#define DISTCKPT_CORE_FOREIGN_SAFETENSORS_HEADER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/status.h"

namespace distckpt {

/// safetensors' own limit on the JSON header.
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kInvalid;
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;  ///< data_offsets: relative to the start of the byte buffer
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                 ///< 8 + the header's length: where the byte buffer starts in the file
  std::vector<SafetensorsTensor> tensors;  ///< sorted by begin
  std::vector<std::pair<std::string, std::string>> metadata;  ///< "__metadata__", as written
};

/// Parses and validates the header of a safetensors file of `file_size` bytes whose first 8 bytes give the header
/// length `header_len` and whose next `header_len` bytes are `json`. The rules are safetensors' own: the length is at
/// most kMaxSafetensorsHeader and inside the file; the header is a JSON object (trailing spaces allowed) of tensors
/// {"dtype", "shape", "data_offsets"} and an optional "__metadata__" object of strings; every dtype is known and
/// every size matches its shape; the tensors' byte ranges, in order, cover the byte buffer exactly (no overlap, no
/// gap, nothing past its end). Stricter than safetensors: a name may appear once, and unknown member names are
/// refused. Every error is kCorrupt (kUnsupported for a dtype or rank distckpt lacks) and starts with `file`.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t header_len, uint64_t file_size,
                                                 const std::string& file);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_SAFETENSORS_HEADER_H_
