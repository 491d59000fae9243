// Internal to the extension module: the state bound as distckpt._distckpt.State (what one rank saves, or where
// it loads to); save, load and the reader take one.
#ifndef DISTCKPT_BINDINGS_STATE_H_
#define DISTCKPT_BINDINGS_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "bindings/binding_util.h"

namespace distckpt_python {

/// What one rank saves, or where it loads to. Holds every buffer it was given until it is destroyed.
class State {
 public:
  State() { Check(dckpt_state_new(&state_)); }
  ~State() { dckpt_state_free(state_); }

  void AddTensor(const std::string& name, int dtype, const std::vector<uint64_t>& shape);

  /// `data`: any C-contiguous buffer of exactly volume(lengths) * dtype size bytes (writable when loading).
  void AddPiece(const std::string& name, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths,
                const py::object& data, bool writable);

  /// A piece in CUDA device memory: `nbytes` at `ptr` on `device`, ordered on `stream` (a CUstream as an integer;
  /// 0 is the legacy default stream). `owner` (the tensor or array the memory belongs to) is kept alive as long as
  /// the State, as held buffers are. The same call serves save and load (the C ABI has no const device piece; a
  /// State built for a save is never loaded).
  void AddDevicePiece(const std::string& name, const std::vector<uint64_t>& offsets,
                      const std::vector<uint64_t>& lengths, uintptr_t ptr, uint64_t nbytes, int device,
                      uintptr_t stream, const py::object& owner);

  void AddBytes(const std::string& name, const py::object& data, bool writable);

  uint64_t BytesSize(const std::string& name) const;

  void SetUser(const std::string& key, const std::string& value);

  void SetStructure(const py::bytes& data);

  dckpt_state* get() { return state_; }

 private:
  dckpt_state* state_ = nullptr;
  std::unordered_map<std::string, int> dtypes_;
  std::vector<std::unique_ptr<HeldBuffer>> held_;
  std::vector<py::object> owners_;  // the owners of device pieces' memory
};

}  // namespace distckpt_python

#endif  // DISTCKPT_BINDINGS_STATE_H_
