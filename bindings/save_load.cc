// distckpt._distckpt.save, save_async (and the SaveFuture it returns) and load: one call each into the C ABI,
// with the GIL released, progress reported through calls.h and errors raised with a callback's exception as cause.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "bindings/binding_util.h"
#include "bindings/calls.h"
#include "bindings/comm.h"
#include "bindings/register.h"
#include "bindings/state.h"
#include "bindings/storage.h"

namespace distckpt_python {
namespace {

py::dict SaveInfoDict(const dckpt_save_info& info) {
  py::dict d;
  d["num_files"] = info.num_files;
  d["num_entries"] = info.num_entries;
  d["bytes_written"] = info.bytes_written;
  d["total_bytes"] = info.total_bytes;
  d["metadata_bytes"] = info.metadata_bytes;
  d["seconds"] = info.seconds;
  d["bytes_reused"] = info.bytes_reused;
  return d;
}

dckpt_save_options SaveOptions(unsigned io_threads, bool overwrite, bool sync, uint64_t checksum_block_size,
                               uint64_t timeout_ms, Progress* progress, const std::string& base, unsigned full_every,
                               int compression, int compression_level) {
  dckpt_save_options o;
  Check(dckpt_save_options_init(&o, DCKPT_SAVE_OPTIONS_VERSION));
  o.io_threads = io_threads;
  o.overwrite = overwrite ? 1 : 0;
  o.sync = sync ? 1 : 0;
  o.checksum_block_size = checksum_block_size;
  o.timeout_ms = timeout_ms;
  o.base = base.empty() ? nullptr : base.c_str();  // `base` outlives the call
  o.full_every = full_every;
  o.compression = compression;
  o.compression_level = compression_level;
  if (progress) {
    o.progress = &ProgressTrampoline;
    o.progress_user_data = progress;
  }
  return o;
}

py::dict Save(const std::string& path, State& state, std::shared_ptr<Comm> comm, unsigned io_threads, bool overwrite,
              bool sync, uint64_t checksum_block_size, uint64_t timeout_ms, py::object progress,
              std::shared_ptr<Storage> storage, const std::string& base, unsigned full_every, int compression,
              int compression_level) {
  auto prog = MakeProgress(progress);
  dckpt_save_options o = SaveOptions(io_threads, overwrite, sync, checksum_block_size, timeout_ms, prog.get(), base,
                                     full_every, compression, compression_level);
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
                                      std::shared_ptr<Storage> storage, const std::string& base, unsigned full_every,
                                      int compression, int compression_level) {
  auto prog = MakeProgress(progress);
  dckpt_save_options o = SaveOptions(io_threads, overwrite, sync, checksum_block_size, timeout_ms, prog.get(), base,
                                     full_every, compression, compression_level);
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

}  // namespace

void RegisterSaveFuture(py::module_& m) {
  py::class_<SaveFuture>(m, "SaveFuture")
      .def("wait", &SaveFuture::Wait, py::arg("timeout_ms"))
      .def("done", &SaveFuture::Done)
      .def("staging", &SaveFuture::Staging)
      .def("snapshot", &SaveFuture::Snapshot)
      .def("free", &SaveFuture::Free);
}

void RegisterSaveLoad(py::module_& m) {
  m.def("save", &Save, py::arg("path"), py::arg("state"), py::arg("comm").none(true), py::arg("io_threads"),
        py::arg("overwrite"), py::arg("sync"), py::arg("checksum_block_size"), py::arg("timeout_ms"),
        py::arg("progress"), py::arg("storage").none(true) = nullptr, py::arg("base") = std::string(),
        py::arg("full_every") = 0u, py::arg("compression") = 0, py::arg("compression_level") = 0);
  m.def("save_async", &SaveAsync, py::arg("path"), py::arg("state"), py::arg("comm").none(true), py::arg("io_threads"),
        py::arg("overwrite"), py::arg("sync"), py::arg("checksum_block_size"), py::arg("timeout_ms"),
        py::arg("progress"), py::arg("device_snapshot") = false, py::arg("storage").none(true) = nullptr,
        py::arg("base") = std::string(), py::arg("full_every") = 0u, py::arg("compression") = 0,
        py::arg("compression_level") = 0);
  m.def("load", &Load, py::arg("path"), py::arg("state"), py::arg("comm").none(true), py::arg("verify"),
        py::arg("io_threads"), py::arg("timeout_ms"), py::arg("progress"), py::arg("map_files") = true,
        py::arg("share_verification") = true, py::arg("storage").none(true) = nullptr);
}

}  // namespace distckpt_python
