// A rank's state as named entries: tensors made of local pieces, and opaque bytes. The same description serves
// save (pieces are read) and load (pieces are filled in place).
#ifndef DISTCKPT_CORE_ENGINE_STATE_H_
#define DISTCKPT_CORE_ENGINE_STATE_H_

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/base/box.h"
#include "core/base/dtype.h"
#include "core/base/status.h"
#include "core/cuda/memory.h"

namespace distckpt {

/// One local piece of a tensor: the box it covers in the global index space and a buffer holding that box in
/// row-major order (volume * itemsize bytes), in host memory or in device memory (`memory`). The buffer is borrowed:
/// it must outlive the save/load call.
struct TensorPiece {
  Box box;
  void* data = nullptr;
  /// Added through a const buffer: a save reads it; a load refuses it (it would write through a const pointer).
  bool read_only = false;
  /// Where `data` lives; a save stages device pieces through the copy engine's pinned pool (save_staging.h), a load
  /// fills them through it (load_staging.h).
  MemoryLocation memory;
};

struct TensorEntry {
  std::string name;
  DType dtype = DType::kInvalid;
  std::vector<uint64_t> shape;
  std::vector<TensorPiece> pieces;
};

/// An opaque blob. For save, data/size are the contents. For load, data/size are the destination and its capacity,
/// and loaded_size receives the stored size.
struct BytesEntry {
  std::string name;
  void* data = nullptr;
  uint64_t size = 0;
  uint64_t loaded_size = 0;
  bool read_only = false;  // as TensorPiece::read_only
};

/// Not thread-safe. Entry names are unique across tensors and bytes.
class State {
 public:
  /// Declares a tensor. Fails if the name is taken, the dtype invalid, ndim > kMaxDims or the size overflows.
  Status AddTensor(const std::string& name, DType dtype, const std::vector<uint64_t>& shape);
  /// Adds a local piece to a declared tensor. Fails if the box is outside the tensor or data is NULL for a
  /// non-empty box.
  Status AddPiece(const std::string& name, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths,
                  void* data);
  /// A piece a save only reads: a load of a state holding one fails with kInvalidArgument naming the tensor.
  Status AddConstPiece(const std::string& name, const std::vector<uint64_t>& offsets,
                       const std::vector<uint64_t>& lengths, const void* data);
  /// A piece in the memory `memory` describes (host or a CUDA device, with the stream its data is ordered on). Only
  /// the location is recorded: checking that `data` really is such memory needs the driver, which the C ABI does
  /// (CheckDeviceBuffer) and a save or load does when it copies.
  Status AddPieceIn(const std::string& name, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths,
                    void* data, const MemoryLocation& memory);
  Status AddBytes(const std::string& name, void* data, uint64_t size);
  /// A bytes entry a save only reads (as AddConstPiece).
  Status AddConstBytes(const std::string& name, const void* data, uint64_t size);
  /// Free-form metadata stored with a save (e.g. "step" -> "1000").
  void SetUserMetadata(const std::string& key, const std::string& value) { user_[key] = value; }
  void SetStructure(std::string structure) { structure_ = std::move(structure); }

  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  std::vector<TensorEntry>& tensors() { return tensors_; }
  const std::vector<BytesEntry>& bytes() const { return bytes_; }
  std::vector<BytesEntry>& bytes() { return bytes_; }
  const std::map<std::string, std::string>& user() const { return user_; }
  const std::string& structure() const { return structure_; }
  TensorEntry* FindTensor(const std::string& name);
  BytesEntry* FindBytes(const std::string& name);

 private:
  Status CheckNewName(const std::string& name) const;
  std::vector<TensorEntry> tensors_;
  std::vector<BytesEntry> bytes_;
  std::unordered_map<std::string, size_t> tensor_index_;
  std::unordered_map<std::string, size_t> bytes_index_;
  std::map<std::string, std::string> user_;
  std::string structure_;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_STATE_H_
