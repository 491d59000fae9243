// Finds a tensor's raw bytes inside a torch.save archive without loading it: torch.distributed.checkpoint (in its
// default SerializationFormat.TORCH_SAVE) writes each tensor item of a .distcp file with torch.save, and that is a zip
// archive of stored (uncompressed) records:
//   <prefix>/data.pkl     a pickle: torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...) (or _v3 with
//                         an explicit dtype), where storage is a persistent id ('storage', <class>, key, location, n)
//   <prefix>/data/<key>   the storage's raw bytes, in the byte order below
//   <prefix>/byteorder    "little" or "big"
//   <prefix>/version, .format_version, .storage_alignment, .data/serialization_id (not needed here)
// The archive's offsets are relative to the start of the item. Only the end of central directory records, the central
// directory, data.pkl, byteorder and the local header of the data record are read (the item's first and last 4 KiB
// hold them all in archives torch writes); never the tensor's bytes.
#ifndef DISTCKPT_CORE_FOREIGN_TORCH_SAVE_H_
#define DISTCKPT_CORE_FOREIGN_TORCH_SAVE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {

/// Where the bytes of a tensor saved with torch.save lie.
struct TorchSavedTensor {
  std::string torch_dtype;  ///< torch's canonical name: "float32", "bfloat16"
  DType dtype = DType::kInvalid;
  std::vector<uint64_t> shape;
  uint64_t data_offset = 0;  ///< Absolute: from the start of the file (or of the buffer, for the in-memory form).
  uint64_t data_length = 0;  ///< numel * element size: the tensor's bytes, little-endian, C order.
};

/// Parses the torch.save archive in [offset, offset + length) of `file` (the item of a .distcp file) and locates its
/// tensor. Every read stays inside that range; the range itself must lie inside the file. kCorrupt for a damaged or
/// malformed archive or pickle (naming `context`, the record and what is wrong); kUnsupported for what torch can write
/// but distckpt cannot describe in place: a dtype distckpt lacks, big-endian data, strides that are not C order,
/// conjugate or negative views, compressed or encrypted records.
Result<TorchSavedTensor> LocateTorchSavedTensor(const ReadableFile& file, uint64_t offset, uint64_t length,
                                                const std::string& context);

/// The same over an archive held in memory; data_offset is then relative to the start of `item`.
Result<TorchSavedTensor> LocateTorchSavedTensorInMemory(std::string_view item, const std::string& context);

/// distckpt's dtype for a torch dtype as pickles name it ("float32", "bfloat16"; the aliases "float", "half"... too),
/// or kInvalid where distckpt has none (complex32, the *fnuz float8s, quantized and bit types...).
DType DTypeFromTorchName(std::string_view name);
/// The canonical torch name of a dtype name ("float" -> "float32"); `name` itself when it has no alias.
std::string_view CanonicalTorchDTypeName(std::string_view name);
/// Every dtype name of torch 2.x (attributes of the torch module), for allow-lists: a pickle that names a torch dtype
/// distckpt lacks is then refused as unsupported, not as hostile.
const std::vector<std::string>& KnownTorchDTypeNames();

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_TORCH_SAVE_H_
