// Reads a torch.distributed.checkpoint (DCP) directory in place, without Python and without running anything from it:
// its `.metadata` pickle is decoded by the restricted decoder (pickle.h) under an allow-list of DCP's metadata
// classes, checked against DCP's schema, and each tensor item of the `__<rank>_<n>.distcp` files (a torch.save
// archive, torch_save.h) is located down to its raw bytes. The result is a distckpt MetadataRecord whose chunks point
// at those bytes, so distckpt's reader (planning, resharding, reading straight into the destination) serves DCP
// checkpoints as they are.
#ifndef DISTCKPT_CORE_FOREIGN_DCP_H_
#define DISTCKPT_CORE_FOREIGN_DCP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/format/metadata.h"
#include "core/storage/storage.h"

namespace distckpt {

/// The name of DCP's metadata file inside a checkpoint directory.
constexpr char kDcpMetadataFileName[] = ".metadata";
/// The largest .metadata file read (DCP's metadata of a very large model is a few hundred MB).
constexpr uint64_t kMaxDcpMetadataBytes = (uint64_t{1} << 31) - 1;
/// The writer a DCP description records, and its source (MetadataRecord::source).
constexpr char kDcpWriter[] = "torch.distributed.checkpoint";
constexpr char kDcpSource[] = "torch-dcp";
/// The user key of a description that holds the `.metadata`'s own version (Metadata.version, "1.0.0"), when it has one.
constexpr char kDcpVersionKey[] = "torch_dcp.version";

/// One item of a .distcp file: DCP's _StorageInfo.
struct DcpItem {
  std::string file;  ///< relative_path: a plain file name (IsValidFileName)
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct DcpChunk {
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> sizes;
  size_t item = 0;  ///< index into DcpMetadata::items
};

/// One FQN of the state dict: a tensor (TensorStorageMetadata) or a bytes item (BytesStorageMetadata).
struct DcpEntry {
  std::string fqn;
  bool is_bytes = false;
  std::string torch_dtype;  ///< tensors: torch's canonical dtype name ("bfloat16")
  std::vector<uint64_t> shape;
  std::vector<DcpChunk> chunks;  ///< tensors, in the metadata's order (empty ones included)
  size_t item = 0;               ///< bytes entries: index into DcpMetadata::items
};

/// One component of a planner_data path: a dict key (string) or a list index.
struct DcpPathKey {
  bool is_index = false;
  int64_t index = 0;
  std::string key;
};

/// What a .metadata file says, checked against DCP's schema.
struct DcpMetadata {
  std::vector<DcpEntry> entries;  ///< in the pickle's order; FQNs are unique
  std::vector<DcpItem> items;
  /// planner_data: for each FQN, the path of keys that nests it in the original state dict.
  std::vector<std::pair<std::string, std::vector<DcpPathKey>>> planner_data;
  std::string version;  ///< Metadata.version ("1.0.0"), or "" where absent
  std::string save_id;  ///< storage_meta.save_id, or ""
  /// The size of the .metadata file: describing it may read at most 256 times this (plus 1 MiB) of the data files'
  /// zip structures, so that no metadata can make the work grow faster than its size.
  uint64_t metadata_bytes = 0;
};

/// Decodes and checks the bytes of a .metadata file (no I/O). `context` (the file's path) starts every message.
/// kCorrupt for anything that is not DCP metadata (a global outside the allow-list, named; a field of the wrong type
/// or range; a chunk outside its tensor; a chunk or bytes entry without storage_data; a file name that is not a plain
/// name...); kUnsupported, naming the entry, for what DCP can write but distckpt cannot read in place (storage
/// transforms such as compression, layouts other than strided).
Result<DcpMetadata> ParseDcpMetadata(std::string_view bytes, const std::string& context);

/// Describes the DCP checkpoint in directory `dir` of `storage` as a distckpt MetadataRecord (writer
/// "torch.distributed.checkpoint", source "torch-dcp", alignment 1, no checksums):
///   - files: the .distcp files the chunks refer to, with their sizes;
///   - one tensor entry per tensor FQN (dtype mapped from torch's), one chunk per non-empty DCP chunk, located at the
///     tensor's raw bytes inside its torch.save item;
///   - one bytes entry per bytes FQN, located at its item's raw (offset, length): the blob DCP wrote (usually a
///     torch.save pickle, never decoded here);
///   - user keys "torch_dcp.version", "torch_dcp.save_id" and "torch_dcp.planner_data" (JSON: {fqn: [key, ...]})
///     where the metadata has them.
/// Reads .metadata whole (at most kMaxDcpMetadataBytes) and, of each tensor item, only its zip structures. Files are
/// opened through Storage::OpenDirectory, so no symbolic link inside `dir` is followed. Every error names `dir`, the
/// file and the entry concerned: kNotFound for a missing directory, .metadata or data file; kUnsupported for a dtype
/// distckpt lacks, more than kMaxDims dimensions, non-C-order or non-little-endian tensor data, storage transforms;
/// kCorrupt for the rest, chunks that do not tile their tensor included.
Result<MetadataRecord> DescribeTorchDcp(Storage* storage, const std::string& dir);

/// Opens the data file `name` (a plain name) of a DCP checkpoint.
using DcpFileOpener = std::function<Result<std::unique_ptr<ReadableFile>>(const std::string& name)>;

/// DescribeTorchDcp's second half, once .metadata is parsed: describes `md` (from ParseDcpMetadata), opening the data
/// files it needs through `open_file`; `dir` names the checkpoint in messages. (For tests and fuzzing over files held
/// in memory; readers call DescribeTorchDcp.)
Result<MetadataRecord> DescribeDcpMetadata(const DcpMetadata& md, const std::string& dir,
                                           const DcpFileOpener& open_file);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_DCP_H_
