// The helpers every call into distckpt shares (calls.h): progress callbacks, read options, I/O statistics and
// raising a failed call's error.
#include "bindings/calls.h"

#include <string>
#include <utility>

namespace distckpt_python {

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
  d["bytes_read_direct"] = s.bytes_read_direct;
  return d;
}

dckpt_read_options ReadOptions(bool verify, unsigned io_threads, uint64_t timeout_ms, Progress* progress,
                               bool map_files, bool share_verification) {
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

void CheckCall(int rc, Progress* progress, const std::shared_ptr<Comm>& comm, const StorageCall* storage,
               std::optional<uint64_t> since) {
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

}  // namespace distckpt_python
