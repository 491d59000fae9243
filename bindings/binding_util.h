// Internal to the extension module: what every part of it shares. The GIL for callbacks on distckpt's threads,
// the error a failed dckpt_* call raises (NativeError, translated in module.cc) and the places callbacks park their
// Python exceptions, and held buffers.
//
// Rules kept throughout the extension:
//  - Every call that does I/O or waits on other ranks runs with the GIL released (py::gil_scoped_release).
//  - Callbacks that distckpt runs on its own threads (progress, external-communicator collectives) take the GIL back
//    (CallbackGil) and never let a Python exception escape into C: the exception is kept, the callback
//    returns non-zero (DCKPT_EUSER), and the exception becomes the __cause__ of the error raised to the caller.
//  - A failed call raises the exception that distckpt.errors maps its status code to, with dckpt_error_last() as
//    the message (one table, in Python: distckpt/errors.py).
#ifndef DISTCKPT_BINDINGS_BINDING_UTIL_H_
#define DISTCKPT_BINDINGS_BINDING_UTIL_H_

#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/distckpt.h"  // capi/include (Bazel), or an installed core's include/ (setup.py, DISTCKPT_PREBUILT)

namespace py = pybind11;

namespace distckpt_python {

// ---- Callbacks on distckpt's threads ------------------------------------------------------------------------

/// The GIL for a callback that distckpt runs on one of its own threads (progress, collectives, storage).
///
/// A thread Python does not know gets a Python thread state the first time it calls back, and keeps it until the
/// thread exits: a bare py::gil_scoped_acquire would create one and destroy it on every call, which costs a thread
/// state per call and, worse, empties the callback's threading.local() between two calls from the same thread (a
/// storage that keeps a per-thread buffer there reallocated it on every write). The thread state is released with
/// the GIL at thread exit (the engine's pools join their threads inside calls that have let go of the GIL), or left
/// alone when the interpreter is finalising or gone.
class CallbackGil {
 public:
  CallbackGil() {
    Persistent();
    gil_.emplace();
  }

 private:
  struct Holder {
    PyGILState_STATE outer;
    bool held = false;
    ~Holder() {
      if (!held || !Py_IsInitialized() || Finalizing()) return;
      PyThreadState* state = PyGILState_GetThisThreadState();
      if (state == nullptr) return;
      PyEval_RestoreThread(state);  // the GIL, on this thread's state
      PyGILState_Release(outer);    // its last count: the state is cleared and deleted, and the GIL let go
    }
  };
  static bool Finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
  }
  static void Persistent() {
    thread_local Holder holder;
    if (holder.held || PyGILState_GetThisThreadState() != nullptr) return;  // a Python thread, or done before
    // Creates this thread's state (count 1), then lets go of the GIL, keeping the state.
    holder.outer = PyGILState_Ensure();
    holder.held = true;
    PyEval_SaveThread();
  }

  std::optional<py::gil_scoped_acquire> gil_;
};

// ---- Errors ---------------------------------------------------------------------------------------------------

/// A failed dckpt_* call. Translated into a Python exception by the translator registered in the module init.
struct NativeError : std::exception {
  int code;
  std::string message;
  py::object cause;  // a Python exception raised inside a callback, or None
  NativeError(int c, std::string m, py::object k = py::none()) : code(c), message(std::move(m)), cause(std::move(k)) {}
  const char* what() const noexcept override { return message.c_str(); }
};

/// (code, message) -> exception instance; installed by distckpt.errors when the package is imported.
inline py::object& ErrorFactory() {
  static py::object* factory = new py::object();  // leaked on purpose: no destructor runs after Py_Finalize
  return *factory;
}

/// Must run on the thread that made the failed call (dckpt_error_last is per thread), with the GIL held.
[[noreturn]] inline void Raise(int code, py::object cause = py::none()) {
  throw NativeError(code, dckpt_error_last(), std::move(cause));
}

inline void Check(int rc) {
  if (rc != DCKPT_OK) Raise(rc);
}

/// Where a callback parks the Python exception it raised, until the C call returns.
struct CallbackErrors {
  std::mutex mu;
  py::object first;  // guarded by mu; only touched with the GIL held

  void Keep(py::error_already_set& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!first || first.is_none()) first = e.value();
  }
  py::object Take() {
    std::lock_guard<std::mutex> lock(mu);
    py::object out = first ? first : py::none();
    first = py::object();
    return out;
  }
};

/// Raises for rc != OK; an exception kept by a callback becomes the cause.
inline void CheckWithCallbacks(int rc, CallbackErrors* errors) {
  if (rc == DCKPT_OK) {
    if (errors) errors->Take();
    return;
  }
  std::string message = dckpt_error_last();
  py::object cause = errors ? errors->Take() : py::none();
  throw NativeError(rc, std::move(message), std::move(cause));
}

// ---- Buffers --------------------------------------------------------------------------------------------------

/// A held PEP 3118 view: keeps the exporter's memory alive and fixed (a bytearray cannot be resized meanwhile).
class HeldBuffer {
 public:
  HeldBuffer(const py::handle& obj, bool writable) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) throw py::error_already_set();
  }
  ~HeldBuffer() { PyBuffer_Release(&view_); }  // the owner (a State) is destroyed with the GIL held
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;
  void* data() const { return view_.buf; }
  uint64_t size() const { return static_cast<uint64_t>(view_.len); }

 private:
  Py_buffer view_{};
};

inline uint64_t Volume(const std::vector<uint64_t>& dims) {
  uint64_t v = 1;
  for (uint64_t d : dims) {
    if (d != 0 && v > UINT64_MAX / d) throw py::value_error("shape volume overflows 64 bits");
    v *= d;
  }
  return v;
}

}  // namespace distckpt_python

#endif  // DISTCKPT_BINDINGS_BINDING_UTIL_H_
