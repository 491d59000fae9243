// Hugging Face safetensors checkpoints read in place: the description of a file, or of a hub-style directory of
// shards with its index, as a foreign checkpoint (FORMAT.md 2.4) that every reader path (resharded loads, regions,
// mappings, device loads, the CLI) then reads directly. Headers are parsed by safetensors_header.h.
#ifndef DISTCKPT_CORE_FOREIGN_SAFETENSORS_H_
#define DISTCKPT_CORE_FOREIGN_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/foreign/safetensors_header.h"
#include "core/format/metadata.h"
#include "core/storage/storage.h"

namespace distckpt {

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
/// The layout one index file `index` in `dir` gives (its weight_map's files).
Result<SafetensorsLayout> ReadSafetensorsIndex(Directory* dir, const std::string& dir_path, const std::string& index);

/// The description (MetadataRecord with source "safetensors") of the files of `layout` in `dir`: one tensor entry
/// per tensor, its one chunk where the file holds it. With an index, every tensor the index maps must be in the file
/// it names, and no tensor may be in two files. "__metadata__" becomes user key/values (a key two files give
/// different values keeps the first). `context` (the checkpoint's path) starts every error.
Result<MetadataRecord> DescribeSafetensors(Directory* dir, const SafetensorsLayout& layout, const std::string& context);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_SAFETENSORS_H_
