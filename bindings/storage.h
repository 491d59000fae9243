// Internal to the extension module: the storage bound as distckpt._distckpt.Storage (POSIX, in memory, S3 (s3.cc),
// a URL's, or a Python object's methods), and StorageCall, which lets a failed call name the exception a storage
// callback raised.
#ifndef DISTCKPT_BINDINGS_STORAGE_H_
#define DISTCKPT_BINDINGS_STORAGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "bindings/binding_util.h"

namespace distckpt_python {

struct PyStorageCallbacks;  // storage.cc

/// A dckpt_storage: POSIX, in memory, S3, a URL's, or a Python object's methods (see distckpt/storage.py for the
/// protocol).
class Storage {
 public:
  /// A storage the core makes itself: `make` (a dckpt_storage_new_* call) runs without the GIL; a failure raises.
  static std::shared_ptr<Storage> Native(std::string kind, const std::function<int(dckpt_storage**)>& make);
  static std::shared_ptr<Storage> Posix();
  static std::shared_ptr<Storage> Memory();
  static std::shared_ptr<Storage> Callbacks(const py::object& impl, unsigned max_in_flight);

  ~Storage();

  dckpt_storage* get() const { return storage_; }
  const std::string& kind() const { return kind_; }
  uint64_t failures() const;
  std::pair<std::string, py::object> FailuresSince(uint64_t since) const;
  py::object impl() const;

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
  explicit StorageCall(std::shared_ptr<Storage> s)
      : storage_(std::move(s)), start_(storage_ ? storage_->failures() : 0) {}
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

}  // namespace distckpt_python

#endif  // DISTCKPT_BINDINGS_STORAGE_H_
