// distckpt._distckpt.Manager: the checkpoint manager (dckpt_manager_*): a checkpoint every step, kept in tiers
// (node-local, replicas on other nodes, persistent storage) and restored from the newest step that verifies in one.
// One call into the C ABI per method, with the GIL released; the manager's background thread may run Python
// (external-communicator and storage callbacks), so every call that can wait for it lets go of the GIL first.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
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

/// One rank's manager. Owns the communicator's use (its collectives run on the manager's thread) and the persistent
/// storage until closed. The C handle takes one call at a time: calls from several Python threads are serialised
/// here.
class Manager {
 public:
  static std::unique_ptr<Manager> New(std::shared_ptr<Comm> comm, std::optional<std::string> local_dir,
                                      std::optional<std::string> job, std::optional<std::string> node_id,
                                      unsigned replicas, std::optional<std::string> persistent_path,
                                      std::shared_ptr<Storage> persistent_storage, uint64_t persist_every,
                                      unsigned keep_local, unsigned keep_persistent, uint64_t local_budget_bytes,
                                      uint64_t timeout_ms, bool device_snapshot, uint64_t exchange_round_bytes,
                                      unsigned threads, int background_priority, int persist_compression,
                                      int persist_compression_level, bool persist_incremental,
                                      unsigned persist_full_every) {
    dckpt_manager_options o;
    Check(dckpt_manager_options_init(&o, DCKPT_MANAGER_OPTIONS_VERSION));
    o.local_dir = local_dir ? local_dir->c_str() : nullptr;
    o.job = job ? job->c_str() : nullptr;
    o.node_id = node_id ? node_id->c_str() : nullptr;
    o.replicas = replicas;
    o.persistent_path = persistent_path ? persistent_path->c_str() : nullptr;
    auto storage = std::make_unique<StorageCall>(std::move(persistent_storage));
    o.persistent_storage = storage->get();
    o.persist_every = persist_every;
    o.keep_local = keep_local;
    o.keep_persistent = keep_persistent;
    o.local_budget_bytes = local_budget_bytes;
    o.timeout_ms = timeout_ms;
    o.device_snapshot = device_snapshot ? 1 : 0;
    o.exchange_round_bytes = exchange_round_bytes;
    o.threads = threads;
    o.background_priority = background_priority;
    o.persist_compression = persist_compression;
    o.persist_compression_level = persist_compression_level;
    o.persist_incremental = persist_incremental ? 1 : 0;
    o.persist_full_every = persist_full_every;
    auto use = std::make_unique<Comm::Use>(comm);
    dckpt_comm* c = use->get();
    dckpt_manager* m = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;  // collective: the ranks learn each other's nodes
      rc = dckpt_manager_new(&m, c, &o);
    }
    CheckCall(rc, nullptr, comm, storage.get());
    return std::unique_ptr<Manager>(new Manager(m, std::move(comm), std::move(use), std::move(storage)));
  }

  ~Manager() { Close(); }

  /// Returns once `state` is staged; raises the error of earlier background work.
  void Save(uint64_t step, State& state, bool persist) {
    Call([&](dckpt_manager* m) { return dckpt_manager_save(m, step, state.get(), persist ? 1 : 0); });
  }

  /// Raises the first background error since the last wait, or distckpt.TimeoutError after timeout_ms.
  void Wait(uint64_t timeout_ms) {
    Call([&](dckpt_manager* m) { return dckpt_manager_wait(m, timeout_ms); });
  }

  std::optional<uint64_t> LatestStep() {
    uint64_t step = 0;
    int found = 0;
    Call([&](dckpt_manager* m) { return dckpt_manager_latest_step(&step, &found, m); });
    return found ? std::optional<uint64_t>(step) : std::nullopt;
  }

  /// Collective. Fills `state`; returns dckpt_restore_info as a dict plus the report ("report").
  py::dict Restore(State& state, bool fallback, bool use_persistent) {
    dckpt_restore_options o;
    Check(dckpt_restore_options_init(&o, DCKPT_RESTORE_OPTIONS_VERSION));
    o.fallback = fallback ? 1 : 0;
    o.use_persistent = use_persistent ? 1 : 0;
    dckpt_restore_info info = DCKPT_RESTORE_INFO_INIT;
    std::string report;
    // Taken under the same lock as the restore: it is valid only until the next call on the manager.
    Call([&](dckpt_manager* m) {
      int rc = dckpt_manager_restore(&info, m, state.get(), &o);
      const char* text = dckpt_manager_restore_report(m);
      report = text ? text : "";
      return rc;
    });
    py::dict d;
    d["found"] = info.found != 0;
    d["step"] = info.step;
    d["tier"] = info.tier;
    d["bytes_local"] = info.bytes_local;
    d["bytes_from_peers"] = info.bytes_from_peers;
    d["bytes_from_persistent"] = info.bytes_from_persistent;
    d["seconds"] = info.seconds;
    d["copies_made"] = info.copies_made;
    d["report"] = report;
    return d;
  }

  /// dckpt_manager_stats as a dict. Not serialised with the other calls (it may run while a save waits, from a
  /// monitoring thread): only against Close, which frees the handle.
  py::dict Stats() {
    dckpt_manager_counters st = DCKPT_MANAGER_COUNTERS_INIT;
    int rc;
    std::string message;
    {
      py::gil_scoped_release nogil;
      std::shared_lock<std::shared_mutex> alive(alive_);
      rc = Invoke([&](dckpt_manager* m) { return dckpt_manager_stats(&st, m); }, &message);
    }
    if (rc != DCKPT_OK) throw NativeError(rc, std::move(message));
    py::dict d;
    d["steps_saved"] = st.steps_saved;
    d["steps_completed"] = st.steps_completed;
    d["steps_failed"] = st.steps_failed;
    d["saves_waited"] = st.saves_waited;
    d["saves_waited_for_budget"] = st.saves_waited_for_budget;
    d["wait_seconds"] = st.wait_seconds;
    d["max_wait_seconds"] = st.max_wait_seconds;
    d["bytes_written"] = st.bytes_written;
    d["bytes_replicated"] = st.bytes_replicated;
    d["bytes_persisted"] = st.bytes_persisted;
    d["bytes_persist_reused"] = st.bytes_persist_reused;
    d["persist_seconds"] = st.persist_seconds;
    return d;
  }

  /// What the last restore did (dckpt_manager_restore_report).
  std::string RestoreReport() {
    std::string report;
    Call([&](dckpt_manager* m) {
      const char* text = dckpt_manager_restore_report(m);
      report = text ? text : "";
      return DCKPT_OK;
    });
    return report;
  }

  /// Waits for the background work (its errors are lost: wait first to see them), then frees everything.
  void Close() {
    if (closed_) return;
    {
      py::gil_scoped_release nogil;  // the background work may need the GIL for its callbacks
      std::lock_guard<std::mutex> lock(mu_);
      std::unique_lock<std::shared_mutex> alive(alive_);  // no Stats() call is reading the handle
      dckpt_manager_free(manager_);
      manager_ = nullptr;
    }
    closed_ = true;  // with the GIL: another Python thread in Close() waits on mu_ and then finds nothing to free
    use_.reset();
    comm_.reset();
    storage_.reset();
  }

  bool closed() const { return closed_; }

 private:
  Manager(dckpt_manager* m, std::shared_ptr<Comm> comm, std::unique_ptr<Comm::Use> use,
          std::unique_ptr<StorageCall> storage)
      : manager_(m), comm_(std::move(comm)), use_(std::move(use)), storage_(std::move(storage)) {
    mark_ = storage_->Mark();
  }

  /// `fn(manager_)`, under a lock the caller holds that keeps manager_ alive; on failure *message is the core's
  /// message, taken on this thread before anything else calls the core.
  template <typename Fn>
  int Invoke(Fn&& fn, std::string* message) {
    if (manager_ == nullptr) {
      *message = "the checkpoint manager is closed";
      return DCKPT_ESTATE;
    }
    const int rc = fn(manager_);
    if (rc != DCKPT_OK) *message = dckpt_error_last();
    return rc;
  }

  /// Runs `fn(manager)` without the GIL, one call at a time, and raises a failure with what a callback left behind
  /// (the communicator's exception, or a storage callback's since the previous call: background work fails late).
  template <typename Fn>
  void Call(Fn&& fn) {
    if (closed_) throw NativeError(DCKPT_ESTATE, "the checkpoint manager is closed");
    int rc;
    std::string message;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      rc = Invoke(fn, &message);
    }
    const uint64_t since = mark_;
    mark_ = storage_ ? storage_->Mark() : 0;
    if (rc == DCKPT_OK) return;
    py::object cause = comm_ ? comm_->errors()->Take() : py::none();
    if (storage_) storage_->Annotate(message, cause, since);
    throw NativeError(rc, std::move(message), std::move(cause));
  }

  std::mutex mu_;            // one call at a time on manager_ (taken without the GIL)
  std::shared_mutex alive_;  // Stats() (shared) against Close() (exclusive, under mu_), without the GIL
  dckpt_manager* manager_;
  bool closed_ = false;  // read and written with the GIL held
  std::shared_ptr<Comm> comm_;
  std::unique_ptr<Comm::Use> use_;        // the communicator belongs to the manager until it is closed
  std::unique_ptr<StorageCall> storage_;  // the persistent storage's callbacks must outlive the background work
  uint64_t mark_ = 0;                     // storage failures seen before the current call
};

}  // namespace

void RegisterManager(py::module_& m) {
  py::dict tiers;
#define DCKPT_PY_TIER(x) tiers[#x] = static_cast<int>(DCKPT_TIER_##x)
  DCKPT_PY_TIER(NONE);
  DCKPT_PY_TIER(LOCAL);
  DCKPT_PY_TIER(PEER);
  DCKPT_PY_TIER(PERSISTENT);
#undef DCKPT_PY_TIER
  m.attr("TIERS") = tiers;
  py::dict priorities;
#define DCKPT_PY_PRIORITY(x) priorities[#x] = static_cast<int>(DCKPT_PRIORITY_##x)
  DCKPT_PY_PRIORITY(DEFAULT);
  DCKPT_PY_PRIORITY(NORMAL);
  DCKPT_PY_PRIORITY(LOW);
  DCKPT_PY_PRIORITY(IDLE);
#undef DCKPT_PY_PRIORITY
  m.attr("PRIORITIES") = priorities;

  py::class_<Manager>(m, "Manager")
      .def_static("new", &Manager::New, py::arg("comm").none(true), py::arg("local_dir").none(true),
                  py::arg("job").none(true), py::arg("node_id").none(true), py::arg("replicas"),
                  py::arg("persistent_path").none(true), py::arg("persistent_storage").none(true),
                  py::arg("persist_every"), py::arg("keep_local"), py::arg("keep_persistent"),
                  py::arg("local_budget_bytes"), py::arg("timeout_ms"), py::arg("device_snapshot"),
                  py::arg("exchange_round_bytes"), py::arg("threads"), py::arg("background_priority"),
                  py::arg("persist_compression"), py::arg("persist_compression_level"), py::arg("persist_incremental"),
                  py::arg("persist_full_every"))
      .def("save", &Manager::Save, py::arg("step"), py::arg("state"), py::arg("persist"))
      .def("wait", &Manager::Wait, py::arg("timeout_ms"))
      .def("latest_step", &Manager::LatestStep)
      .def("restore", &Manager::Restore, py::arg("state"), py::arg("fallback"), py::arg("use_persistent"))
      .def("restore_report", &Manager::RestoreReport)
      .def("stats", &Manager::Stats)
      .def("close", &Manager::Close)
      .def_property_readonly("closed", &Manager::closed);
}

}  // namespace distckpt_python
