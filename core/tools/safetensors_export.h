// Export a committed checkpoint as Hugging Face safetensors files: "<prefix>-0000i-of-0000N.safetensors" plus
// "<prefix>.safetensors.index.json". Every binding (Python, Go's CLI, Rust) reaches this one exporter through
// dckpt_export_safetensors; none of them writes safetensors itself.
#ifndef DISTCKPT_CORE_TOOLS_SAFETENSORS_EXPORT_H_
#define DISTCKPT_CORE_TOOLS_SAFETENSORS_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {

/// 5 GB, counted as Hugging Face counts (10^9 bytes per GB).
constexpr uint64_t kDefaultSafetensorsShardBytes = 5'000'000'000ull;

struct SafetensorsExportOptions {
  /// Largest file to write, header included. A tensor that alone exceeds it gets a file of its own.
  uint64_t max_shard_bytes = kDefaultSafetensorsShardBytes;
  std::string prefix = "model";  ///< file name prefix: a plain name (no '/')
  bool verify = true;            ///< check checksums while reading
  /// Bytes of tensor data held in memory at once. A tensor larger than this is copied region by region (row slabs,
  /// finer slabs for huge rows), so the whole export never holds more than this plus the metadata.
  uint64_t buffer_bytes = 64ull << 20;
  Storage* storage = nullptr;  ///< nullptr: the POSIX filesystem (for reading, and writing unless out_storage is set)
  /// Where the files are written; nullptr: `storage`. On storage without rename (object stores) each file is written
  /// straight to its name (an object appears whole when it is closed); elsewhere under a temporary name renamed last.
  Storage* out_storage = nullptr;
  /// Called with (tensor bytes written so far, total tensor bytes); non-zero aborts with kUser.
  std::function<int(uint64_t done, uint64_t total)> progress;
};

struct SafetensorsExportSummary {
  std::vector<std::string> files;  ///< the .safetensors files written, in order (names, not paths)
  std::string index_file;          ///< "<prefix>.safetensors.index.json"
  uint64_t num_tensors = 0;
  uint64_t total_size = 0;  ///< tensor data bytes (the index's metadata.total_size)
  uint64_t skipped_bytes_entries = 0;
};

/// The safetensors dtype string of `dtype` ("F32", "BF16", "F8_E4M3", ...); nullptr where safetensors has none
/// (C128).
const char* SafetensorsDTypeName(DType dtype);

/// Writes every tensor of the checkpoint at `ckpt_path` into the existing directory `out_dir`.
///  - Tensors are assigned to files in name order; a file is closed when the next tensor would push it past
///    max_shard_bytes. Inside a file, tensors are laid out by element size (largest first), then name, so that every
///    tensor starts at an offset aligned to its element size.
///  - Each file's "__metadata__" holds the checkpoint's user metadata, plus "format": "pt" unless the user metadata
///    sets "format" (transformers refuses files without it).
///  - Bytes entries are not tensors: they are skipped (and counted in the summary).
///  - A C128 tensor has no safetensors dtype: the export fails with kUnsupported naming it, before anything is
///    written.
///  - Files are written under temporary names and renamed into place once complete and synced; existing files with
///    the final names are replaced.
Result<SafetensorsExportSummary> ExportSafetensors(const std::string& ckpt_path, const std::string& out_dir,
                                                   const SafetensorsExportOptions& options);

namespace internal_safetensors {

/// `s` as a JSON string literal, quotes included (escapes '"', '\\' and control characters; UTF-8 passes through).
std::string JsonQuote(std::string_view s);

}  // namespace internal_safetensors
}  // namespace distckpt

#endif  // DISTCKPT_CORE_TOOLS_SAFETENSORS_EXPORT_H_
