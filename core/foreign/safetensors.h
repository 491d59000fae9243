// Hugging Face safetensors files, read in place: the header parser (with safetensors' own validation rules) and the
// description of a file, or of a hub-style directory of shards with its index, as a foreign checkpoint (FORMAT.md
// 2.4) that every reader path (resharded loads, regions, mappings, device loads, the CLI) then reads directly.
// This is the one safetensors parser of the project: Python, Rust and Go reach it through the C ABI.
#ifndef DISTCKPT_CORE_FOREIGN_SAFETENSORS_H_
#define DISTCKPT_CORE_FOREIGN_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/status.h"
#include "core/format/metadata.h"
#include "core/storage/storage.h"

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

/// Reads and parses the header of `file` (its first 8 + length bytes only).
Result<SafetensorsHeader> ReadSafetensorsHeader(const ReadableFile& file);

/// The safetensors files of a checkpoint directory: the files its index (`*.safetensors.index.json`) names, or,
/// without an index, every `*.safetensors` file in it. Empty if it holds neither. `listing` is the directory's
/// entries.
struct SafetensorsLayout {
  std::string index;                                            ///< the index file's name, or "" without one
  std::vector<std::string> files;                               ///< data files, sorted
  std::vector<std::pair<std::string, std::string>> weight_map;  ///< the index's (tensor, file) pairs
};
Result<SafetensorsLayout> FindSafetensorsLayout(Directory* dir, const std::string& dir_path,
                                                const std::vector<std::string>& listing);

/// The description (MetadataRecord with source "safetensors") of the files of `layout` in `dir`: one tensor entry
/// per tensor, its one chunk where the file holds it. With an index, every tensor the index maps must be in the file
/// it names, and no tensor may be in two files. "__metadata__" becomes user key/values (a key two files give
/// different values keeps the first). `context` (the checkpoint's path) starts every error.
Result<MetadataRecord> DescribeSafetensors(Directory* dir, const SafetensorsLayout& layout, const std::string& context);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_SAFETENSORS_H_
