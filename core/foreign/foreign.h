// Checkpoints other libraries wrote, read in place: a reader that finds no metadata.dckpt asks this package whether
// the directory (or file) is a Hugging Face safetensors checkpoint or a PyTorch DCP one, and gets back a description
// in distckpt's schema (FORMAT.md 2.4) over the foreign files as they are. Nothing is converted or copied.
#ifndef DISTCKPT_CORE_FOREIGN_FOREIGN_H_
#define DISTCKPT_CORE_FOREIGN_FOREIGN_H_

#include <optional>
#include <string>
#include <string_view>

#include "core/base/status.h"
#include "core/format/metadata.h"
#include "core/storage/storage.h"

namespace distckpt {

/// The description of the foreign checkpoint in directory `dir` (at `dir_path` on `storage`), which holds no
/// metadata.dckpt: a PyTorch DCP checkpoint if it holds `.metadata`, else a safetensors one if it holds an index or
/// `.safetensors` files. nullopt if it is neither. Errors name `path` (the checkpoint as the caller named it: the
/// same as dir_path, or a hub cache repository whose snapshot dir is, hub_cache.h) and the file at fault.
Result<std::optional<MetadataRecord>> DescribeForeignDirectory(Storage* storage, Directory* dir,
                                                               const std::string& dir_path, const std::string& path);

/// The description of the checkpoint one file `name` in directory `dir` stands for: a safetensors file on its own,
/// or a safetensors index (`*.safetensors.index.json`) with the shards it names. `path` (the file's own path) names
/// it in errors.
Result<MetadataRecord> DescribeSafetensorsFile(Directory* dir, const std::string& dir_path, const std::string& name,
                                               const std::string& path);

/// The version a foreign format records of itself, as it records it: DCP's `.metadata` version ("1.0.0"). Empty for a
/// format that records none (safetensors; DCP written before torch 2.5 had a version field) and for a distckpt
/// checkpoint (whose version is its format_major and format_minor). Points into `metadata`'s buffer (NUL-terminated).
std::string_view ForeignFormatVersion(const MetadataView& metadata);

/// Whether `path` names a file that is a checkpoint on its own (rather than a checkpoint directory): it ends in
/// ".safetensors" or ".safetensors.index.json".
bool IsSafetensorsFilePath(const std::string& path);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_FOREIGN_H_
