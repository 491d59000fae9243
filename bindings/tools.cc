// distckpt._distckpt.export_safetensors (collective with a Comm), scan_leftovers, remove_leftover: the offline tools of
// the C ABI.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings/binding_util.h"
#include "bindings/calls.h"
#include "bindings/comm.h"
#include "bindings/register.h"
#include "bindings/storage.h"

namespace distckpt_python {
namespace {

void ExportSafetensors(const std::string& ckpt_path, const std::string& out_dir, uint64_t max_shard_bytes,
                       std::optional<std::string> prefix, bool verify, py::object progress,
                       std::shared_ptr<Storage> storage, std::shared_ptr<Storage> out_storage,
                       const std::vector<std::pair<std::string, std::string>>& rename_rules, uint64_t buffer_bytes,
                       unsigned io_threads, std::shared_ptr<Comm> comm, uint64_t timeout_ms) {
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
  // The rules are handed to the core as they are: the core compiles, checks and applies them.
  std::vector<dckpt_rename_rule> rules;
  for (const auto& [pattern, replacement] : rename_rules) rules.push_back({pattern.c_str(), replacement.c_str()});
  o.rename_rules = rules.data();
  o.num_rename_rules = rules.size();
  o.buffer_bytes = buffer_bytes;
  o.io_threads = io_threads;
  o.timeout_ms = timeout_ms;
  Comm::Use use(comm);
  dckpt_comm* c = use.get();
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_export_safetensors_collective(ckpt_path.c_str(), out_dir.c_str(), c, &o);
  }
  if (rc == DCKPT_OK) return;
  std::string message = dckpt_error_last();
  py::object cause = prog ? prog->errors.Take() : py::none();
  if (comm) {
    py::object comm_cause = comm->errors()->Take();
    if (cause.is_none()) cause = comm_cause;
  }
  in_call.Annotate(message, cause);
  if (out_call.storage() != in_call.storage()) out_call.Annotate(message, cause);
  throw NativeError(rc, std::move(message), std::move(cause));
}

// One dckpt_leftover_info, copied: its strings are valid during the callback only.
struct Leftover {
  std::string path, name, final_name, writer_host, writer_started_utc, reason;
  int kind, writer, garbage;
  uint64_t bytes;
  double idle_seconds;
  int64_t writer_pid;
};

int CollectLeftover(const dckpt_leftover_info* l, void* user) {  // runs without the GIL: no Python objects here
  static_cast<std::vector<Leftover>*>(user)->push_back(Leftover{l->path, l->name, l->final_name, l->writer_host,
                                                                l->writer_started_utc, l->reason, l->kind, l->writer,
                                                                l->garbage, l->bytes, l->idle_seconds, l->writer_pid});
  return 0;
}

/// The leftovers of the rename layout directly in `dir` (of `final_name` only, if given): one dict each.
py::list ScanLeftovers(const std::string& dir, std::optional<std::string> final_name, double grace_seconds) {
  std::vector<Leftover> found;
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_scan_leftovers(dir.c_str(), final_name ? final_name->c_str() : nullptr, grace_seconds, &CollectLeftover,
                              &found);
  }
  Check(rc);
  static const char* const kinds[] = {"unknown", "staging", "complete-unrenamed", "replaced", "deleting"};
  static const char* const writers[] = {"unknown", "running", "exited"};
  py::list out;
  for (const Leftover& l : found) {
    py::dict d;
    d["path"] = l.path;
    d["name"] = l.name;
    d["final_name"] = l.final_name;
    d["kind"] = l.kind >= 1 && l.kind <= 4 ? kinds[l.kind] : kinds[0];
    d["bytes"] = l.bytes;
    d["idle_seconds"] = l.idle_seconds;
    d["writer"] = l.writer >= 0 && l.writer <= 2 ? writers[l.writer] : writers[0];
    d["writer_pid"] = l.writer_pid > 0 ? py::object(py::int_(l.writer_pid)) : py::object(py::none());
    d["writer_host"] = l.writer_host;
    d["writer_started_utc"] = l.writer_started_utc;
    d["garbage"] = l.garbage != 0;
    d["reason"] = l.reason;
    out.append(d);
  }
  return out;
}

void RemoveLeftover(const std::string& path, double grace_seconds) {
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_remove_leftover(path.c_str(), grace_seconds);
  }
  Check(rc);
}

int KeepText(const char* text, size_t size, void* user) {
  static_cast<std::string*>(user)->assign(text, size);
  return 0;
}

int KeepPath(const char* path, void* user) {
  static_cast<std::vector<std::string>*>(user)->emplace_back(path);
  return 0;
}

/// The core's JSON document of a manager's local tier (dckpt_tiers_describe).
std::string TiersDescribe(const std::string& dir) {
  std::string json;
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_tiers_describe(dir.c_str(), &KeepText, &json);
  }
  Check(rc);
  return json;
}

/// The paths removed (or, with dry_run, that would be) by dckpt_tiers_prune_abandoned.
std::vector<std::string> TiersPruneAbandoned(const std::string& dir, bool dry_run) {
  std::vector<std::string> removed;
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = dckpt_tiers_prune_abandoned(dir.c_str(), dry_run ? 1 : 0, &KeepPath, &removed);
  }
  Check(rc);
  return removed;
}

}  // namespace

void RegisterTools(py::module_& m) {
  m.def("tiers_describe", &TiersDescribe, py::arg("dir"));
  m.def("tiers_prune_abandoned", &TiersPruneAbandoned, py::arg("dir"), py::arg("dry_run"));
  m.def("scan_leftovers", &ScanLeftovers, py::arg("root"), py::arg("final_name").none(true), py::arg("grace_seconds"));
  m.def("remove_leftover", &RemoveLeftover, py::arg("path"), py::arg("grace_seconds"));
  m.def("export_safetensors", &ExportSafetensors, py::arg("ckpt_path"), py::arg("out_dir"), py::arg("max_shard_bytes"),
        py::arg("prefix"), py::arg("verify"), py::arg("progress"), py::arg("storage").none(true) = nullptr,
        py::arg("out_storage").none(true) = nullptr,
        py::arg("rename_rules") = std::vector<std::pair<std::string, std::string>>(), py::arg("buffer_bytes") = 0,
        py::arg("io_threads") = 0, py::arg("comm").none(true) = nullptr, py::arg("timeout_ms") = 0);
}

}  // namespace distckpt_python
