#include "core/storage/fault/fault_storage.h"

#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "core/storage/backend_util.h"

namespace distckpt {
namespace {

using Op = FaultRule::Op;

using internal_storage::Quoted;

struct OpName {
  const char* name;
  Op op;
};
constexpr OpName kOps[] = {
    {"any", Op::kAny},         {"create", Op::kCreate},       {"write", Op::kWrite},       {"preallocate", Op::kPreallocate},
    {"truncate", Op::kTruncate}, {"sync", Op::kSync},         {"close", Op::kClose},       {"open", Op::kOpen},
    {"read", Op::kRead},       {"readfile", Op::kReadFile},   {"writefile", Op::kWriteFile}, {"syncdir", Op::kSyncDir},
    {"rename", Op::kRename},   {"remove", Op::kRemove},       {"list", Op::kList},         {"mkdir", Op::kMkdir},
    {"exists", Op::kExists},   {"opendir", Op::kOpenDir},     {"exchange", Op::kExchange}, {"lock", Op::kLock},
    {"identity", Op::kIdentity},
};

struct ErrnoName {
  const char* name;
  int err;
};
constexpr ErrnoName kErrnos[] = {
    {"EIO", EIO},       {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT},   {"EROFS", EROFS},   {"EACCES", EACCES},
    {"ENOENT", ENOENT}, {"EEXIST", EEXIST}, {"ENOMEM", ENOMEM},   {"EFBIG", EFBIG},   {"ENOTDIR", ENOTDIR},
    {"EISDIR", EISDIR}, {"EINVAL", EINVAL},
};

// "12", "3K", "3MiB", "1G" -> bytes; false if malformed.
bool ParseBytes(const std::string& s, uint64_t* out) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return false;
  const std::string unit(end);
  uint64_t mult = 1;
  if (unit == "K" || unit == "KiB") mult = 1ull << 10;
  else if (unit == "M" || unit == "MiB") mult = 1ull << 20;
  else if (unit == "G" || unit == "GiB") mult = 1ull << 30;
  else if (!unit.empty()) return false;
  *out = n * mult;
  return true;
}

// "500ms", "30s", "2m" -> milliseconds.
bool ParseDuration(const std::string& s, std::chrono::milliseconds* out) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return false;
  const std::string unit(end);
  if (unit == "ms") *out = std::chrono::milliseconds(n);
  else if (unit == "s" || unit.empty()) *out = std::chrono::seconds(n);
  else if (unit == "m") *out = std::chrono::minutes(n);
  else return false;
  return true;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultStorage* fs, std::unique_ptr<WritableFile> base) : fs_(fs), base_(std::move(base)) {}

  Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    const uint64_t before = written_.fetch_add(size);
    uint64_t cut = 0;
    Status st = fs_->Check(Op::kWrite, path(),
                           "writing " + std::to_string(size) + " bytes at offset " + std::to_string(offset) + " to " +
                               Quoted(path()),
                           "", size, before, &cut);
    if (st.ok()) return base_->WriteAt(offset, data, size);
    if (cut > 0) (void)base_->WriteAt(offset, data, static_cast<size_t>(cut));  // what reached the disk
    return st;
  }
  Status Preallocate(uint64_t size) override {
    DCKPT_RETURN_IF_ERROR(fs_->Check(Op::kPreallocate, path(),
                                     "preallocating " + std::to_string(size) + " bytes for " + Quoted(path())));
    return base_->Preallocate(size);
  }
  Status Truncate(uint64_t size) override {
    DCKPT_RETURN_IF_ERROR(fs_->Check(Op::kTruncate, path(),
                                     "setting the size of " + Quoted(path()) + " to " + std::to_string(size) + " bytes"));
    return base_->Truncate(size);
  }
  Status Sync() override {
    DCKPT_RETURN_IF_ERROR(fs_->Check(Op::kSync, path(), "syncing " + Quoted(path())));
    return base_->Sync();
  }
  Status Close() override {
    Status st = fs_->Check(Op::kClose, path(), "closing " + Quoted(path()));
    Status closed = base_->Close();  // a failed close still releases the descriptor
    return st.ok() ? closed : st;
  }
  const std::string& path() const override { return base_->path(); }
  void ExpectWrites(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) override { base_->ExpectWrites(ranges); }

 private:
  FaultStorage* fs_;
  std::unique_ptr<WritableFile> base_;
  std::atomic<uint64_t> written_{0};
};

class FaultReadableFile final : public ReadableFile {
 public:
  FaultReadableFile(FaultStorage* fs, std::unique_ptr<ReadableFile> base, bool no_map)
      : fs_(fs), base_(std::move(base)), no_map_(no_map) {}

  Status ReadAt(uint64_t offset, void* data, size_t size) const override {
    DCKPT_RETURN_IF_ERROR(fs_->Check(Op::kRead, path(),
                                     "reading " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                                         " from " + Quoted(path())));
    return base_->ReadAt(offset, data, size);
  }
  uint64_t size() const override { return base_->size(); }
  const std::string& path() const override { return base_->path(); }
  // Mapped reads bypass ReadAt: where read faults are asked for, nothing is mapped, so every read meets them.
  const char* Map() const override { return no_map_ ? nullptr : base_->Map(); }
  bool Resident(uint64_t offset, uint64_t size) const override {
    return !no_map_ && base_->Resident(offset, size);
  }
  void ReleaseMapped(uint64_t offset, uint64_t size) const override { base_->ReleaseMapped(offset, size); }
  std::unique_ptr<ReadableFile> Reopen() const override {
    std::unique_ptr<ReadableFile> again = base_->Reopen();
    if (!again) return nullptr;
    return std::unique_ptr<ReadableFile>(new FaultReadableFile(fs_, std::move(again), no_map_));
  }
  std::string CacheIdentity() const override { return base_->CacheIdentity(); }

 private:
  FaultStorage* fs_;
  std::unique_ptr<ReadableFile> base_;
  bool no_map_;
};

class FaultDirectory final : public Directory {
 public:
  FaultDirectory(FaultStorage* fs, std::unique_ptr<Directory> base, bool no_map)
      : fs_(fs), base_(std::move(base)), no_map_(no_map) {}
  const std::string& path() const override { return base_->path(); }
  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& name) override {
    const std::string full = path() + "/" + name;
    DCKPT_RETURN_IF_ERROR(fs_->Check(Op::kOpen, full, "opening " + Quoted(full) + " for reading"));
    DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, base_->OpenFile(name));
    return std::unique_ptr<ReadableFile>(new FaultReadableFile(fs_, std::move(file), no_map_));
  }
  Result<bool> Exists(const std::string& name) override {
    const std::string full = path() + "/" + name;
    DCKPT_RETURN_IF_ERROR(fs_->Check(Op::kExists, full, "checking whether " + Quoted(full) + " exists"));
    return base_->Exists(name);
  }
  void ExpectOpenFiles(size_t count) override { base_->ExpectOpenFiles(count); }

 private:
  FaultStorage* fs_;
  std::unique_ptr<Directory> base_;
  bool no_map_;
};

bool HasReadRule(const std::vector<FaultRule>& rules) {
  for (const FaultRule& r : rules) {
    if (r.op == Op::kRead) return true;
  }
  return false;
}

}  // namespace

Result<std::vector<FaultRule>> ParseFaultRules(const std::string& text) {
  std::vector<FaultRule> rules;
  for (const std::string& item : Split(text, ';')) {
    if (item.empty()) continue;
    auto bad = [&](const std::string& why) {
      return InvalidArgument("fault rule '" + item + "': " + why + " (OP:PATH:WHEN:ACTION, see fault_storage.h)");
    };
    const std::vector<std::string> f = Split(item, ':');
    if (f.size() != 4) return bad("needs four fields");
    FaultRule r;
    bool known = false;
    for (const OpName& o : kOps) {
      if (f[0] == o.name) r.op = o.op, known = true;
    }
    if (!known) return bad("unknown operation '" + f[0] + "'");
    r.path = f[1] == "*" ? "" : f[1];
    if (f[2].rfind("nth=", 0) == 0) {
      if (!ParseBytes(f[2].substr(4), &r.nth) || r.nth == 0) return bad("nth needs a number >= 1");
    } else if (f[2].rfind("after=", 0) == 0) {
      if (r.op != Op::kWrite) return bad("after= applies to write only");
      if (!ParseBytes(f[2].substr(6), &r.after_bytes)) return bad("after needs a size");
    } else if (f[2] != "every") {
      return bad("WHEN is nth=N, after=BYTES or every");
    }
    if (f[3] == "kill") {
      r.action = FaultRule::Action::kKill;
    } else if (f[3] == "short") {
      if (r.op != Op::kWrite) return bad("short applies to write only");
      r.action = FaultRule::Action::kShortWrite;
    } else if (f[3].rfind("stall=", 0) == 0) {
      r.action = FaultRule::Action::kStall;
      if (!ParseDuration(f[3].substr(6), &r.stall)) return bad("stall needs a duration");
    } else {
      r.action = FaultRule::Action::kError;
      for (const ErrnoName& e : kErrnos) {
        if (f[3] == e.name) r.err = e.err;
      }
      if (r.err == 0) return bad("unknown action '" + f[3] + "'");
    }
    rules.push_back(std::move(r));
  }
  return rules;
}

FaultStorage::FaultStorage(Storage* base, std::vector<FaultRule> rules)
    : base_(base), rules_(std::move(rules)), matches_(rules_.size(), 0), done_(rules_.size(), false) {}

FaultStorage::FaultStorage(std::unique_ptr<Storage> base, std::vector<FaultRule> rules)
    : FaultStorage(base.get(), std::move(rules)) {
  owned_ = std::move(base);
}

Status FaultStorage::Check(Op op, const std::string& path, const std::string& what, const std::string& other,
                           uint64_t bytes, uint64_t written_before, uint64_t* cut) {
  ops_.fetch_add(1);
  const FaultRule* fire = nullptr;
  uint64_t allowed = 0;  // bytes of a write that get through before the fault
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < rules_.size() && fire == nullptr; ++i) {
      const FaultRule& r = rules_[i];
      if (done_[i] || (r.op != Op::kAny && r.op != op)) continue;
      if (!r.path.empty() && path.find(r.path) == std::string::npos && other.find(r.path) == std::string::npos) {
        continue;
      }
      if (r.after_bytes > 0) {
        if (written_before + bytes <= r.after_bytes) continue;
        allowed = written_before < r.after_bytes ? r.after_bytes - written_before : 0;
        done_[i] = true;
      } else if (r.nth > 0) {
        if (++matches_[i] != r.nth) continue;
        done_[i] = true;
        if (r.action == FaultRule::Action::kShortWrite) allowed = bytes / 2;
      } else if (r.action == FaultRule::Action::kShortWrite) {
        allowed = bytes / 2;
      }
      fire = &r;
    }
  }
  if (fire == nullptr) return OkStatus();
  fired_.fetch_add(1);
  switch (fire->action) {
    case FaultRule::Action::kKill:
      ::raise(SIGKILL);
      return Internal("still alive after SIGKILL");
    case FaultRule::Action::kStall:
      std::this_thread::sleep_for(fire->stall);
      return OkStatus();
    case FaultRule::Action::kShortWrite:
      if (cut != nullptr) *cut = allowed;
      return ErrnoError(ENOSPC, what);
    case FaultRule::Action::kError:
      if (cut != nullptr) *cut = allowed;
      return ErrnoError(fire->err, what);
  }
  return OkStatus();
}

Result<std::unique_ptr<WritableFile>> FaultStorage::CreateFile(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kCreate, path, "creating " + Quoted(path) + " for writing"));
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->CreateFile(path));
  return std::unique_ptr<WritableFile>(new FaultWritableFile(this, std::move(file)));
}

Result<std::unique_ptr<ReadableFile>> FaultStorage::OpenFile(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kOpen, path, "opening " + Quoted(path) + " for reading"));
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, base_->OpenFile(path));
  return std::unique_ptr<ReadableFile>(new FaultReadableFile(this, std::move(file), HasReadRule(rules_)));
}

Result<std::string> FaultStorage::ReadFile(const std::string& path, uint64_t max_size) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kReadFile, path, "reading " + Quoted(path)));
  return base_->ReadFile(path, max_size);
}

Status FaultStorage::WriteFileDurably(const std::string& path, const std::string& data) {
  uint64_t cut = 0;
  Status st = Check(Op::kWriteFile, path, "writing " + Quoted(path), "", data.size(), 0, &cut);
  if (st.ok()) return base_->WriteFileDurably(path, data);
  if (cut > 0) (void)base_->WriteFileDurably(path, data.substr(0, static_cast<size_t>(cut)));
  return st;
}

Result<uint64_t> FaultStorage::FileSize(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kExists, path, "reading the size of " + Quoted(path)));
  return base_->FileSize(path);
}

Result<bool> FaultStorage::Exists(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kExists, path, "checking whether " + Quoted(path) + " exists"));
  return base_->Exists(path);
}

Result<bool> FaultStorage::IsDirectory(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kExists, path, "checking whether " + Quoted(path) + " is a directory"));
  return base_->IsDirectory(path);
}

Status FaultStorage::CreateDir(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kMkdir, path, "creating directory " + Quoted(path)));
  return base_->CreateDir(path);
}

Status FaultStorage::SyncDir(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kSyncDir, path, "syncing directory " + Quoted(path)));
  return base_->SyncDir(path);
}

Status FaultStorage::Rename(const std::string& from, const std::string& to) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kRename, from, "renaming " + Quoted(from) + " to " + Quoted(to), to));
  return base_->Rename(from, to);
}

Status FaultStorage::RemoveAll(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kRemove, path, "removing " + Quoted(path)));
  return base_->RemoveAll(path);
}

Status FaultStorage::RemoveEmptyDir(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kRemove, path, "removing " + Quoted(path)));
  return base_->RemoveEmptyDir(path);
}

Result<std::vector<std::string>> FaultStorage::ListDir(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kList, path, "listing directory " + Quoted(path)));
  return base_->ListDir(path);
}

Result<std::unique_ptr<Directory>> FaultStorage::OpenDirectory(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kOpenDir, path, "opening directory " + Quoted(path)));
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<Directory> dir, base_->OpenDirectory(path));
  return std::unique_ptr<Directory>(new FaultDirectory(this, std::move(dir), HasReadRule(rules_)));
}

Result<std::string> FaultStorage::Identity(const std::string& path) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kIdentity, path, "looking at " + Quoted(path)));
  return base_->Identity(path);
}

Status FaultStorage::Exchange(const std::string& a, const std::string& b) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kExchange, a, "exchanging " + Quoted(a) + " and " + Quoted(b), b));
  return base_->Exchange(a, b);
}

Result<std::unique_ptr<DirectoryLock>> FaultStorage::LockDirectory(const std::string& dir,
                                                                   std::chrono::milliseconds timeout) {
  DCKPT_RETURN_IF_ERROR(Check(Op::kLock, dir, "locking directory " + Quoted(dir)));
  return base_->LockDirectory(dir, timeout);
}

}  // namespace distckpt
