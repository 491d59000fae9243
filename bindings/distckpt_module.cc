// _distckpt: the Python extension module. A thin layer over the C ABI (distckpt.h) and nothing else: the package
// python/distckpt/ builds the user-facing API on top of it.
//
// Rules kept throughout this file:
//  - Every call that does I/O or waits on other ranks runs with the GIL released (py::gil_scoped_release).
//  - Callbacks that distckpt runs on its own threads (progress, external-communicator collectives) take the GIL back
//    (CallbackGil) and never let a Python exception escape into C: the exception is kept, the callback
//    returns non-zero (DCKPT_EUSER), and the exception becomes the __cause__ of the error raised to the caller.
//  - A failed call raises the exception that distckpt.errors maps its status code to, with dckpt_error_last() as
//    the message (one table, in Python: distckpt/errors.py).
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "distckpt/distckpt.h"  // capi/include (Bazel), or an installed core's include/ (setup.py, DISTCKPT_PREBUILT)

namespace py = pybind11;

namespace distckpt_python {
namespace {

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
    holder.outer = PyGILState_Ensure();  // creates this thread's state (count 1) ...
    holder.held = true;
    PyEval_SaveThread();  // ... and lets go of the GIL, keeping the state
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
py::object& ErrorFactory() {
  static py::object* factory = new py::object();  // leaked on purpose: no destructor runs after Py_Finalize
  return *factory;
}

/// Must run on the thread that made the failed call (dckpt_error_last is per thread), with the GIL held.
[[noreturn]] void Raise(int code, py::object cause = py::none()) {
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

uint64_t Volume(const std::vector<uint64_t>& dims) {
  uint64_t v = 1;
  for (uint64_t d : dims) {
    if (d != 0 && v > UINT64_MAX / d) throw py::value_error("shape volume overflows 64 bits");
    v *= d;
  }
  return v;
}

// ---- Progress callbacks ---------------------------------------------------------------------------------------

struct Progress {
  py::object fn;  // callable(done, total) or None
  CallbackErrors errors;
};

int ProgressTrampoline(uint64_t done, uint64_t total, void* user_data) {
  auto* p = static_cast<Progress*>(user_data);
  CallbackGil gil;
  try {
    p->fn(done, total);
    return 0;
  } catch (py::error_already_set& e) {
    p->errors.Keep(e);
    return 1;
  }
}

std::shared_ptr<Progress> MakeProgress(const py::object& fn) {
  if (fn.is_none()) return nullptr;
  if (!PyCallable_Check(fn.ptr())) throw py::type_error("progress must be callable(done: int, total: int) or None");
  auto p = std::make_shared<Progress>();
  p->fn = fn;
  return p;
}

// ---- Communicators --------------------------------------------------------------------------------------------

/// A communicator: Gloo, or collectives supplied by Python callables (torch.distributed, mpi4py, ...).
class Comm {
 public:
  static std::shared_ptr<Comm> Gloo(int rank, int world_size, std::optional<std::string> rendezvous,
                                    std::optional<std::string> prefix, std::optional<std::string> iface,
                                    std::optional<std::string> hostname, uint64_t timeout_ms) {
    dckpt_gloo_options o;
    Check(dckpt_gloo_options_init(&o, DCKPT_GLOO_OPTIONS_VERSION));
    o.rank = rank;
    o.world_size = world_size;
    o.rendezvous = rendezvous ? rendezvous->c_str() : nullptr;
    o.prefix = prefix ? prefix->c_str() : nullptr;
    o.iface = iface ? iface->c_str() : nullptr;
    o.hostname = hostname ? hostname->c_str() : nullptr;
    o.timeout_ms = timeout_ms;
    auto c = std::shared_ptr<Comm>(new Comm());
    int rc;
    {
      py::gil_scoped_release nogil;  // rendezvous waits for every rank
      rc = dckpt_comm_new_gloo(&c->comm_, &o);
    }
    Check(rc);
    return c;
  }

  static std::shared_ptr<Comm> External(int rank, int size, py::object allgather, py::object broadcast,
                                        py::object barrier) {
    if (!PyCallable_Check(allgather.ptr()) || !PyCallable_Check(broadcast.ptr())) {
      throw py::type_error("allgather and broadcast must be callable");
    }
    if (!barrier.is_none() && !PyCallable_Check(barrier.ptr()))
      throw py::type_error("barrier must be callable or None");
    auto c = std::shared_ptr<Comm>(new Comm());
    c->allgather_ = std::move(allgather);
    c->broadcast_ = std::move(broadcast);
    c->barrier_ = std::move(barrier);
    dckpt_comm_callbacks cb;
    Check(dckpt_comm_callbacks_init(&cb, DCKPT_COMM_CALLBACKS_VERSION));
    cb.rank = rank;
    cb.size = size;
    cb.allgather = &Comm::AllgatherTrampoline;
    cb.broadcast = &Comm::BroadcastTrampoline;
    cb.barrier = c->barrier_.is_none() ? nullptr : &Comm::BarrierTrampoline;
    cb.user_data = c.get();
    c->size_ = size;
    Check(dckpt_comm_new_external(&c->comm_, &cb));
    return c;
  }

  ~Comm() {
    // No collective can be running: every call that uses the communicator holds a reference to it.
    dckpt_comm_free(comm_);
  }

  dckpt_comm* get() {
    if (comm_ == nullptr) throw NativeError(DCKPT_ESTATE, "the communicator is closed");
    return comm_;
  }
  int rank() {
    int r = 0;
    Check(dckpt_comm_rank(&r, get()));
    return r;
  }
  int size() {
    int s = 0;
    Check(dckpt_comm_size(&s, get()));
    return s;
  }
  void Barrier(uint64_t timeout_ms) {
    dckpt_comm* c = get();
    ++users_;
    struct Done {
      std::atomic<int>& n;
      ~Done() { --n; }
    } done{users_};
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = dckpt_comm_barrier(c, timeout_ms);
    }
    CheckWithCallbacks(rc, &errors_);
  }
  void Abort(const std::string& reason) {
    dckpt_comm* c = get();
    Check(dckpt_comm_abort(c, reason.c_str()));
  }
  void Close() {
    if (users_.load() > 0) {
      throw NativeError(DCKPT_ESTATE,
                        "the communicator is in use (an async save or a collective is running); "
                        "wait for it before closing the communicator");
    }
    dckpt_comm* c = comm_;
    comm_ = nullptr;
    py::gil_scoped_release nogil;
    dckpt_comm_free(c);
  }
  bool closed() const { return comm_ == nullptr; }
  CallbackErrors* errors() { return &errors_; }

  /// Marks the communicator busy for the lifetime of a collective call or an async save.
  class Use {
   public:
    explicit Use(std::shared_ptr<Comm> c) : comm_(std::move(c)) {
      if (comm_) ++comm_->users_;
    }
    ~Use() {
      if (comm_) --comm_->users_;
    }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    dckpt_comm* get() const { return comm_ ? comm_->get() : nullptr; }
    const std::shared_ptr<Comm>& comm() const { return comm_; }

   private:
    std::shared_ptr<Comm> comm_;
  };

 private:
  Comm() = default;

  // The memoryviews handed to Python point into distckpt's buffers: they are released when the callback returns,
  // so a callback that keeps one gets a released view rather than a dangling pointer.
  static void ReleaseView(py::object& view) {
    try {
      view.attr("release")();
    } catch (py::error_already_set&) {
      // Still exported (e.g. np.frombuffer kept it): nothing more can be done from here.
    }
  }

  static int AllgatherTrampoline(const void* send, size_t send_size, void* recv, uint64_t timeout_ms, void* user) {
    auto* self = static_cast<Comm*>(user);
    CallbackGil gil;
    try {
      int size = self->size_cached();
      py::object send_view = py::memoryview::from_memory(send, static_cast<py::ssize_t>(send_size));
      py::object recv_view = py::memoryview::from_memory(recv, static_cast<py::ssize_t>(send_size * size));
      try {
        self->allgather_(send_view, recv_view, timeout_ms);
      } catch (...) {
        ReleaseView(send_view);
        ReleaseView(recv_view);
        throw;
      }
      ReleaseView(send_view);
      ReleaseView(recv_view);
      return 0;
    } catch (py::error_already_set& e) {
      self->errors_.Keep(e);
      return 1;
    }
  }

  static int BroadcastTrampoline(void* buf, size_t size, int root, uint64_t timeout_ms, void* user) {
    auto* self = static_cast<Comm*>(user);
    CallbackGil gil;
    try {
      py::object view = py::memoryview::from_memory(buf, static_cast<py::ssize_t>(size));
      try {
        self->broadcast_(view, root, timeout_ms);
      } catch (...) {
        ReleaseView(view);
        throw;
      }
      ReleaseView(view);
      return 0;
    } catch (py::error_already_set& e) {
      self->errors_.Keep(e);
      return 1;
    }
  }

  static int BarrierTrampoline(uint64_t timeout_ms, void* user) {
    auto* self = static_cast<Comm*>(user);
    CallbackGil gil;
    try {
      self->barrier_(timeout_ms);
      return 0;
    } catch (py::error_already_set& e) {
      self->errors_.Keep(e);
      return 1;
    }
  }

  int size_cached() const { return size_; }

  dckpt_comm* comm_ = nullptr;
  std::atomic<int> users_{0};
  int size_ = -1;
  py::object allgather_, broadcast_, barrier_;
  CallbackErrors errors_;
};

// ---- State ----------------------------------------------------------------------------------------------------

/// What one rank saves, or where it loads to. Holds every buffer it was given until it is destroyed.
class State {
 public:
  State() { Check(dckpt_state_new(&state_)); }
  ~State() { dckpt_state_free(state_); }

  void AddTensor(const std::string& name, int dtype, const std::vector<uint64_t>& shape) {
    Check(dckpt_state_add_tensor(state_, name.c_str(), dtype, shape.size(), shape.data()));
    dtypes_[name] = dtype;
  }

  /// `data`: any C-contiguous buffer of exactly volume(lengths) * dtype size bytes (writable when loading).
  void AddPiece(const std::string& name, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths,
                const py::object& data, bool writable) {
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

  /// A piece in CUDA device memory: `nbytes` at `ptr` on `device`, ordered on `stream` (a CUstream as an integer;
  /// 0 is the legacy default stream). `owner` (the tensor or array the memory belongs to) is kept alive as long as
  /// the State, as held buffers are. The same call serves save and load (the C ABI has no const device piece; a
  /// State built for a save is never loaded).
  void AddDevicePiece(const std::string& name, const std::vector<uint64_t>& offsets,
                      const std::vector<uint64_t>& lengths, uintptr_t ptr, uint64_t nbytes, int device,
                      uintptr_t stream, const py::object& owner) {
    if (offsets.size() != lengths.size()) throw py::value_error("offsets and lengths differ in length");
    auto it = dtypes_.find(name);
    const int dtype = it == dtypes_.end() ? 0 : it->second;
    if (dtype != 0) {
      const uint64_t expect = Volume(lengths) * dckpt_dtype_size(dtype);
      if (nbytes != expect) {
        throw py::value_error("device piece of '" + name + "' has " + std::to_string(nbytes) +
                              " bytes; its box needs " + std::to_string(expect));
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
      rc = dckpt_state_add_piece_ex(state_, name.c_str(), offsets.data(), lengths.data(),
                                    reinterpret_cast<void*>(ptr), &o);
    }
    Check(rc);
    owners_.push_back(owner);
  }

  void AddBytes(const std::string& name, const py::object& data, bool writable) {
    auto held = std::make_unique<HeldBuffer>(data, writable);
    Check(dckpt_state_add_bytes(state_, name.c_str(), held->data(), held->size()));
    held_.push_back(std::move(held));
  }

  uint64_t BytesSize(const std::string& name) const {
    uint64_t n = 0;
    Check(dckpt_state_bytes_size(&n, state_, name.c_str()));
    return n;
  }

  void SetUser(const std::string& key, const std::string& value) {
    Check(dckpt_state_set_user(state_, key.c_str(), value.c_str()));
  }

  void SetStructure(const py::bytes& data) {
    std::string s = data;
    Check(dckpt_state_set_structure(state_, s.data(), s.size()));
  }

  dckpt_state* get() { return state_; }

 private:
  dckpt_state* state_ = nullptr;
  std::unordered_map<std::string, int> dtypes_;
  std::vector<std::unique_ptr<HeldBuffer>> held_;
  std::vector<py::object> owners_;  // the owners of device pieces' memory
};

// ---- Storage --------------------------------------------------------------------------------------------------

/// What a Python storage object's callbacks share: the object, and the last exception one of them raised (its text
/// is appended to the error of the call that failed, the exception itself becomes its __cause__). Lives as long as
/// the dckpt_storage that points at it (Storage, and every Reader and SaveFuture using it, hold it).
struct PyStorageCallbacks {
  py::object impl;
  py::object create, write, sync, close, size, read, list, remove, commit;  // bound methods (None: absent)
  std::mutex mu;
  uint64_t failures = 0;   // guarded by mu: exceptions kept so far (a call compares before and after)
  std::string last_text;   // guarded by mu: "TypeName: message" of the last one
  py::object last_exc;     // guarded by mu; only touched with the GIL held

  /// Maps the exception being handled to a status code and keeps it. Called with the GIL held.
  int Fail(py::error_already_set& e) {
    int code = DCKPT_EIO;
    if (e.matches(PyExc_FileNotFoundError)) {
      code = DCKPT_ENOTFOUND;
    } else if (e.matches(PyExc_FileExistsError)) {
      code = DCKPT_EEXISTS;
    } else if (e.matches(PyExc_OSError)) {
      py::object err = py::getattr(e.value(), "errno", py::none());
      if (!err.is_none() && py::int_(err).cast<long>() == ENOSPC) code = DCKPT_ENOSPC;
    }
    // A missing path is an ordinary answer (distckpt probes for files), not a failure worth reporting.
    if (code == DCKPT_ENOTFOUND) return code;
    std::string text;
    try {
      text = py::str(e.type().attr("__name__")).cast<std::string>() + ": " + py::str(e.value()).cast<std::string>();
    } catch (py::error_already_set&) {
      text = "an exception that cannot be printed";
    }
    std::lock_guard<std::mutex> lock(mu);
    ++failures;
    last_text = std::move(text);
    last_exc = e.value();
    return code;
  }
  uint64_t Failures() {
    std::lock_guard<std::mutex> lock(mu);
    return failures;
  }
  /// The last kept exception if one was kept after `since` (else empty / None).
  std::pair<std::string, py::object> Since(uint64_t since) {
    std::lock_guard<std::mutex> lock(mu);
    if (failures <= since) return {std::string(), py::none()};
    return {last_text, last_exc};
  }
};

/// A memoryview over memory distckpt owns, released when the callback returns (a callback that keeps it gets a
/// released view, never a dangling pointer).
class TempView {
 public:
  TempView(const void* data, size_t size, bool writable)
      : view_(py::reinterpret_steal<py::object>(PyMemoryView_FromMemory(
            static_cast<char*>(const_cast<void*>(data)), static_cast<Py_ssize_t>(size),
            writable ? PyBUF_WRITE : PyBUF_READ))) {
    if (!view_) throw py::error_already_set();
  }
  ~TempView() {
    if (PyObject_CallMethod(view_.ptr(), "release", nullptr) == nullptr) PyErr_Clear();  // still exported: leave it
  }
  const py::object& get() const { return view_; }

 private:
  py::object view_;
};

/// Runs `body` with the GIL, turning a Python exception into a status code (a C++ one into DCKPT_EIO).
template <typename F>
int CallPython(PyStorageCallbacks* cb, F&& body) {
  CallbackGil gil;
  try {
    body();
    return DCKPT_OK;
  } catch (py::error_already_set& e) {
    return cb->Fail(e);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    py::error_already_set err;
    return cb->Fail(err);
  }
}

namespace storage_trampolines {

int Create(dckpt_storage_file** file, const char* path, uint64_t size_hint, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] {
    py::object f = cb->create(path, size_hint);
    *file = f.release().ptr();  // a new reference, dropped by Close
  });
}

int Write(dckpt_storage_file* file, uint64_t offset, const void* data, size_t size, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] {
    TempView view(data, size, /*writable=*/false);
    cb->write(py::handle(static_cast<PyObject*>(file)), offset, view.get());
  });
}

int Sync(dckpt_storage_file* file, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] { cb->sync(py::handle(static_cast<PyObject*>(file))); });
}

int Close(dckpt_storage_file* file, uint64_t size, int discard, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] {
    py::object f = py::reinterpret_steal<py::object>(static_cast<PyObject*>(file));  // dropped whatever happens
    cb->close(f, size, discard != 0);
  });
}

int Size(uint64_t* size, const char* path, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] { *size = cb->size(path).cast<uint64_t>(); });
}

int Read(size_t* got, const char* path, uint64_t offset, void* data, size_t size, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] {
    TempView view(data, size, /*writable=*/true);
    uint64_t n = cb->read(path, offset, view.get()).cast<uint64_t>();
    if (n > size) throw std::runtime_error("the storage's read() returned more bytes than were asked for");
    *got = static_cast<size_t>(n);
  });
}

int List(dckpt_storage_list* out, const char* dir, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] {
    py::object names = cb->list(dir);
    for (py::handle n : names) {
      std::string name = py::str(n).cast<std::string>();
      if (dckpt_storage_list_add(out, name.c_str()) != DCKPT_OK) {
        throw std::runtime_error(std::string("the storage's list() gave a name distckpt refused: ") +
                                 dckpt_error_last());
      }
    }
  });
}

int Remove(const char* path, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] { cb->remove(path); });
}

int Commit(const char* path, const void* data, size_t size, int replace, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] {
    py::bytes b(static_cast<const char*>(data), size);  // metadata: small, and a callback may keep it
    cb->commit(path, b, replace != 0);
  });
}

}  // namespace storage_trampolines

/// A dckpt_storage: POSIX, in memory, or a Python object's methods (see distckpt/storage.py for the protocol).
class Storage {
 public:
  static std::shared_ptr<Storage> Posix() {
    auto s = std::shared_ptr<Storage>(new Storage("posix"));
    Check(dckpt_storage_new_posix(&s->storage_));
    return s;
  }
  static std::shared_ptr<Storage> Memory() {
    auto s = std::shared_ptr<Storage>(new Storage("memory"));
    Check(dckpt_storage_new_memory(&s->storage_));
    return s;
  }
  static std::shared_ptr<Storage> Callbacks(const py::object& impl, unsigned max_in_flight) {
    auto cb = std::make_shared<PyStorageCallbacks>();
    cb->impl = impl;
    auto method = [&](const char* name, bool required) -> py::object {
      py::object m = py::getattr(impl, name, py::none());
      if (!m.is_none() && !PyCallable_Check(m.ptr())) {
        throw py::type_error(std::string("storage method '") + name + "' is not callable");
      }
      if (required && m.is_none()) throw py::type_error(std::string("a storage needs a method '") + name + "'");
      return m;
    };
    cb->create = method("create", true);
    cb->write = method("write", true);
    cb->sync = method("sync", false);
    cb->close = method("close", true);
    cb->size = method("size", true);
    cb->read = method("read", true);
    cb->list = method("list", true);
    cb->remove = method("remove", true);
    cb->commit = method("commit", false);
    dckpt_storage_callbacks c;
    Check(dckpt_storage_callbacks_init(&c, DCKPT_STORAGE_CALLBACKS_VERSION));
    namespace t = storage_trampolines;
    c.create = &t::Create;
    c.write = &t::Write;
    c.sync = cb->sync.is_none() ? nullptr : &t::Sync;
    c.close = &t::Close;
    c.size = &t::Size;
    c.read = &t::Read;
    c.list = &t::List;
    c.remove = &t::Remove;
    c.commit = cb->commit.is_none() ? nullptr : &t::Commit;
    c.user_data = cb.get();
    c.max_in_flight = max_in_flight;
    auto s = std::shared_ptr<Storage>(new Storage("callbacks"));
    Check(dckpt_storage_new_callbacks(&s->storage_, &c));
    s->callbacks_ = std::move(cb);
    return s;
  }

  ~Storage() {
    // Only the caller's reference: readers and saves that use the storage hold this object too, so nothing runs on
    // it now, and freeing it calls no callback.
    dckpt_storage_free(storage_);
    if (callbacks_) {
      py::gil_scoped_acquire gil;  // the bound methods are Python objects
      callbacks_.reset();
    }
  }

  dckpt_storage* get() const { return storage_; }
  const std::string& kind() const { return kind_; }
  uint64_t failures() const { return callbacks_ ? callbacks_->Failures() : 0; }
  std::pair<std::string, py::object> FailuresSince(uint64_t since) const {
    if (!callbacks_) return {std::string(), py::none()};
    return callbacks_->Since(since);
  }
  py::object impl() const { return callbacks_ ? callbacks_->impl : py::none(); }

 private:
  explicit Storage(std::string kind) : kind_(std::move(kind)) {}
  dckpt_storage* storage_ = nullptr;
  std::string kind_;
  std::shared_ptr<PyStorageCallbacks> callbacks_;
};

/// Marks where a call that uses `storage` starts, so that a failure can name the exception a callback raised during
/// it (text appended to the message, exception as the cause when nothing else is).
class StorageCall {
 public:
  explicit StorageCall(std::shared_ptr<Storage> s) : storage_(std::move(s)), start_(storage_ ? storage_->failures() : 0) {}
  dckpt_storage* get() const { return storage_ ? storage_->get() : nullptr; }
  /// Where a later step of a long-lived user (a reader's read) starts.
  uint64_t Mark() const { return storage_ ? storage_->failures() : 0; }
  /// Appends the text of the last exception a callback raised since `since` (default: the start of the call) to
  /// `message`; sets `cause` to it if `cause` is None.
  void Annotate(std::string& message, py::object& cause) const { Annotate(message, cause, start_); }
  void Annotate(std::string& message, py::object& cause, uint64_t since) const {
    if (!storage_) return;
    auto [text, exc] = storage_->FailuresSince(since);
    if (text.empty()) return;
    message += " (storage callback raised " + text + ")";
    if (cause.is_none()) cause = exc;
  }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  uint64_t start_;
};

/// Raises for rc != OK with the storage's callback error attached.
void CheckStorage(int rc, const StorageCall& call, py::object cause = py::none()) {
  if (rc == DCKPT_OK) return;
  std::string message = dckpt_error_last();
  call.Annotate(message, cause);
  throw NativeError(rc, std::move(message), std::move(cause));
}

struct RemovedList {
  std::vector<std::string> paths;
};

int CollectRemoved(const char* path, void* user) {
  static_cast<RemovedList*>(user)->paths.emplace_back(path);
  return 0;
}

py::dict StorageStat(std::shared_ptr<Storage> storage, const std::string& path, double grace_seconds) {
  StorageCall call(storage);
  dckpt_path_info info = DCKPT_PATH_INFO_INIT;
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_storage_stat(&info, call.get(), path.c_str(), grace_seconds);
  }
  CheckStorage(rc, call);
  static const char* const kinds[] = {"none", "checkpoint", "incomplete"};
  py::dict d;
  d["kind"] = info.kind >= 0 && info.kind <= 2 ? kinds[info.kind] : "unknown";
  d["files"] = info.files;
  d["bytes"] = info.bytes;
  d["leftover_files"] = info.leftover_files;
  d["leftover_bytes"] = info.leftover_bytes;
  d["saves_in_progress"] = info.saves_in_progress;
  return d;
}

/// The paths removed (or, with dry_run, that would be).
std::vector<std::string> StorageRemoveLeftovers(std::shared_ptr<Storage> storage, const std::string& path,
                                                double grace_seconds, bool dry_run) {
  StorageCall call(storage);
  RemovedList removed;
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_storage_remove_leftovers(call.get(), path.c_str(), grace_seconds, dry_run ? 1 : 0, &CollectRemoved,
                                        &removed);
  }
  CheckStorage(rc, call);
  return removed.paths;
}

void StorageRemoveCheckpoint(std::shared_ptr<Storage> storage, const std::string& path) {
  StorageCall call(storage);
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_storage_remove_checkpoint(call.get(), path.c_str());
  }
  CheckStorage(rc, call);
}


// ---- Save / load ----------------------------------------------------------------------------------------------

py::dict SaveInfoDict(const dckpt_save_info& info) {
  py::dict d;
  d["num_files"] = info.num_files;
  d["num_entries"] = info.num_entries;
  d["bytes_written"] = info.bytes_written;
  d["total_bytes"] = info.total_bytes;
  d["metadata_bytes"] = info.metadata_bytes;
  d["seconds"] = info.seconds;
  return d;
}

py::dict IoStatsDict(const dckpt_io_stats& s) {
  py::dict d;
  d["bytes_read"] = s.bytes_read;
  d["read_calls"] = s.read_calls;
  d["bytes_verified"] = s.bytes_verified;
  d["bytes_delivered"] = s.bytes_delivered;
  d["seconds"] = s.seconds;
  d["bytes_mapped"] = s.bytes_mapped;
  d["bytes_received_from_peers"] = s.bytes_received_from_peers;
  d["bytes_sent_to_peers"] = s.bytes_sent_to_peers;
  return d;
}

dckpt_save_options SaveOptions(unsigned io_threads, bool overwrite, bool sync, uint64_t checksum_block_size,
                               uint64_t timeout_ms, Progress* progress) {
  dckpt_save_options o;
  Check(dckpt_save_options_init(&o, DCKPT_SAVE_OPTIONS_VERSION));
  o.io_threads = io_threads;
  o.overwrite = overwrite ? 1 : 0;
  o.sync = sync ? 1 : 0;
  o.checksum_block_size = checksum_block_size;
  o.timeout_ms = timeout_ms;
  if (progress) {
    o.progress = &ProgressTrampoline;
    o.progress_user_data = progress;
  }
  return o;
}

dckpt_read_options ReadOptions(bool verify, unsigned io_threads, uint64_t timeout_ms, Progress* progress,
                               bool map_files = true, bool share_verification = true) {
  dckpt_read_options o;
  Check(dckpt_read_options_init(&o, DCKPT_READ_OPTIONS_VERSION));
  o.verify = verify ? 1 : 0;
  o.map_files = map_files ? 1 : 0;
  o.share_verification = share_verification ? 1 : 0;
  o.io_threads = io_threads;
  o.timeout_ms = timeout_ms;
  if (progress) {
    o.progress = &ProgressTrampoline;
    o.progress_user_data = progress;
  }
  return o;
}

/// Raises for a failed collective call, preferring an exception a callback raised (progress first, then comm, then
/// storage); the text of an exception a storage callback raised during the call is appended to the message.
/// `since`: a StorageCall::Mark() where the call started, when it started after the StorageCall was made.
void CheckCall(int rc, Progress* progress, const std::shared_ptr<Comm>& comm, const StorageCall* storage = nullptr,
               std::optional<uint64_t> since = std::nullopt) {
  if (rc == DCKPT_OK) return;
  std::string message = dckpt_error_last();
  py::object cause = progress ? progress->errors.Take() : py::none();
  if (comm) {
    py::object comm_cause = comm->errors()->Take();
    if (cause.is_none()) cause = comm_cause;
  }
  if (storage) {
    if (since) {
      storage->Annotate(message, cause, *since);
    } else {
      storage->Annotate(message, cause);
    }
  }
  throw NativeError(rc, std::move(message), std::move(cause));
}

py::dict Save(const std::string& path, State& state, std::shared_ptr<Comm> comm, unsigned io_threads, bool overwrite,
              bool sync, uint64_t checksum_block_size, uint64_t timeout_ms, py::object progress,
              std::shared_ptr<Storage> storage) {
  auto prog = MakeProgress(progress);
  dckpt_save_options o = SaveOptions(io_threads, overwrite, sync, checksum_block_size, timeout_ms, prog.get());
  StorageCall call(std::move(storage));
  o.storage = call.get();
  dckpt_save_info info = DCKPT_SAVE_INFO_INIT;
  Comm::Use use(comm);
  dckpt_comm* c = use.get();
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_save(&info, path.c_str(), state.get(), c, &o);
  }
  CheckCall(rc, prog.get(), comm, &call);
  return SaveInfoDict(info);
}

/// An asynchronous save in flight. Holds the communicator and the progress callback until the save completes.
class SaveFuture {
 public:
  SaveFuture(dckpt_save_future* f, std::shared_ptr<Comm> comm, std::shared_ptr<Progress> progress,
             std::unique_ptr<StorageCall> storage)
      : future_(f),
        comm_(std::move(comm)),
        use_(std::make_unique<Comm::Use>(comm_)),
        progress_(std::move(progress)),
        storage_(std::move(storage)) {}
  ~SaveFuture() { Free(); }

  /// The save's summary; raises its error; returns None if it is still running after timeout_ms.
  py::object Wait(uint64_t timeout_ms) {
    if (future_ == nullptr) throw NativeError(DCKPT_ESTATE, "the save future is closed");
    dckpt_save_info info = DCKPT_SAVE_INFO_INIT;
    int rc, done = 0;
    {
      py::gil_scoped_release nogil;
      rc = dckpt_save_future_wait(&info, future_, timeout_ms);
      // DCKPT_ETIMEOUT means "still running" or "the save itself timed out": dckpt_save_future_test tells which.
      if (rc == DCKPT_ETIMEOUT) dckpt_save_future_test(&done, future_);
    }
    if (rc == DCKPT_ETIMEOUT && !done) return py::none();
    CheckCall(rc, progress_.get(), comm_, storage_.get());
    return SaveInfoDict(info);
  }

  bool Done() const {
    if (future_ == nullptr) return true;
    int done = 0;
    Check(dckpt_save_future_test(&done, future_));
    return done != 0;
  }

  std::pair<double, uint64_t> Staging() const {
    if (future_ == nullptr) throw NativeError(DCKPT_ESTATE, "the save future is closed");
    double seconds = 0;
    uint64_t bytes = 0;
    Check(dckpt_save_future_staging(&seconds, &bytes, future_));
    return {seconds, bytes};
  }

  std::pair<uint64_t, uint64_t> Snapshot() const {
    if (future_ == nullptr) throw NativeError(DCKPT_ESTATE, "the save future is closed");
    uint64_t snapshot = 0;
    uint64_t fallback = 0;
    Check(dckpt_save_future_snapshot(&snapshot, &fallback, future_));
    return {snapshot, fallback};
  }

  /// Waits for the save if it is still running, then frees everything it holds (its staging copy included).
  void Free() {
    if (future_ == nullptr) return;
    dckpt_save_future* f = future_;
    future_ = nullptr;
    {
      py::gil_scoped_release nogil;  // the background save may need the GIL for its callbacks
      dckpt_save_future_free(f);
    }
    progress_.reset();
    use_.reset();
    comm_.reset();
    storage_.reset();
  }

 private:
  dckpt_save_future* future_;
  std::shared_ptr<Comm> comm_;
  std::unique_ptr<Comm::Use> use_;  // the communicator belongs to the save until it completes
  std::shared_ptr<Progress> progress_;
  std::unique_ptr<StorageCall> storage_;  // the storage's callbacks must outlive the save
};

std::unique_ptr<SaveFuture> SaveAsync(const std::string& path, State& state, std::shared_ptr<Comm> comm,
                                      unsigned io_threads, bool overwrite, bool sync, uint64_t checksum_block_size,
                                      uint64_t timeout_ms, py::object progress, bool device_snapshot,
                                      std::shared_ptr<Storage> storage) {
  auto prog = MakeProgress(progress);
  dckpt_save_options o = SaveOptions(io_threads, overwrite, sync, checksum_block_size, timeout_ms, prog.get());
  o.device_snapshot = device_snapshot ? 1 : 0;
  auto call = std::make_unique<StorageCall>(std::move(storage));
  o.storage = call->get();
  Comm::Use use(comm);
  dckpt_comm* c = use.get();
  dckpt_save_future* f = nullptr;
  int rc;
  {
    py::gil_scoped_release nogil;  // staging copies every buffer (in parallel)
    rc = dckpt_save_async(&f, path.c_str(), state.get(), c, &o);
  }
  CheckCall(rc, prog.get(), comm, call.get());
  return std::make_unique<SaveFuture>(f, std::move(comm), std::move(prog), std::move(call));
}

py::dict Load(const std::string& path, State& state, std::shared_ptr<Comm> comm, bool verify, unsigned io_threads,
              uint64_t timeout_ms, py::object progress, bool map_files, bool share_verification,
              std::shared_ptr<Storage> storage) {
  auto prog = MakeProgress(progress);
  dckpt_read_options o = ReadOptions(verify, io_threads, timeout_ms, prog.get(), map_files, share_verification);
  StorageCall call(std::move(storage));
  o.storage = call.get();
  dckpt_io_stats stats = DCKPT_IO_STATS_INIT;
  Comm::Use use(comm);
  dckpt_comm* c = use.get();
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_load(&stats, path.c_str(), state.get(), c, &o);
  }
  CheckCall(rc, prog.get(), comm, &call);
  return IoStatsDict(stats);
}

// ---- Reader ---------------------------------------------------------------------------------------------------

/// An open checkpoint. Reads may run concurrently from several Python threads (the GIL is released during each);
/// close() waits for them.
class Reader {
 public:
  static std::unique_ptr<Reader> Open(const std::string& path, std::shared_ptr<Comm> comm, bool verify,
                                      unsigned io_threads, uint64_t timeout_ms, bool map_files,
                                      bool share_verification, bool pin_files, int fanout,
                                      std::shared_ptr<Storage> storage) {
    dckpt_read_options o = ReadOptions(verify, io_threads, timeout_ms, nullptr, map_files, share_verification);
    o.pin_files = pin_files ? 1 : 0;
    o.fanout = fanout;
    auto call = std::make_unique<StorageCall>(std::move(storage));
    o.storage = call->get();
    Comm::Use use(comm);
    dckpt_comm* c = use.get();
    dckpt_reader* r = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = dckpt_reader_open(&r, path.c_str(), c, &o);
    }
    CheckCall(rc, nullptr, comm, call.get());
    return std::unique_ptr<Reader>(new Reader(r, std::move(call)));
  }
  ~Reader() {
    py::gil_scoped_release nogil;  // plugged-in storage may take the GIL while the reader lets go of its files
    dckpt_reader_free(reader_);
  }

  void Close() {
    py::gil_scoped_release nogil;
    std::unique_lock<std::shared_mutex> lock(mu_);
    dckpt_reader_free(reader_);
    reader_ = nullptr;
  }
  bool closed() const { return reader_ == nullptr; }

  py::dict Info() {
    Locked r = Acquire();
    dckpt_checkpoint_info info = DCKPT_CHECKPOINT_INFO_INIT;
    Check(dckpt_reader_info(&info, r.reader));
    py::dict d;
    d["format_major"] = info.format_major;
    d["format_minor"] = info.format_minor;
    d["writer"] = std::string(info.writer ? info.writer : "");
    d["num_entries"] = info.num_entries;
    d["num_files"] = info.num_files;
    d["total_bytes"] = info.total_bytes;
    d["metadata_bytes"] = info.metadata_bytes;
    d["checksum_block_size"] = info.checksum_block_size;
    return d;
  }

  /// (name, kind, dtype, shape, nbytes, num_chunks) of every entry, in name order.
  py::list Entries() {
    Locked locked = Acquire();
    dckpt_reader* r = locked.reader;
    dckpt_checkpoint_info info = DCKPT_CHECKPOINT_INFO_INIT;
    Check(dckpt_reader_info(&info, r));
    py::list out;
    for (size_t i = 0; i < info.num_entries; ++i) {
      dckpt_entry_info e = DCKPT_ENTRY_INFO_INIT;
      Check(dckpt_reader_entry(&e, r, i));
      py::tuple shape(e.ndim);
      for (size_t d = 0; d < e.ndim; ++d) shape[d] = py::int_(e.shape[d]);
      out.append(py::make_tuple(py::str(e.name), e.kind, e.dtype, shape, e.nbytes, e.num_chunks));
    }
    return out;
  }

  std::optional<size_t> Find(const std::string& name) {
    Locked r = Acquire();
    size_t index = 0;
    int rc = dckpt_reader_find(&index, r.reader, name.c_str());
    if (rc == DCKPT_ENOTFOUND) return std::nullopt;
    Check(rc);
    return index;
  }

  /// (offsets, lengths, file, file_offset, length, checksum) of chunk `chunk` of entry `entry`.
  py::tuple Chunk(size_t entry, size_t chunk) {
    Locked r = Acquire();
    dckpt_chunk_info c = DCKPT_CHUNK_INFO_INIT;
    Check(dckpt_reader_chunk(&c, r.reader, entry, chunk));
    py::tuple off(c.ndim), len(c.ndim);
    for (size_t d = 0; d < c.ndim; ++d) {
      off[d] = py::int_(c.offsets[d]);
      len[d] = py::int_(c.lengths[d]);
    }
    return py::make_tuple(off, len, py::str(c.file), c.file_offset, c.length, c.checksum);
  }

  /// Reads the box [offsets, offsets + lengths) of tensor `name` into the writable C-contiguous buffer `dst`.
  void Read(const std::string& name, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths,
            const py::object& dst) {
    if (offsets.size() != lengths.size()) throw py::value_error("offsets and lengths differ in length");
    HeldBuffer buf(dst, /*writable=*/true);
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (reader_) {
        rc = dckpt_reader_read(reader_, name.c_str(), offsets.size(), offsets.data(), lengths.data(), buf.data(),
                               buf.size());
      }
    }
    CheckOpen(rc, mark);
  }

  /// Reads the box [offsets, offsets + lengths) of tensor `name` into `nbytes` of CUDA device memory at `ptr` on
  /// `device`, after the work queued on `stream` (0: the legacy default stream); the copies have completed on return.
  void ReadDevice(const std::string& name, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& lengths,
                  uintptr_t ptr, uint64_t nbytes, int device, uintptr_t stream) {
    if (offsets.size() != lengths.size()) throw py::value_error("offsets and lengths differ in length");
    dckpt_piece_options o;
    Check(dckpt_piece_options_init(&o, DCKPT_PIECE_OPTIONS_VERSION));
    o.memory = DCKPT_MEMORY_CUDA;
    o.device = device;
    o.stream = reinterpret_cast<void*>(stream);
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (reader_) {
        rc = dckpt_reader_read_ex(reader_, name.c_str(), offsets.size(), offsets.data(), lengths.data(),
                                  reinterpret_cast<void*>(ptr), nbytes, &o);
      }
    }
    CheckOpen(rc, mark);
  }

  py::bytes ReadBytes(const std::string& name) {
    uint64_t size = 0;
    {
      Locked r = Acquire();
      // A size query: DCKPT_EBUFSIZE (with the size filled in) is its normal answer for a non-empty entry.
      int rc = dckpt_reader_read_bytes(&size, r.reader, name.c_str(), nullptr, 0);
      if (rc != DCKPT_OK && rc != DCKPT_EBUFSIZE) Raise(rc);
    }
    std::string out(size, '\0');
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (reader_) rc = dckpt_reader_read_bytes(&size, reader_, name.c_str(), out.data(), out.size());
    }
    CheckOpen(rc, mark);
    return py::bytes(out.data(), size);
  }

  py::dict User() {
    Locked locked = Acquire();
    dckpt_reader* r = locked.reader;
    size_t n = 0;
    Check(dckpt_reader_num_user(&n, r));
    py::dict d;
    for (size_t i = 0; i < n; ++i) {
      const char* k = nullptr;
      const char* v = nullptr;
      Check(dckpt_reader_user(&k, &v, r, i));
      d[py::str(k)] = py::str(v);
    }
    return d;
  }

  py::bytes Structure() {
    Locked r = Acquire();
    const char* data = nullptr;
    size_t size = 0;
    Check(dckpt_reader_structure(&data, &size, r.reader));
    return py::bytes(data ? data : "", size);
  }

  void Verify(py::object progress) {
    auto prog = MakeProgress(progress);
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (reader_) rc = dckpt_reader_verify(reader_, prog ? &ProgressTrampoline : nullptr, prog.get());
    }
    if (rc == kClosed) CheckOpen(rc, mark);
    CheckCall(rc, prog.get(), nullptr, storage_.get(), mark);
  }

  /// Loads a State from the checkpoint this reader opened (collective over `comm`, as it was opened).
  py::dict Load(State& state, std::shared_ptr<Comm> comm, py::object progress) {
    auto prog = MakeProgress(progress);
    dckpt_io_stats stats = DCKPT_IO_STATS_INIT;
    Comm::Use use(comm);
    dckpt_comm* c = use.get();
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (reader_) {
        rc = dckpt_reader_load(&stats, reader_, state.get(), c, prog ? &ProgressTrampoline : nullptr, prog.get());
      }
    }
    if (rc == kClosed) CheckOpen(rc, mark);
    CheckCall(rc, prog.get(), comm, storage_.get(), mark);
    return IoStatsDict(stats);
  }

  void VerifyChunk(size_t entry, size_t chunk) {
    const uint64_t mark = Mark();
    int rc = kClosed;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (reader_) rc = dckpt_reader_verify_chunk(reader_, entry, chunk);
    }
    CheckOpen(rc, mark);
  }

  py::dict IoStats() {
    Locked r = Acquire();
    dckpt_io_stats s = DCKPT_IO_STATS_INIT;
    Check(dckpt_reader_io_stats(&s, r.reader));
    return IoStatsDict(s);
  }

 private:
  Reader(dckpt_reader* r, std::unique_ptr<StorageCall> storage) : reader_(r), storage_(std::move(storage)) {}

  // Every use of reader_ holds mu_ shared; close() holds it exclusively. Calls that release the GIL drop the lock
  // before taking the GIL back, so the lock and the GIL never wait on each other.
  static constexpr int kClosed = 1;  // not a dckpt status: "the reader was closed under us"
  struct Locked {
    std::shared_lock<std::shared_mutex> lock;
    dckpt_reader* reader;
  };
  Locked Acquire() {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (reader_ == nullptr) throw NativeError(DCKPT_ESTATE, "the reader is closed");
    return Locked{std::move(lock), reader_};
  }
  uint64_t Mark() const { return storage_->Mark(); }
  /// Raises for rc != OK (kClosed: the reader was closed), naming what a storage callback raised since `mark`.
  void CheckOpen(int rc, uint64_t mark) const {
    if (rc == kClosed) throw NativeError(DCKPT_ESTATE, "the reader is closed");
    if (rc == DCKPT_OK) return;
    std::string message = dckpt_error_last();
    py::object cause = py::none();
    storage_->Annotate(message, cause, mark);
    throw NativeError(rc, std::move(message), std::move(cause));
  }
  dckpt_reader* reader_;
  std::shared_mutex mu_;
  std::unique_ptr<StorageCall> storage_;  // the storage's callbacks must outlive the reader
};

// ---- Tools ----------------------------------------------------------------------------------------------------

void ExportSafetensors(const std::string& ckpt_path, const std::string& out_dir, uint64_t max_shard_bytes,
                       std::optional<std::string> prefix, bool verify, py::object progress,
                       std::shared_ptr<Storage> storage, std::shared_ptr<Storage> out_storage) {
  auto prog = MakeProgress(progress);
  dckpt_export_options o;
  Check(dckpt_export_options_init(&o, DCKPT_EXPORT_OPTIONS_VERSION));
  StorageCall in_call(std::move(storage)), out_call(std::move(out_storage));
  o.storage = in_call.get();
  o.out_storage = out_call.get();
  o.max_shard_bytes = max_shard_bytes;
  o.prefix = prefix ? prefix->c_str() : nullptr;
  o.verify = verify ? 1 : 0;
  if (prog) {
    o.progress = &ProgressTrampoline;
    o.progress_user_data = prog.get();
  }
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_export_safetensors(ckpt_path.c_str(), out_dir.c_str(), &o);
  }
  if (rc == DCKPT_OK) return;
  std::string message = dckpt_error_last();
  py::object cause = prog ? prog->errors.Take() : py::none();
  in_call.Annotate(message, cause);
  if (out_call.storage() != in_call.storage()) out_call.Annotate(message, cause);
  throw NativeError(rc, std::move(message), std::move(cause));
}

}  // namespace
}  // namespace distckpt_python

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
  m.attr("STREAM_READY") = py::int_(reinterpret_cast<uintptr_t>(DCKPT_STREAM_READY));
  m.attr("DEVICE_OF_POINTER") = py::int_(DCKPT_DEVICE_OF_POINTER);
  m.attr("ENTRY_TENSOR") = static_cast<int>(DCKPT_ENTRY_TENSOR);
  m.attr("ENTRY_BYTES") = static_cast<int>(DCKPT_ENTRY_BYTES);

  py::class_<Comm, std::shared_ptr<Comm>>(m, "Comm")
      .def_static("gloo", &Comm::Gloo, py::arg("rank"), py::arg("world_size"), py::arg("rendezvous"), py::arg("prefix"),
                  py::arg("iface"), py::arg("hostname"), py::arg("timeout_ms"))
      .def_static("external", &Comm::External, py::arg("rank"), py::arg("size"), py::arg("allgather"),
                  py::arg("broadcast"), py::arg("barrier"))
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("size", &Comm::size)
      .def_property_readonly("closed", &Comm::closed)
      .def("barrier", &Comm::Barrier, py::arg("timeout_ms"))
      .def("abort", &Comm::Abort, py::arg("reason"))
      .def("close", &Comm::Close);

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

  py::class_<SaveFuture>(m, "SaveFuture")
      .def("wait", &SaveFuture::Wait, py::arg("timeout_ms"))
      .def("done", &SaveFuture::Done)
      .def("staging", &SaveFuture::Staging)
      .def("snapshot", &SaveFuture::Snapshot)
      .def("free", &SaveFuture::Free);

  py::class_<Reader>(m, "Reader")
      .def_static("open", &Reader::Open, py::arg("path"), py::arg("comm").none(true), py::arg("verify"),
                  py::arg("io_threads"), py::arg("timeout_ms"), py::arg("map_files") = true,
                  py::arg("share_verification") = true, py::arg("pin_files") = true,
                  py::arg("fanout") = static_cast<int>(DCKPT_FANOUT_AUTO), py::arg("storage").none(true) = nullptr)
      .def("load", &Reader::Load, py::arg("state"), py::arg("comm").none(true), py::arg("progress"))
      .def("close", &Reader::Close)
      .def_property_readonly("closed", &Reader::closed)
      .def("info", &Reader::Info)
      .def("entries", &Reader::Entries)
      .def("find", &Reader::Find, py::arg("name"))
      .def("chunk", &Reader::Chunk, py::arg("entry"), py::arg("chunk"))
      .def("read", &Reader::Read, py::arg("name"), py::arg("offsets"), py::arg("lengths"), py::arg("dst"))
      .def("read_device", &Reader::ReadDevice, py::arg("name"), py::arg("offsets"), py::arg("lengths"),
           py::arg("ptr"), py::arg("nbytes"), py::arg("device"), py::arg("stream"))
      .def("read_bytes", &Reader::ReadBytes, py::arg("name"))
      .def("user", &Reader::User)
      .def("structure", &Reader::Structure)
      .def("verify", &Reader::Verify, py::arg("progress"))
      .def("verify_chunk", &Reader::VerifyChunk, py::arg("entry"), py::arg("chunk"))
      .def("io_stats", &Reader::IoStats);

  m.def("save", &Save, py::arg("path"), py::arg("state"), py::arg("comm").none(true), py::arg("io_threads"),
        py::arg("overwrite"), py::arg("sync"), py::arg("checksum_block_size"), py::arg("timeout_ms"),
        py::arg("progress"), py::arg("storage").none(true) = nullptr);
  m.def("save_async", &SaveAsync, py::arg("path"), py::arg("state"), py::arg("comm").none(true), py::arg("io_threads"),
        py::arg("overwrite"), py::arg("sync"), py::arg("checksum_block_size"), py::arg("timeout_ms"),
        py::arg("progress"), py::arg("device_snapshot") = false, py::arg("storage").none(true) = nullptr);
  m.def("load", &Load, py::arg("path"), py::arg("state"), py::arg("comm").none(true), py::arg("verify"),
        py::arg("io_threads"), py::arg("timeout_ms"), py::arg("progress"), py::arg("map_files") = true,
        py::arg("share_verification") = true, py::arg("storage").none(true) = nullptr);
  m.def("export_safetensors", &ExportSafetensors, py::arg("ckpt_path"), py::arg("out_dir"), py::arg("max_shard_bytes"),
        py::arg("prefix"), py::arg("verify"), py::arg("progress"), py::arg("storage").none(true) = nullptr,
        py::arg("out_storage").none(true) = nullptr);

  py::class_<Storage, std::shared_ptr<Storage>>(m, "Storage")
      .def_static("posix", &Storage::Posix)
      .def_static("memory", &Storage::Memory)
      .def_static("callbacks", &Storage::Callbacks, py::arg("impl"), py::arg("max_in_flight") = 0,
                  "Storage through impl's methods create/write/sync/close/size/read/list/remove/commit "
                  "(distckpt/storage.py describes them); sync and commit may be missing or None.")
      .def_property_readonly("kind", &Storage::kind)
      .def_property_readonly("impl", &Storage::impl);
  m.def("storage_stat", &StorageStat, py::arg("storage").none(true), py::arg("path"), py::arg("grace_seconds"));
  m.def("storage_remove_leftovers", &StorageRemoveLeftovers, py::arg("storage").none(true), py::arg("path"),
        py::arg("grace_seconds"), py::arg("dry_run"));
  m.def("storage_remove_checkpoint", &StorageRemoveCheckpoint, py::arg("storage").none(true), py::arg("path"));
}
