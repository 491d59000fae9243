// _distckpt: the Python extension module. A thin layer over the C ABI (distckpt.h) and nothing else: the package
// python/distckpt/ builds the user-facing API on top of it. This file is the module itself: the ABI check, the one
// translator from a failed call to the exception distckpt.errors maps its code to, versions and the header's
// constants; every other part registers itself (register.h). The rules every part keeps are in binding_util.h.
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "bindings/binding_util.h"
#include "bindings/register.h"

PYBIND11_MODULE(_distckpt, m) {
  using namespace distckpt_python;
  m.doc() = "Native core of distckpt: a thin binding of the C ABI (distckpt.h). Use the `distckpt` package instead.";

  if (dckpt_abi_version() != DCKPT_ABI_VERSION) {
    throw std::runtime_error("distckpt: the linked library has ABI version " + std::to_string(dckpt_abi_version()) +
                             " but the extension was built for " + std::to_string(DCKPT_ABI_VERSION));
  }

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NativeError& e) {
      py::object& factory = ErrorFactory();
      if (!factory || factory.is_none()) {
        PyErr_SetString(PyExc_RuntimeError, e.message.c_str());
        return;
      }
      py::object exc;
      try {
        exc = factory(e.code, e.message);
      } catch (py::error_already_set& inner) {
        inner.restore();  // a bug in the factory: surface it rather than hide the original error
        return;
      }
      if (!e.cause.is_none()) PyException_SetCause(exc.ptr(), e.cause.inc_ref().ptr());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });

  m.def(
      "_set_error_factory", [](py::object f) { ErrorFactory() = std::move(f); }, py::arg("factory"),
      "Installs callable(code, message) -> exception used for every failed call (distckpt.errors does this).");

  m.attr("ABI_VERSION") = DCKPT_ABI_VERSION;
  m.attr("HEADER_VERSION") = DCKPT_VERSION_STRING;
  m.def("version", &dckpt_version);
  m.def("version_string", []() { return std::string(dckpt_version_string()); });
  m.def("abi_version", &dckpt_abi_version);
  m.def("status_name", [](int code) { return std::string(dckpt_status_name(code)); });
  m.def("dtype_size", &dckpt_dtype_size, py::arg("dtype"));
  m.def(
      "dtype_name",
      [](int dtype) -> std::optional<std::string> {
        const char* n = dckpt_dtype_name(dtype);
        return n ? std::optional<std::string>(n) : std::nullopt;
      },
      py::arg("dtype"));
  m.def(
      "dtype_from_name",
      [](const std::string& name) {
        int d = 0;
        Check(dckpt_dtype_from_name(&d, name.c_str()));
        return d;
      },
      py::arg("name"));

  // The header's enums, by their C names, so that Python never restates a number.
  py::dict status;
#define DCKPT_PY_STATUS(x) status[#x] = static_cast<int>(DCKPT_##x)
  DCKPT_PY_STATUS(OK);
  DCKPT_PY_STATUS(ERROR);
  DCKPT_PY_STATUS(EINVAL);
  DCKPT_PY_STATUS(ENOTFOUND);
  DCKPT_PY_STATUS(ECORRUPT);
  DCKPT_PY_STATUS(EVERSION);
  DCKPT_PY_STATUS(EIO);
  DCKPT_PY_STATUS(ETIMEOUT);
  DCKPT_PY_STATUS(EUSER);
  DCKPT_PY_STATUS(ENOMEM);
  DCKPT_PY_STATUS(EUNSUPPORTED);
  DCKPT_PY_STATUS(EEXISTS);
  DCKPT_PY_STATUS(EBUFSIZE);
  DCKPT_PY_STATUS(EPEER);
  DCKPT_PY_STATUS(ENOSPC);
  DCKPT_PY_STATUS(ESTATE);
  DCKPT_PY_STATUS(EINTERNAL);
#undef DCKPT_PY_STATUS
  m.attr("STATUS") = status;

  py::dict dtypes;
#define DCKPT_PY_DTYPE(x) dtypes[#x] = static_cast<int>(DCKPT_DTYPE_##x)
  DCKPT_PY_DTYPE(BOOL);
  DCKPT_PY_DTYPE(U8);
  DCKPT_PY_DTYPE(I8);
  DCKPT_PY_DTYPE(U16);
  DCKPT_PY_DTYPE(I16);
  DCKPT_PY_DTYPE(U32);
  DCKPT_PY_DTYPE(I32);
  DCKPT_PY_DTYPE(U64);
  DCKPT_PY_DTYPE(I64);
  DCKPT_PY_DTYPE(F16);
  DCKPT_PY_DTYPE(BF16);
  DCKPT_PY_DTYPE(F32);
  DCKPT_PY_DTYPE(F64);
  DCKPT_PY_DTYPE(C64);
  DCKPT_PY_DTYPE(C128);
  DCKPT_PY_DTYPE(F8_E4M3FN);
  DCKPT_PY_DTYPE(F8_E5M2);
#undef DCKPT_PY_DTYPE
  m.attr("DTYPES") = dtypes;
  m.attr("MAX_DIMS") = DCKPT_MAX_DIMS;
  m.attr("WAIT_FOREVER") = py::int_(DCKPT_WAIT_FOREVER);
  m.attr("REPLICAS_AUTO") = py::int_(DCKPT_REPLICAS_AUTO);
  m.attr("STREAM_READY") = py::int_(reinterpret_cast<uintptr_t>(DCKPT_STREAM_READY));
  m.attr("DEVICE_OF_POINTER") = py::int_(DCKPT_DEVICE_OF_POINTER);
  m.attr("ENTRY_TENSOR") = static_cast<int>(DCKPT_ENTRY_TENSOR);
  m.attr("ENTRY_BYTES") = static_cast<int>(DCKPT_ENTRY_BYTES);

  RegisterComm(m);
  RegisterState(m);
  RegisterSaveFuture(m);
  RegisterReader(m);
  RegisterSaveLoad(m);
  RegisterTools(m);
  RegisterStorage(m);
  RegisterS3(m);
  RegisterManager(m);
}
