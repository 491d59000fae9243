#include "core/engine/state.h"

namespace distckpt {

Status State::CheckNewName(const std::string& name) const {
  if (name.empty()) return InvalidArgument("entry names must not be empty");
  if (name.find('\0') != std::string::npos) return InvalidArgument("entry name contains a NUL byte");
  if (tensor_index_.count(name) || bytes_index_.count(name)) {
    return InvalidArgument("entry '" + name + "' is declared twice");
  }
  return OkStatus();
}

Status State::AddTensor(const std::string& name, DType dtype, const std::vector<uint64_t>& shape) {
  DCKPT_RETURN_IF_ERROR(CheckNewName(name));
  if (!IsValidDType(static_cast<uint32_t>(dtype))) {
    return InvalidArgument("tensor '" + name + "': invalid dtype " + std::to_string(static_cast<int>(dtype)));
  }
  if (shape.size() > kMaxDims) {
    return InvalidArgument("tensor '" + name + "' has " + std::to_string(shape.size()) + " dimensions; at most " +
                           std::to_string(kMaxDims) + " are supported");
  }
  auto bytes = CheckedVolume(shape, DTypeSize(dtype));
  if (!bytes.ok()) return InvalidArgument("tensor '" + name + "': " + bytes.status().message());
  tensor_index_[name] = tensors_.size();
  tensors_.push_back(TensorEntry{name, dtype, shape, {}});
  return OkStatus();
}

Status State::AddPiece(const std::string& name, const std::vector<uint64_t>& offsets,
                       const std::vector<uint64_t>& lengths, void* data) {
  TensorEntry* t = FindTensor(name);
  if (t == nullptr) return InvalidArgument("tensor '" + name + "' was not declared before adding a piece");
  auto box = Box::Make(offsets, lengths);
  if (!box.ok()) return InvalidArgument("tensor '" + name + "': " + box.status().message());
  Box whole = Box::Whole(t->shape).value();
  if (!whole.Contains(*box)) {
    return InvalidArgument("tensor '" + name + "': piece " + box->ToString() + " lies outside the global shape " +
                           whole.ToString());
  }
  if (data == nullptr && box->volume() != 0) {
    return InvalidArgument("tensor '" + name + "': piece " + box->ToString() + " has a NULL buffer");
  }
  t->pieces.push_back(TensorPiece{*box, data, false, MemoryLocation{}});
  return OkStatus();
}

Status State::AddConstPiece(const std::string& name, const std::vector<uint64_t>& offsets,
                            const std::vector<uint64_t>& lengths, const void* data) {
  // The pointer is stored without const only because save and load share TensorPiece; read_only keeps load off it.
  DCKPT_RETURN_IF_ERROR(AddPiece(name, offsets, lengths, const_cast<void*>(data)));
  FindTensor(name)->pieces.back().read_only = true;
  return OkStatus();
}

Status State::AddPieceIn(const std::string& name, const std::vector<uint64_t>& offsets,
                         const std::vector<uint64_t>& lengths, void* data, const MemoryLocation& memory) {
  if (memory.kind != MemoryKind::kHost && memory.kind != MemoryKind::kCuda) {
    return InvalidArgument("tensor '" + name + "': unknown memory kind " +
                           std::to_string(static_cast<int>(memory.kind)));
  }
  if (!memory.is_host() && memory.device < 0) {
    return InvalidArgument("tensor '" + name + "': device ordinal " + std::to_string(memory.device) + " is negative");
  }
  DCKPT_RETURN_IF_ERROR(AddPiece(name, offsets, lengths, data));
  TensorPiece& p = FindTensor(name)->pieces.back();
  p.memory = memory;
  return OkStatus();
}

Status State::AddBytes(const std::string& name, void* data, uint64_t size) {
  DCKPT_RETURN_IF_ERROR(CheckNewName(name));
  if (data == nullptr && size != 0) return InvalidArgument("bytes entry '" + name + "' has a NULL buffer");
  bytes_index_[name] = bytes_.size();
  bytes_.push_back(BytesEntry{name, data, size, 0, false});
  return OkStatus();
}

Status State::AddConstBytes(const std::string& name, const void* data, uint64_t size) {
  DCKPT_RETURN_IF_ERROR(AddBytes(name, const_cast<void*>(data), size));
  bytes_.back().read_only = true;
  return OkStatus();
}

TensorEntry* State::FindTensor(const std::string& name) {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

BytesEntry* State::FindBytes(const std::string& name) {
  auto it = bytes_index_.find(name);
  return it == bytes_index_.end() ? nullptr : &bytes_[it->second];
}

}  // namespace distckpt
