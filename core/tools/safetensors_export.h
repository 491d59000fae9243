// Export a committed checkpoint as Hugging Face safetensors files: "<prefix>-0000i-of-0000N.safetensors" plus
// "<prefix>.safetensors.index.json". Every binding (Python, Go's CLI, Rust) reaches this one exporter through
// dckpt_export_safetensors; none of them writes safetensors itself.
#ifndef DISTCKPT_CORE_TOOLS_SAFETENSORS_EXPORT_H_
#define DISTCKPT_CORE_TOOLS_SAFETENSORS_EXPORT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/status.h"
#include "core/comm/communicator.h"
#include "core/foreign/json.h"
#include "core/storage/storage.h"
#include "core/tools/name_rules.h"

namespace distckpt {

/// 5 GB, counted as Hugging Face counts (10^9 bytes per GB).
constexpr uint64_t kDefaultSafetensorsShardBytes = 5'000'000'000ull;
/// The default of SafetensorsExportOptions::buffer_bytes.
constexpr uint64_t kDefaultExportBufferBytes = 64ull << 20;

struct SafetensorsExportOptions {
  /// Largest file to write, header included. A tensor that alone exceeds it gets a file of its own.
  uint64_t max_shard_bytes = kDefaultSafetensorsShardBytes;
  std::string prefix = "model";  ///< file name prefix: a plain name (no '/')
  bool verify = true;            ///< check checksums while reading
  /// Bytes of tensor data this process holds in memory at once, all its writing threads together: each thread
  /// streams its files through a ring of four buffers of buffer_bytes / io_threads / 5 (the fifth share is for the
  /// checkpoint pages the reader maps while filling one), and the reader gets buffer_bytes / 16 MiB I/O threads (each
  /// may hold an 8 MiB segment of data not in the page cache). Files of any size stream through them, so the export's
  /// memory is about this plus the metadata.
  uint64_t buffer_bytes = kDefaultExportBufferBytes;
  /// Files this process writes at once, each by a thread of its own (0: 1). Every thread keeps up to three writes in
  /// flight while it fills the next buffer.
  size_t io_threads = 0;
  /// Rename rules (core/tools/name_rules.h: ECMAScript patterns matched against the whole name, first match wins,
  /// \1 or \g<N> in replacements, an empty replacement drops the tensor). Applied to every tensor name before the
  /// files are planned; the files, the headers and the index carry the new names.
  std::vector<NameRule> rename_rules;
  /// The group exporting together: ExportSafetensors is then collective over it (every rank passes the same
  /// arguments; `out_dir` must be one directory all ranks see). The output files are split among the ranks,
  /// balanced by bytes, each rank writes its own in parallel, and once every rank reports its files durable, rank 0
  /// moves them into place and writes the index. On any failure no index is written. nullptr: this process alone.
  Communicator* comm = nullptr;
  /// The collectives' timeout: it must cover the slowest rank's writing (they wait for each other at the end).
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  Storage* storage = nullptr;  ///< nullptr: the POSIX filesystem (for reading, and writing unless out_storage is set)
  /// Where the files are written; nullptr: `storage`. On storage without rename (object stores) each file is written
  /// straight to its name (an object appears whole when it is closed); elsewhere under a temporary name renamed last.
  Storage* out_storage = nullptr;
  /// Called with (tensor bytes written so far, total tensor bytes), counting the files this process writes; non-zero
  /// aborts with kUser. Called from the writing threads, one call at a time.
  std::function<int(uint64_t done, uint64_t total)> progress;
};

struct SafetensorsExportSummary {
  std::vector<std::string> files;  ///< the .safetensors files written, in order (names, not paths), by all ranks
  std::string index_file;          ///< "<prefix>.safetensors.index.json"
  uint64_t num_tensors = 0;
  uint64_t total_size = 0;  ///< tensor data bytes (the index's metadata.total_size)
  uint64_t skipped_bytes_entries = 0;
  uint64_t dropped_tensors = 0;     ///< tensors a rename rule left out
  uint64_t bytes_written_here = 0;  ///< file bytes (headers included) this process wrote
  size_t files_written_here = 0;    ///< files this process wrote
};

/// The safetensors dtype string of `dtype` ("F32", "BF16", "F8_E4M3", ...); nullptr where safetensors has none
/// (C128).
const char* SafetensorsDTypeName(DType dtype);

/// Writes every tensor of the checkpoint at `ckpt_path` into the existing directory `out_dir`.
///  - Names are mapped by `rename_rules` first (tensors they drop are left out; collisions fail before anything is
///    written). Tensors are assigned to files in order of their exported names; a file is closed when the next tensor
///    would push it past max_shard_bytes. Inside a file, tensors are laid out by element size (largest first), then
///    name, so that every tensor starts at an offset aligned to its element size.
///  - Each file's "__metadata__" holds the checkpoint's user metadata, plus "format": "pt" unless the user metadata
///    sets "format" (transformers refuses files without it).
///  - Bytes entries are not tensors: they are skipped (and counted in the summary).
///  - A C128 tensor has no safetensors dtype: the export fails with kUnsupported naming it, before anything is
///    written (unless a rule drops it).
///  - Each file is written as one stream of whole buffers at buffer-aligned offsets (the POSIX storage sends them
///    past the page cache with O_DIRECT), under a temporary name, then synced; once all files are durable they are
///    renamed into place (an index of an earlier export at the same path is removed first), the index last.
///    Existing files with the final names are replaced.
///  - With `comm`, collective (see SafetensorsExportOptions::comm); every rank returns the same status.
Result<SafetensorsExportSummary> ExportSafetensors(const std::string& ckpt_path, const std::string& out_dir,
                                                   const SafetensorsExportOptions& options);

namespace internal_safetensors {

/// `s` as a JSON string literal: core/foreign/json.h's, the one the project has.
using ::distckpt::JsonQuote;

}  // namespace internal_safetensors
}  // namespace distckpt

#endif  // DISTCKPT_CORE_TOOLS_SAFETENSORS_EXPORT_H_
