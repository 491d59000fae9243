// Checkpoints that other checkpoints refer to (format 2.0, FORMAT.md 4.1): finding a sibling by name, reading and
// checking its metadata, and opening the data files a reference names. The save that writes references and the
// reader that follows them share these, so both judge a base the same way.
#ifndef DISTCKPT_CORE_ENGINE_BASE_CHECKPOINT_H_
#define DISTCKPT_CORE_ENGINE_BASE_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"
#include "core/format/metadata.h"
#include "core/storage/storage.h"

namespace distckpt {

/// `<parent of checkpoint>/<name>` (ParentDir, storage.h): where a reference by name points.
std::string SiblingPath(const std::string& checkpoint, std::string_view name);

/// The name by which checkpoint `path` refers to `base`: its directory name, if `base` is a sibling of `path` (named
/// either as a path in the same parent directory or by its bare name). kInvalidArgument otherwise, or if it is `path`
/// itself.
Result<std::string> SiblingName(const std::string& path, const std::string& base);

/// metadata.dckpt inside `dir` (the checkpoint `path`), opened (not read). Missing: says whether the directory is an
/// unfinished save.
Result<std::unique_ptr<ReadableFile>> OpenMetadataFile(Directory* dir, const std::string& path);

/// Data file `name` of the directory `dir` (its path for messages: `fpath`), of exactly `size` bytes: a missing file
/// is kCorrupt "data file '<fpath>' <missing>", another size kCorrupt naming both sizes. For a checkpoint's own files
/// and those of its bases alike.
Result<std::unique_ptr<ReadableFile>> OpenDataFileOfSize(Directory* dir, const std::string& name, uint64_t size,
                                                         const std::string& fpath, const std::string& missing);

/// Every byte of `file`.
Result<std::string> ReadWhole(const ReadableFile& file);

/// A distckpt checkpoint opened as a base: its directory (files are opened relative to it, never through links) and
/// its validated metadata.
struct BaseCheckpoint {
  std::string path;
  std::unique_ptr<Directory> dir;
  MetadataView meta;
};

/// Opens the checkpoint at `path` and reads its metadata. A foreign checkpoint or one of format 1.0 (whose metadata
/// has no checksum to refer to) is kInvalidArgument naming it; a missing one kNotFound.
Result<BaseCheckpoint> OpenBaseCheckpoint(Storage* storage, const std::string& path);

/// Reader obligation R-R3: base `k` of `meta` (the metadata of checkpoint `path`) opened and checked: it is not `path`
/// itself, and its metadata file still has the size and checksum recorded in the reference (else it was replaced or
/// damaged: kCorrupt naming both checkpoints).
Result<BaseCheckpoint> OpenReferencedBase(Storage* storage, const std::string& path, const MetadataView& meta,
                                          size_t k);

/// Reader obligation R-R3, per file: file `index` of `meta` (a file of a base, opened as `base`) is a file of the
/// base's own, of the same size; then it is opened inside the base's directory. Errors name both checkpoints and the
/// file.
Result<std::unique_ptr<ReadableFile>> OpenReferencedFile(const std::string& path, const MetadataView& meta,
                                                         uint32_t index, const BaseCheckpoint& base);

/// The checkpoints beside `path` (in its parent directory, or below its parent prefix) whose metadata names it as a
/// base, by name, sorted. What is not a readable distckpt checkpoint is skipped. Removing or overwriting `path` would
/// break them (FORMAT.md 4.1).
Result<std::vector<std::string>> Dependents(Storage* storage, const std::string& path);

/// kState naming the checkpoints that refer to `path` (Dependents), or OK when none does or no checkpoint is committed
/// there. `what` says what was asked ("removing", "overwriting").
Status CheckNoDependents(Storage* storage, const std::string& path, const std::string& what);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_BASE_CHECKPOINT_H_
