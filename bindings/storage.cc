// distckpt._distckpt.Storage and the storage functions (open_url, list, stat, remove_leftovers, remove_checkpoint):
// the C storage callbacks that run a Python object's methods (with the GIL, exceptions kept and mapped to status
// codes), the built-in POSIX and in-memory storages, and the storage a URL names (S3's options: s3.cc).
#include "bindings/storage.h"

#include <cerrno>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "bindings/register.h"

namespace distckpt_python {

/// What a Python storage object's callbacks share: the object, and the last exception one of them raised (its text
/// is appended to the error of the call that failed, the exception itself becomes its __cause__). Lives as long as
/// the dckpt_storage that points at it (Storage, and every Reader and SaveFuture using it, hold it).
struct PyStorageCallbacks {
  py::object impl;
  py::object create, write, sync, close, size, read, list, remove, commit;  // bound methods (None: absent)
  py::object upload_begin, upload_part, upload_complete, upload_abort;      // multipart (None: absent)
  std::mutex mu;
  uint64_t failures = 0;  // guarded by mu: exceptions kept so far (a call compares before and after)
  std::string last_text;  // guarded by mu: "TypeName: message" of the last one
  py::object last_exc;    // guarded by mu; only touched with the GIL held

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

namespace {

/// A memoryview over memory distckpt owns, released when the callback returns (a callback that keeps it gets a
/// released view, never a dangling pointer).
class TempView {
 public:
  TempView(const void* data, size_t size, bool writable)
      : view_(py::reinterpret_steal<py::object>(PyMemoryView_FromMemory(static_cast<char*>(const_cast<void*>(data)),
                                                                        static_cast<Py_ssize_t>(size),
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

int UploadBegin(dckpt_upload** upload, const char* path, uint64_t size_hint, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] {
    py::object u = cb->upload_begin(path, size_hint);
    *upload = u.release().ptr();  // a new reference, dropped by UploadComplete or UploadAbort
  });
}

int UploadPart(dckpt_upload* upload, unsigned number, const void* data, size_t size, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] {
    TempView view(data, size, /*writable=*/false);
    cb->upload_part(py::handle(static_cast<PyObject*>(upload)), number, view.get());
  });
}

int UploadComplete(dckpt_upload* upload, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] {
    py::object u = py::reinterpret_steal<py::object>(static_cast<PyObject*>(upload));  // dropped whatever happens
    cb->upload_complete(u);
  });
}

int UploadAbort(dckpt_upload* upload, void* user) {
  auto* cb = static_cast<PyStorageCallbacks*>(user);
  return CallPython(cb, [&] {
    py::object u = py::reinterpret_steal<py::object>(static_cast<PyObject*>(upload));
    cb->upload_abort(u);
  });
}

}  // namespace storage_trampolines

}  // namespace

std::shared_ptr<Storage> Storage::Native(std::string kind, const std::function<int(dckpt_storage**)>& make) {
  auto s = std::shared_ptr<Storage>(new Storage(std::move(kind)));
  int rc;
  {
    py::gil_scoped_release nogil;  // S3 loads libcurl
    rc = make(&s->storage_);
  }
  Check(rc);
  return s;
}

std::shared_ptr<Storage> Storage::Posix() { return Native("posix", dckpt_storage_new_posix); }

std::shared_ptr<Storage> Storage::Memory() { return Native("memory", dckpt_storage_new_memory); }

std::shared_ptr<Storage> Storage::Callbacks(const py::object& impl, unsigned max_in_flight) {
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
  cb->upload_begin = method("upload_begin", false);
  cb->upload_part = method("upload_part", false);
  cb->upload_complete = method("upload_complete", false);
  cb->upload_abort = method("upload_abort", false);
  const bool parts = !cb->upload_begin.is_none();
  if (parts && (cb->upload_part.is_none() || cb->upload_complete.is_none() || cb->upload_abort.is_none())) {
    throw py::type_error("a storage with upload_begin needs upload_part, upload_complete and upload_abort too");
  }
  uint64_t min_part_size = 0;
  if (parts) {
    py::object m = py::getattr(impl, "min_part_size", py::int_(0));
    min_part_size = m.is_none() ? 0 : m.cast<uint64_t>();
  }
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
  if (parts) {
    c.upload_begin = &t::UploadBegin;
    c.upload_part = &t::UploadPart;
    c.upload_complete = &t::UploadComplete;
    c.upload_abort = &t::UploadAbort;
    c.min_part_size = min_part_size;
  }
  c.user_data = cb.get();
  c.max_in_flight = max_in_flight;
  auto s = std::shared_ptr<Storage>(new Storage("callbacks"));
  Check(dckpt_storage_new_callbacks(&s->storage_, &c));
  s->callbacks_ = std::move(cb);
  return s;
}

Storage::~Storage() {
  // Only the caller's reference: readers and saves that use the storage hold this object too, so nothing runs on
  // it now, and freeing it calls no callback.
  dckpt_storage_free(storage_);
  if (callbacks_) {
    py::gil_scoped_acquire gil;  // the bound methods are Python objects
    callbacks_.reset();
  }
}

std::pair<std::string, py::object> Storage::FailuresSince(uint64_t since) const {
  if (!callbacks_) return {std::string(), py::none()};
  return callbacks_->Since(since);
}

uint64_t Storage::failures() const { return callbacks_ ? callbacks_->Failures() : 0; }

py::object Storage::impl() const { return callbacks_ ? callbacks_->impl : py::none(); }

namespace {

/// Raises for rc != OK with the storage's callback error attached.
void CheckStorage(int rc, const StorageCall& call, py::object cause = py::none()) {
  if (rc == DCKPT_OK) return;
  std::string message = dckpt_error_last();
  call.Annotate(message, cause);
  throw NativeError(rc, std::move(message), std::move(cause));
}

/// Collects the names or paths a dckpt_* call reports one by one.
struct NameList {
  std::vector<std::string> names;
};

int CollectName(const char* name, void* user) {
  static_cast<NameList*>(user)->names.emplace_back(name);
  return 0;
}

/// The storage a URL names ("s3://..." S3 from the environment, a plain path POSIX; any other scheme raises).
std::shared_ptr<Storage> OpenUrl(const std::string& url) {
  return Storage::Native("url", [&](dckpt_storage** out) { return dckpt_storage_open_url(out, url.c_str()); });
}

/// The names directly below `dir` (dckpt_storage_list_dir), in byte order.
std::vector<std::string> StorageList(std::shared_ptr<Storage> storage, const std::string& dir) {
  StorageCall call(storage);
  NameList found;
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_storage_list_dir(call.get(), dir.c_str(), &CollectName, &found);
  }
  CheckStorage(rc, call);
  return found.names;
}

/// A whole file (dckpt_storage_read_file): its size asked first, then read (again if it grew in between).
py::bytes StorageReadFile(std::shared_ptr<Storage> storage, const std::string& path) {
  StorageCall call(storage);
  std::string buf;
  int rc;
  for (int tries = 0;; ++tries) {
    uint64_t size = 0;
    {
      py::gil_scoped_release nogil;
      rc = dckpt_storage_read_file(&size, call.get(), path.c_str(), buf.empty() ? nullptr : &buf[0], buf.size());
    }
    if (rc == DCKPT_EBUFSIZE && tries < 3) {
      buf.resize(static_cast<size_t>(size) + (size == 0 ? 1 : 0));
      continue;
    }
    CheckStorage(rc, call);
    buf.resize(static_cast<size_t>(size));
    return py::bytes(buf);
  }
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
  NameList removed;
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_storage_remove_leftovers(call.get(), path.c_str(), grace_seconds, dry_run ? 1 : 0, &CollectName,
                                        &removed);
  }
  CheckStorage(rc, call);
  return removed.names;
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

py::dict Flatten(std::shared_ptr<Storage> storage, const std::string& src, const std::string& dst, bool overwrite) {
  StorageCall call(storage);
  dckpt_flatten_info info = DCKPT_FLATTEN_INFO_INIT;
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_flatten(&info, src.c_str(), dst.c_str(), overwrite ? 1 : 0, call.get());
  }
  CheckStorage(rc, call);
  py::dict d;
  d["bytes_copied"] = info.bytes_copied;
  d["bytes_from_bases"] = info.bytes_from_bases;
  d["num_files"] = info.num_files;
  return d;
}

}  // namespace

void RegisterStorage(py::module_& m) {
  py::class_<Storage, std::shared_ptr<Storage>>(m, "Storage")
      .def_static("posix", &Storage::Posix)
      .def_static("memory", &Storage::Memory)
      .def_static("callbacks", &Storage::Callbacks, py::arg("impl"), py::arg("max_in_flight") = 0,
                  "Storage through impl's methods create/write/sync/close/size/read/list/remove/commit and "
                  "upload_begin/upload_part/upload_complete/upload_abort (distckpt/storage.py describes them); sync, "
                  "commit and the upload_* methods may be missing or None.")
      .def_static("open_url", &OpenUrl, py::arg("url"),
                  "The storage a URL names: s3:// S3 configured from the AWS_* environment, a plain path POSIX.")
      .def_property_readonly("kind", &Storage::kind)
      .def_property_readonly("impl", &Storage::impl);
  m.def("storage_list", &StorageList, py::arg("storage").none(true), py::arg("dir"));
  m.def("storage_read_file", &StorageReadFile, py::arg("storage").none(true), py::arg("path"));
  m.def("storage_stat", &StorageStat, py::arg("storage").none(true), py::arg("path"), py::arg("grace_seconds"));
  m.def("storage_remove_leftovers", &StorageRemoveLeftovers, py::arg("storage").none(true), py::arg("path"),
        py::arg("grace_seconds"), py::arg("dry_run"));
  m.def("storage_remove_checkpoint", &StorageRemoveCheckpoint, py::arg("storage").none(true), py::arg("path"));
  m.def("flatten", &Flatten, py::arg("storage").none(true), py::arg("src"), py::arg("dst"), py::arg("overwrite"));
}

}  // namespace distckpt_python
