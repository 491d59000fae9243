// The storage part of the C ABI: dckpt_storage handles (POSIX, in-memory, host callbacks), and the prune of the
// metadata-last layout.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/capi_internal.h"
#include "capi/include/distckpt/distckpt.h"
#include "core/storage/object/object_storage.h"
#include "core/storage/s3/s3_storage.h"
#include "core/storage/url/url_storage.h"
#include "core/tools/leftovers.h"
#include "core/tools/rename_leftovers.h"

struct dckpt_storage_list {
  std::vector<std::string> names;
};

namespace distckpt {
namespace capi {
namespace {

// A callback's return value as a Status: its own DCKPT_E* code, or kUser for anything else non-zero.
Status FromCallback(int rc, const char* callback) {
  if (rc == 0) return OkStatus();
  const bool known = rc < 0 && rc >= DCKPT_EINTERNAL;
  const StatusCode code = known ? static_cast<StatusCode>(rc) : StatusCode::kUser;
  return Status(code, std::string("the storage's ") + callback + " callback returned " + std::to_string(rc) +
                          (known ? std::string(" (") + StatusCodeName(code) + ")" : std::string()));
}

class CallbackUpload final : public ObjectUpload {
 public:
  CallbackUpload(const dckpt_storage_callbacks& cb, dckpt_storage_file* file) : cb_(cb), file_(file) {}
  ~CallbackUpload() override {
    if (!closed_) (void)cb_.close(file_, 0, 1, cb_.user_data);
  }
  Status Write(uint64_t offset, const void* data, size_t size) override {
    return FromCallback(cb_.write(file_, offset, data, size, cb_.user_data), "write");
  }
  Status Sync() override { return cb_.sync ? FromCallback(cb_.sync(file_, cb_.user_data), "sync") : OkStatus(); }
  Status Close(uint64_t size, bool discard) override {
    closed_ = true;
    return FromCallback(cb_.close(file_, size, discard ? 1 : 0, cb_.user_data), "close");
  }

 private:
  const dckpt_storage_callbacks& cb_;
  dckpt_storage_file* const file_;
  bool closed_ = false;
};

// A multipart upload through upload_part/upload_complete/upload_abort (version 2).
class CallbackPartUpload final : public ObjectPartUpload {
 public:
  CallbackPartUpload(const dckpt_storage_callbacks& cb, dckpt_upload* upload) : cb_(cb), upload_(upload) {}
  ~CallbackPartUpload() override {
    if (!finished_) (void)cb_.upload_abort(upload_, cb_.user_data);
  }
  Status UploadPart(unsigned number, const void* data, size_t size) override {
    return FromCallback(cb_.upload_part(upload_, number, data, size, cb_.user_data), "upload_part");
  }
  Status Complete() override {
    finished_ = true;
    return FromCallback(cb_.upload_complete(upload_, cb_.user_data), "upload_complete");
  }
  Status Abort() override {
    finished_ = true;
    return FromCallback(cb_.upload_abort(upload_, cb_.user_data), "upload_abort");
  }

 private:
  const dckpt_storage_callbacks& cb_;
  dckpt_upload* const upload_;
  bool finished_ = false;
};

class CallbackClient final : public ObjectClient {
 public:
  explicit CallbackClient(const dckpt_storage_callbacks& cb) : cb_(cb) {}
  // Everything that used the storage holds this client: the host may let go of user_data now.
  ~CallbackClient() override {
    if (cb_.release != nullptr) cb_.release(cb_.user_data);
  }
  std::string name() const override { return "callback"; }
  bool has_parts() const override { return cb_.upload_begin != nullptr; }
  uint64_t min_part_size() const override { return cb_.min_part_size; }
  Result<std::unique_ptr<ObjectPartUpload>> BeginParts(const std::string& path, uint64_t size_hint) override {
    dckpt_upload* upload = nullptr;
    DCKPT_RETURN_IF_ERROR(
        FromCallback(cb_.upload_begin(&upload, path.c_str(), size_hint, cb_.user_data), "upload_begin"));
    return std::unique_ptr<ObjectPartUpload>(new CallbackPartUpload(cb_, upload));
  }
  Result<std::unique_ptr<ObjectUpload>> Create(const std::string& path, uint64_t size_hint) override {
    dckpt_storage_file* file = nullptr;
    DCKPT_RETURN_IF_ERROR(FromCallback(cb_.create(&file, path.c_str(), size_hint, cb_.user_data), "create"));
    return std::unique_ptr<ObjectUpload>(new CallbackUpload(cb_, file));
  }
  Result<uint64_t> Size(const std::string& path) override {
    uint64_t size = 0;
    DCKPT_RETURN_IF_ERROR(FromCallback(cb_.size(&size, path.c_str(), cb_.user_data), "size"));
    return size;
  }
  Result<size_t> Read(const std::string& path, uint64_t offset, void* data, size_t size) override {
    size_t got = 0;
    DCKPT_RETURN_IF_ERROR(FromCallback(cb_.read(&got, path.c_str(), offset, data, size, cb_.user_data), "read"));
    return got;
  }
  Result<std::vector<std::string>> List(const std::string& dir) override {
    dckpt_storage_list list;
    DCKPT_RETURN_IF_ERROR(FromCallback(cb_.list(&list, dir.c_str(), cb_.user_data), "list"));
    return std::move(list.names);
  }
  Status Remove(const std::string& path) override {
    return FromCallback(cb_.remove(path.c_str(), cb_.user_data), "remove");
  }
  Status Commit(const std::string& path, const std::string& data, bool replace) override {
    if (cb_.commit == nullptr) return Unsupported("no commit callback");
    return FromCallback(cb_.commit(path.c_str(), data.data(), data.size(), replace ? 1 : 0, cb_.user_data), "commit");
  }

 private:
  const dckpt_storage_callbacks cb_;
};

// The bytes of a dckpt_storage_callbacks of `version` (a caller built against an older header has a shorter struct).
size_t CallbacksSize(unsigned version) {
  return version >= 2 ? sizeof(dckpt_storage_callbacks) : offsetof(dckpt_storage_callbacks, upload_begin);
}

Result<std::chrono::seconds> Grace(double seconds) {
  if (!(seconds >= 0) || seconds > 1e12) {
    return InvalidArgument("grace_seconds = " + std::to_string(seconds) + " must be a number >= 0");
  }
  return std::chrono::seconds(static_cast<int64_t>(std::ceil(seconds)));
}

}  // namespace

Result<std::shared_ptr<Storage>> StorageForCall(std::shared_ptr<Storage> given, const char* path) {
  if (given != nullptr) return given;
  return StorageForUrl(path);
}

Result<std::shared_ptr<Storage>> StorageOrUrl(dckpt_storage* storage, const char* path) {
  DCKPT_ASSIGN_OR_RETURN(std::shared_ptr<Storage> s, StorageForCall(storage ? storage->storage : nullptr, path));
  if (s != nullptr) return s;
  return std::shared_ptr<Storage>(std::shared_ptr<Storage>(), DefaultStorage());  // not owned: process-wide
}

}  // namespace capi
}  // namespace distckpt

using distckpt::capi::NotNull;
using distckpt::capi::Report;

extern "C" {

int dckpt_storage_callbacks_init(dckpt_storage_callbacks* callbacks, unsigned version) {
  return distckpt::capi::InitVersioned<dckpt_storage_callbacks>(
      callbacks, "callbacks", DCKPT_STORAGE_CALLBACKS_INIT, version, DCKPT_STORAGE_CALLBACKS_VERSION,
      "dckpt_storage_callbacks", distckpt::capi::CallbacksSize(version));
}

int dckpt_storage_new_callbacks(dckpt_storage** out, const dckpt_storage_callbacks* callbacks) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = nullptr;
    DCKPT_RETURN_IF_FAILED(NotNull(callbacks, "callbacks"));
    DCKPT_RETURN_IF_FAILED(distckpt::capi::CheckVersion(callbacks->version, DCKPT_STORAGE_CALLBACKS_VERSION,
                                                        "dckpt_storage_callbacks"));
    const std::pair<const void*, const char*> required[] = {
        {reinterpret_cast<const void*>(callbacks->create), "callbacks->create"},
        {reinterpret_cast<const void*>(callbacks->write), "callbacks->write"},
        {reinterpret_cast<const void*>(callbacks->close), "callbacks->close"},
        {reinterpret_cast<const void*>(callbacks->size), "callbacks->size"},
        {reinterpret_cast<const void*>(callbacks->read), "callbacks->read"},
        {reinterpret_cast<const void*>(callbacks->list), "callbacks->list"},
        {reinterpret_cast<const void*>(callbacks->remove), "callbacks->remove"}};
    for (const auto& [fn, what] : required) DCKPT_RETURN_IF_FAILED(NotNull(fn, what));
    // Only the fields the caller's version has; the later ones keep their defaults.
    dckpt_storage_callbacks cb = DCKPT_STORAGE_CALLBACKS_INIT;
    std::memcpy(&cb, callbacks, distckpt::capi::CallbacksSize(callbacks->version));
    const bool any_upload = cb.upload_begin || cb.upload_part || cb.upload_complete || cb.upload_abort;
    const bool all_upload = cb.upload_begin && cb.upload_part && cb.upload_complete && cb.upload_abort;
    if (any_upload && !all_upload) {
      return Report(distckpt::InvalidArgument(
          "dckpt_storage_callbacks: upload_begin, upload_part, upload_complete and upload_abort go together (set all "
          "four for multipart uploads, or none)"));
    }
    distckpt::ObjectStorageOptions o;
    o.max_in_flight = cb.max_in_flight;
    *out = new dckpt_storage{
        distckpt::NewObjectStorage(std::make_shared<distckpt::capi::CallbackClient>(cb), o)};
    return DCKPT_OK;
  })
}

int dckpt_storage_new_posix(dckpt_storage** out) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = new dckpt_storage{distckpt::NewPosixStorage()};
    return DCKPT_OK;
  })
}

int dckpt_storage_new_memory(dckpt_storage** out) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = new dckpt_storage{distckpt::NewObjectStorage(distckpt::NewMemoryObjectClient())};
    return DCKPT_OK;
  })
}

void dckpt_storage_free(dckpt_storage* storage) {
  try {
    delete storage;
  } catch (...) {
  }
}

int dckpt_s3_options_init(dckpt_s3_options* options, unsigned version) {
  return distckpt::capi::InitVersioned<dckpt_s3_options>(options, "options", DCKPT_S3_OPTIONS_INIT, version,
                                                         DCKPT_S3_OPTIONS_VERSION, "dckpt_s3_options",
                                                         sizeof(dckpt_s3_options));
}

int dckpt_storage_new_s3(dckpt_storage** out, const dckpt_s3_options* options) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = nullptr;
    distckpt::s3::S3Config c;
    if (options != nullptr) {
      DCKPT_RETURN_IF_FAILED(
          distckpt::capi::CheckVersion(options->version, DCKPT_S3_OPTIONS_VERSION, "dckpt_s3_options"));
      auto str = [](const char* s) { return s != nullptr ? std::string(s) : std::string(); };
      c.endpoint = str(options->endpoint);
      c.region = str(options->region);
      c.access_key_id = str(options->access_key_id);
      c.secret_access_key = str(options->secret_access_key);
      c.session_token = str(options->session_token);
      switch (options->addressing) {
        case DCKPT_S3_ADDRESSING_AUTO: c.addressing = distckpt::s3::Addressing::kAuto; break;
        case DCKPT_S3_ADDRESSING_PATH: c.addressing = distckpt::s3::Addressing::kPath; break;
        case DCKPT_S3_ADDRESSING_VIRTUAL: c.addressing = distckpt::s3::Addressing::kVirtual; break;
        default:
          return Report(distckpt::InvalidArgument("dckpt_s3_options.addressing = " +
                                                  std::to_string(options->addressing) +
                                                  " is not a dckpt_s3_addressing"));
      }
      if (!(options->request_timeout_seconds >= 0)) {
        return Report(distckpt::InvalidArgument("dckpt_s3_options.request_timeout_seconds must be >= 0"));
      }
      c.max_in_flight = options->max_in_flight;
      c.max_attempts = options->max_attempts;
      c.request_timeout_seconds = options->request_timeout_seconds;
      c.part_size = options->part_size;
      c.read_block_size = options->read_block_size;
    }
    auto s = distckpt::NewS3Storage(c);
    if (!s.ok()) return Report(s.status());
    *out = new dckpt_storage{std::shared_ptr<distckpt::Storage>(std::move(s).value())};
    return DCKPT_OK;
  })
}

int dckpt_url_scheme(size_t* length, const char* path) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(length, "length"));
    *length = 0;
    DCKPT_RETURN_IF_FAILED(NotNull(path, "path"));
    *length = distckpt::UrlScheme(path).size();
    return DCKPT_OK;
  })
}

int dckpt_storage_open_url(dckpt_storage** out, const char* url) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    *out = nullptr;
    DCKPT_RETURN_IF_FAILED(NotNull(url, "url"));
    auto s = distckpt::StorageForUrl(url);
    if (!s.ok()) return Report(s.status());
    // A plain path (nullptr): a POSIX storage of the handle's own (the process-wide one is not the caller's to hold).
    *out = new dckpt_storage{*s != nullptr ? std::move(s).value()
                                           : std::shared_ptr<distckpt::Storage>(distckpt::NewPosixStorage())};
    return DCKPT_OK;
  })
}

int dckpt_storage_list_dir(dckpt_storage* storage, const char* dir, dckpt_name_fn each, void* user_data) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(dir, "dir"));
    if (each == nullptr) DCKPT_RETURN_IF_FAILED(NotNull(nullptr, "each"));
    auto held = distckpt::capi::StorageOrUrl(storage, dir);
    if (!held.ok()) return Report(held.status());
    auto names = (*held)->ListDir(dir);
    if (!names.ok()) {
      // A missing directory of a file system has nothing below it; on an object store a prefix with nothing below
      // lists empty, and kNotFound means something else is missing (S3: the bucket).
      if (names.status().code() == distckpt::StatusCode::kNotFound &&
          (*held)->commit_protocol() == distckpt::CommitProtocol::kRename) {
        return DCKPT_OK;
      }
      return Report(names.status());
    }
    std::vector<std::string> sorted = std::move(names).value();
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    for (const std::string& name : sorted) {
      const int rc = each(name.c_str(), user_data);
      if (rc != 0) {
        return Report(distckpt::Status(distckpt::StatusCode::kUser, "listing '" + std::string(dir) +
                                                                        "': the callback stopped at '" + name +
                                                                        "' (it returned " + std::to_string(rc) + ")"));
      }
    }
    return DCKPT_OK;
  })
}

int dckpt_storage_read_file(uint64_t* size, dckpt_storage* storage, const char* path, void* buf, uint64_t buf_size) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(size, "size"));
    *size = 0;
    DCKPT_RETURN_IF_FAILED(NotNull(path, "path"));
    auto held = distckpt::capi::StorageOrUrl(storage, path);
    if (!held.ok()) return Report(held.status());
    auto need = (*held)->FileSize(path);
    if (!need.ok()) return Report(need.status());
    if (buf == nullptr || buf_size < *need) {
      *size = *need;
      return Report(distckpt::Status(distckpt::StatusCode::kBufferTooSmall,
                                     "'" + std::string(path) + "' is " + std::to_string(*need) +
                                         " bytes; the buffer holds " + std::to_string(buf == nullptr ? 0 : buf_size)));
    }
    auto bytes = (*held)->ReadFile(path, buf_size);  // a file grown since is kCorrupt (larger than the buffer)
    if (!bytes.ok()) return Report(bytes.status());
    if (!bytes->empty()) std::memcpy(buf, bytes->data(), bytes->size());
    *size = bytes->size();
    return DCKPT_OK;
  })
}

int dckpt_storage_list_add(dckpt_storage_list* list, const char* name) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(list, "list"));
    DCKPT_RETURN_IF_FAILED(NotNull(name, "name"));
    list->names.emplace_back(name);
    return DCKPT_OK;
  })
}

int dckpt_storage_stat(dckpt_path_info* out, dckpt_storage* storage, const char* path, double grace_seconds) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(out, "out"));
    DCKPT_RETURN_IF_FAILED(NotNull(path, "path"));
    DCKPT_RETURN_IF_FAILED(distckpt::capi::CheckVersion(out->version, DCKPT_PATH_INFO_VERSION, "dckpt_path_info"));
    auto grace = distckpt::capi::Grace(grace_seconds);
    if (!grace.ok()) return Report(grace.status());
    auto held = distckpt::capi::StorageOrUrl(storage, path);
    if (!held.ok()) return Report(held.status());
    distckpt::Storage* s = held->get();
    auto scan = distckpt::ScanCheckpointPath(s, path, *grace);
    if (!scan.ok()) return Report(scan.status());
    out->kind = static_cast<int>(scan->kind);
    out->files = scan->files;
    out->bytes = scan->bytes;
    out->leftover_files = scan->leftover_files;
    out->leftover_bytes = scan->leftover_bytes;
    out->saves_in_progress = scan->saves_in_progress;
    return DCKPT_OK;
  })
}

int dckpt_storage_remove_leftovers(dckpt_storage* storage, const char* path, double grace_seconds, int dry_run,
                                   int (*removed)(const char* path, void* user_data), void* user_data) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(path, "path"));
    auto grace = distckpt::capi::Grace(grace_seconds);
    if (!grace.ok()) return Report(grace.status());
    auto held = distckpt::capi::StorageOrUrl(storage, path);
    if (!held.ok()) return Report(held.status());
    distckpt::Storage* s = held->get();
    std::function<distckpt::Status(const std::string&)> report;
    if (removed) {
      report = [removed, user_data](const std::string& p) {
        const int rc = removed(p.c_str(), user_data);
        return rc == 0 ? distckpt::OkStatus()
                       : distckpt::Status(distckpt::StatusCode::kUser, "the removed callback stopped the prune at '" +
                                                                           p + "' (it returned " +
                                                                           std::to_string(rc) + ")");
      };
    }
    DCKPT_RETURN_IF_FAILED(distckpt::RemoveLeftovers(s, path, *grace, dry_run != 0, report));
    return DCKPT_OK;
  })
}

int dckpt_storage_remove_checkpoint(dckpt_storage* storage, const char* path) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(path, "path"));
    auto held = distckpt::capi::StorageOrUrl(storage, path);
    if (!held.ok()) return Report(held.status());
    distckpt::Storage* s = held->get();
    DCKPT_RETURN_IF_FAILED(distckpt::RemoveCheckpoint(s, path));
    return DCKPT_OK;
  })
}

int dckpt_scan_leftovers(const char* dir, const char* final_name, double grace_seconds, dckpt_leftover_fn each,
                         void* user_data) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(dir, "dir"));
    if (each == nullptr) DCKPT_RETURN_IF_FAILED(NotNull(nullptr, "each"));
    auto grace = distckpt::capi::Grace(grace_seconds);
    if (!grace.ok()) return Report(grace.status());
    auto found = distckpt::ScanRenameLeftovers(dir, *grace, final_name != nullptr ? final_name : "");
    if (!found.ok()) return Report(found.status());
    for (const distckpt::RenameLeftover& l : *found) {
      const distckpt::WriterState w = l.writer;
      dckpt_leftover_info info{};
      info.version = DCKPT_LEFTOVER_INFO_VERSION;
      info.path = l.path.c_str();
      info.name = l.name.c_str();
      info.final_name = l.final_name.c_str();
      info.kind = static_cast<int>(l.kind);
      info.bytes = l.bytes;
      info.idle_seconds = l.idle_seconds;
      info.writer = w == distckpt::WriterState::kRunning  ? DCKPT_WRITER_RUNNING
                    : w == distckpt::WriterState::kExited ? DCKPT_WRITER_EXITED
                                                          : DCKPT_WRITER_UNKNOWN;
      info.writer_pid = l.marker.pid;
      info.writer_host = l.marker.host.c_str();
      info.writer_started_utc = l.marker.started_utc.c_str();
      info.garbage = l.garbage ? 1 : 0;
      info.reason = l.reason.c_str();
      const int rc = each(&info, user_data);
      if (rc != 0) {
        return Report(distckpt::Status(distckpt::StatusCode::kUser, "the leftover callback stopped the scan of '" +
                                                                       std::string(dir) + "' at '" + l.path +
                                                                       "' (it returned " + std::to_string(rc) + ")"));
      }
    }
    return DCKPT_OK;
  })
}

int dckpt_remove_leftover(const char* path, double grace_seconds) {
  DCKPT_GUARD({
    DCKPT_RETURN_IF_FAILED(NotNull(path, "path"));
    auto grace = distckpt::capi::Grace(grace_seconds);
    if (!grace.ok()) return Report(grace.status());
    DCKPT_RETURN_IF_FAILED(distckpt::RemoveRenameLeftover(path, *grace));
    return DCKPT_OK;
  })
}

}  // extern "C"
