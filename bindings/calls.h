// Internal to the extension module: what the calls into distckpt (save, load, reader, tools) share. Progress
// callbacks, read options and I/O statistics converted from and to Python, and raising a failed call's error with
// the exception a callback (progress, communicator, storage) left behind.
#ifndef DISTCKPT_BINDINGS_CALLS_H_
#define DISTCKPT_BINDINGS_CALLS_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "bindings/binding_util.h"
#include "bindings/comm.h"
#include "bindings/storage.h"

namespace distckpt_python {

// ---- Progress callbacks ---------------------------------------------------------------------------------------

struct Progress {
  py::object fn;  // callable(done, total) or None
  CallbackErrors errors;
};

/// dckpt progress callback; user_data is a Progress. Keeps what the callable raised and returns non-zero.
int ProgressTrampoline(uint64_t done, uint64_t total, void* user_data);

/// A Progress for `fn`, or nullptr when it is None; TypeError when it is not callable.
std::shared_ptr<Progress> MakeProgress(const py::object& fn);

// ---- Options, statistics, errors ------------------------------------------------------------------------------

py::dict IoStatsDict(const dckpt_io_stats& s);

dckpt_read_options ReadOptions(bool verify, unsigned io_threads, uint64_t timeout_ms, Progress* progress,
                               bool map_files = true, bool share_verification = true);

/// Raises for a failed collective call, preferring an exception a callback raised (progress first, then comm, then
/// storage); the text of an exception a storage callback raised during the call is appended to the message.
/// `since`: a StorageCall::Mark() where the call started, when it started after the StorageCall was made.
void CheckCall(int rc, Progress* progress, const std::shared_ptr<Comm>& comm, const StorageCall* storage = nullptr,
               std::optional<uint64_t> since = std::nullopt);

}  // namespace distckpt_python

#endif  // DISTCKPT_BINDINGS_CALLS_H_
