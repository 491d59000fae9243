// distckpt._distckpt.State: tensors, pieces (host buffers or device memory) and bytes entries of one rank.
#include "bindings/state.h"

#include "bindings/register.h"

namespace distckpt_python {

void State::AddTensor(const std::string& name, int dtype, const std::vector<uint64_t>& shape) {
  Check(dckpt_state_add_tensor(state_, name.c_str(), dtype, shape.size(), shape.data()));
  dtypes_[name] = dtype;
}

void State::AddPiece(const std::string& name, const std::vector<uint64_t>& offsets,
                     const std::vector<uint64_t>& lengths, const py::object& data, bool writable) {
  if (offsets.size() != lengths.size()) throw py::value_error("offsets and lengths differ in length");
  auto it = dtypes_.find(name);
  const int dtype = it == dtypes_.end() ? 0 : it->second;  // 0: undeclared, which the C call reports
  auto held = std::make_unique<HeldBuffer>(data, writable);
  if (dtype != 0) {
    const uint64_t expect = Volume(lengths) * dckpt_dtype_size(dtype);
    if (held->size() != expect) {
      throw py::value_error("piece of '" + name + "' has " + std::to_string(held->size()) + " bytes; its box needs " +
                            std::to_string(expect));
    }
  }
  Check(dckpt_state_add_piece(state_, name.c_str(), offsets.data(), lengths.data(), held->data()));
  held_.push_back(std::move(held));
}

void State::AddDevicePiece(const std::string& name, const std::vector<uint64_t>& offsets,
                           const std::vector<uint64_t>& lengths, uintptr_t ptr, uint64_t nbytes, int device,
                           uintptr_t stream, const py::object& owner) {
  if (offsets.size() != lengths.size()) throw py::value_error("offsets and lengths differ in length");
  auto it = dtypes_.find(name);
  const int dtype = it == dtypes_.end() ? 0 : it->second;
  if (dtype != 0) {
    const uint64_t expect = Volume(lengths) * dckpt_dtype_size(dtype);
    if (nbytes != expect) {
      throw py::value_error("device piece of '" + name + "' has " + std::to_string(nbytes) + " bytes; its box needs " +
                            std::to_string(expect));
    }
  }
  dckpt_piece_options o;
  Check(dckpt_piece_options_init(&o, DCKPT_PIECE_OPTIONS_VERSION));
  o.memory = DCKPT_MEMORY_CUDA;
  o.device = device;
  o.stream = reinterpret_cast<void*>(stream);
  int rc;
  {
    py::gil_scoped_release nogil;  // the first device piece loads and initialises the CUDA driver
    rc = dckpt_state_add_piece_ex(state_, name.c_str(), offsets.data(), lengths.data(), reinterpret_cast<void*>(ptr),
                                  &o);
  }
  Check(rc);
  owners_.push_back(owner);
}

void State::AddBytes(const std::string& name, const py::object& data, bool writable) {
  auto held = std::make_unique<HeldBuffer>(data, writable);
  Check(dckpt_state_add_bytes(state_, name.c_str(), held->data(), held->size()));
  held_.push_back(std::move(held));
}

uint64_t State::BytesSize(const std::string& name) const {
  uint64_t n = 0;
  Check(dckpt_state_bytes_size(&n, state_, name.c_str()));
  return n;
}

void State::SetUser(const std::string& key, const std::string& value) {
  Check(dckpt_state_set_user(state_, key.c_str(), value.c_str()));
}

void State::SetStructure(const py::bytes& data) {
  std::string s = data;
  Check(dckpt_state_set_structure(state_, s.data(), s.size()));
}

void RegisterState(py::module_& m) {
  py::class_<State>(m, "State")
      .def(py::init<>())
      .def("add_tensor", &State::AddTensor, py::arg("name"), py::arg("dtype"), py::arg("shape"))
      .def("add_piece", &State::AddPiece, py::arg("name"), py::arg("offsets"), py::arg("lengths"), py::arg("data"),
           py::arg("writable"))
      .def("add_device_piece", &State::AddDevicePiece, py::arg("name"), py::arg("offsets"), py::arg("lengths"),
           py::arg("ptr"), py::arg("nbytes"), py::arg("device"), py::arg("stream"), py::arg("owner"))
      .def("add_bytes", &State::AddBytes, py::arg("name"), py::arg("data"), py::arg("writable"))
      .def("bytes_size", &State::BytesSize, py::arg("name"))
      .def("set_user", &State::SetUser, py::arg("key"), py::arg("value"))
      .def("set_structure", &State::SetStructure, py::arg("data"));
}

}  // namespace distckpt_python
