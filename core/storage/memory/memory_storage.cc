// An in-process filesystem for tests: a map of paths to byte vectors plus a set of directories, behind one mutex.
//
// It mirrors POSIX semantics closely enough that the shared conformance suite runs unchanged against it: errors
// carry the errno a filesystem would give (so codes and wording match the posix backend), a file handle keeps
// working after its name is renamed or removed (it shares the file's bytes, like an inode), creating an entry in a
// missing directory fails, and Rename never replaces. Paths are normalised lexically: "//a/./b/" is "/a/b", and a
// relative path is taken from "/". Every directory and file has an id that moves with it (like an inode number), so a
// Directory handle keeps reading the directory it opened after a rename, and Identity notices a replacement. There
// are no symbolic links.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/storage/backend_util.h"
#include "core/storage/storage.h"

namespace distckpt {
namespace internal_storage {
namespace {

// Files are vectors in RAM; anything near this is a test bug, and resizing to it would abort the process with
// bad_alloc rather than fail with a Status.
constexpr uint64_t kMaxMemoryFileSize = uint64_t{1} << 34;

// Ids of directories and files, never reused.
std::atomic<uint64_t> next_id{1};

// One file's bytes, shared between the namespace and every open handle.
struct MemoryNode {
  const uint64_t id = next_id++;
  std::mutex mu;
  std::vector<char> data;
};

// Lexical normalisation: collapses "//" and ".", resolves ".." (which stops at "/"), drops trailing slashes.
std::string Normalize(const std::string& path) {
  const std::vector<std::string> parts = LexicalComponents(path);
  if (parts.empty()) return "/";
  std::string out;
  for (const std::string& part : parts) out += "/" + part;
  return out;
}

// Parent of a normalised path other than "/".
std::string NormalizedParent(const std::string& p) {
  const size_t slash = p.rfind('/');
  return slash == 0 ? "/" : p.substr(0, slash);
}

// The prefix every entry below directory `p` starts with.
std::string ChildPrefix(const std::string& p) { return p == "/" ? "/" : p + "/"; }

bool StartsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

Status CheckSize(const std::string& path, uint64_t end) {
  if (end > kMaxMemoryFileSize) {
    return ErrnoError(EFBIG, "growing " + Quoted(path) + " to " + std::to_string(end) +
                                 " bytes (the memory backend stops at " + std::to_string(kMaxMemoryFileSize) + ")");
  }
  return OkStatus();
}

class MemoryWritableFile final : public WritableFile {
 public:
  MemoryWritableFile(std::shared_ptr<MemoryNode> node, std::string path)
      : node_(std::move(node)), path_(std::move(path)) {}

  Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    if (closed_) return ClosedFileError(path_, "writing to");
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, offset, size));
    if (size == 0) return OkStatus();
    DCKPT_RETURN_IF_ERROR(CheckSize(path_, offset + size));
    std::lock_guard<std::mutex> lock(node_->mu);
    if (node_->data.size() < offset + size) node_->data.resize(static_cast<size_t>(offset + size));
    std::memcpy(node_->data.data() + offset, data, size);
    return OkStatus();
  }

  Status Preallocate(uint64_t size) override {
    if (closed_) return ClosedFileError(path_, "preallocating");
    DCKPT_RETURN_IF_ERROR(CheckSize(path_, size));
    // Like fallocate(mode 0): the file grows to at least `size`, it never shrinks.
    std::lock_guard<std::mutex> lock(node_->mu);
    if (node_->data.size() < size) node_->data.resize(static_cast<size_t>(size));
    return OkStatus();
  }

  Status Truncate(uint64_t size) override {
    if (closed_) return ClosedFileError(path_, "truncating");
    DCKPT_RETURN_IF_ERROR(CheckSize(path_, size));
    std::lock_guard<std::mutex> lock(node_->mu);
    node_->data.resize(static_cast<size_t>(size));
    return OkStatus();
  }

  Status Sync() override { return closed_ ? ClosedFileError(path_, "syncing") : OkStatus(); }

  Status Close() override {
    if (closed_) return ClosedFileError(path_, "closing");
    closed_ = true;
    return OkStatus();
  }

  const std::string& path() const override { return path_; }

 private:
  const std::shared_ptr<MemoryNode> node_;
  const std::string path_;
  bool closed_ = false;  // Close racing with other calls on the same file is a caller bug, as with a descriptor
};

class MemoryReadableFile final : public ReadableFile {
 public:
  MemoryReadableFile(std::shared_ptr<MemoryNode> node, std::string path, uint64_t size)
      : node_(std::move(node)), path_(std::move(path)), size_(size) {}

  Status ReadAt(uint64_t offset, void* data, size_t size) const override {
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, offset, size));
    std::lock_guard<std::mutex> lock(node_->mu);
    const uint64_t have = node_->data.size();
    if (offset > have || size > have - offset) return TruncatedFileError(path_, offset, size, have);
    if (size > 0) std::memcpy(data, node_->data.data() + offset, size);
    return OkStatus();
  }

  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  const std::shared_ptr<MemoryNode> node_;
  const std::string path_;
  const uint64_t size_;  // at open, like fstat
};

// LockDirectory's lock: a flag under a mutex, waited for on a condition variable. (Not std::timed_mutex: its
// try_lock_for is pthread_mutex_clocklock, which ThreadSanitizer does not intercept, so TSan saw every unlock as one
// of an unlocked mutex and none of the ordering the lock provides.)
struct CommitLock {
  std::mutex mu;
  std::condition_variable cv;
  bool held = false;  // guarded by mu
};

class MemoryStorage final : public Storage {
 public:
  MemoryStorage() { dirs_.emplace("/", next_id++); }

  std::string name() const override { return "memory"; }

  Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& path) override {
    std::shared_ptr<MemoryNode> node;
    {
      std::lock_guard<std::mutex> lock(mu_);
      DCKPT_ASSIGN_OR_RETURN(node, CreateOrTruncateLocked(path, "creating " + Quoted(path) + " for writing"));
    }
    return std::unique_ptr<WritableFile>(new MemoryWritableFile(std::move(node), path));
  }

  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& path) override {
    std::shared_ptr<MemoryNode> node;
    {
      std::lock_guard<std::mutex> lock(mu_);
      DCKPT_ASSIGN_OR_RETURN(node, FindFileLocked(path, "opening " + Quoted(path) + " for reading"));
    }
    uint64_t size;
    {
      std::lock_guard<std::mutex> lock(node->mu);
      size = node->data.size();
    }
    return std::unique_ptr<ReadableFile>(new MemoryReadableFile(std::move(node), path, size));
  }

  Result<std::string> ReadFile(const std::string& path, uint64_t max_size) override {
    std::shared_ptr<MemoryNode> node;
    {
      std::lock_guard<std::mutex> lock(mu_);
      DCKPT_ASSIGN_OR_RETURN(node, FindFileLocked(path, "opening " + Quoted(path) + " for reading"));
    }
    std::lock_guard<std::mutex> lock(node->mu);
    if (node->data.size() > max_size) {
      return Corrupt("file " + Quoted(path) + " is larger than the limit of " + std::to_string(max_size) + " bytes (" +
                     std::to_string(node->data.size()) + " bytes)");
    }
    return std::string(node->data.begin(), node->data.end());
  }

  Status WriteFileDurably(const std::string& path, const std::string& data) override {
    DCKPT_RETURN_IF_ERROR(CheckSize(path, data.size()));
    std::shared_ptr<MemoryNode> node;
    {
      std::lock_guard<std::mutex> lock(mu_);
      DCKPT_ASSIGN_OR_RETURN(node, CreateOrTruncateLocked(path, "creating " + Quoted(path) + " for writing"));
    }
    std::lock_guard<std::mutex> lock(node->mu);
    node->data.assign(data.begin(), data.end());
    return OkStatus();
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    std::shared_ptr<MemoryNode> node;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const std::string p = Normalize(path);
      if (dirs_.count(p) != 0) return uint64_t{0};
      DCKPT_ASSIGN_OR_RETURN(node, FindFileLocked(path, "reading the size of " + Quoted(path)));
    }
    std::lock_guard<std::mutex> lock(node->mu);
    return static_cast<uint64_t>(node->data.size());
  }

  Result<bool> Exists(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string p = Normalize(path);
    return dirs_.count(p) != 0 || files_.count(p) != 0;
  }

  Result<bool> IsDirectory(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    return dirs_.count(Normalize(path)) != 0;
  }

  Status CreateDir(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string p = Normalize(path);
    const std::string what = "creating directory " + Quoted(path);
    if (dirs_.count(p) != 0 || files_.count(p) != 0) return ErrnoError(EEXIST, what);
    DCKPT_RETURN_IF_ERROR(CheckParentLocked(p, what));
    dirs_.emplace(p, next_id++);
    return OkStatus();
  }

  Status SyncDir(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    return CheckDirLocked(Normalize(path), "opening directory " + Quoted(path) + " to sync it");
  }

  Status Rename(const std::string& from, const std::string& to) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string f = Normalize(from);
    const std::string t = Normalize(to);
    const std::string what = "renaming " + Quoted(from) + " to " + Quoted(to);
    const bool is_dir = dirs_.count(f) != 0;
    if (!is_dir && files_.count(f) == 0) return ErrnoError(ENOENT, what);
    if (f == "/") return ErrnoError(EBUSY, what);
    if (dirs_.count(t) != 0 || files_.count(t) != 0) return ErrnoError(EEXIST, what);
    DCKPT_RETURN_IF_ERROR(CheckParentLocked(t, what));
    if (is_dir && StartsWith(t, ChildPrefix(f))) return ErrnoError(EINVAL, what);  // into its own subtree
    MoveEntryLocked(f, t);
    return OkStatus();
  }

  Status RemoveAll(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string p = Normalize(path);
    if (p == "/") return InvalidArgument("refusing to remove " + Quoted(path) + " recursively");
    files_.erase(p);
    if (dirs_.erase(p) != 0) {
      EraseBelow(&dirs_, p);
      EraseBelow(&files_, p);
    }
    return OkStatus();
  }

  Status RemoveEmptyDir(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string p = Normalize(path);
    if (p == "/" || dirs_.count(p) == 0) return OkStatus();
    const std::string below = p + "/";
    auto has_below = [&below](const auto& names) {
      auto it = names.lower_bound(below);
      return it != names.end() && it->first.compare(0, below.size(), below) == 0;
    };
    if (has_below(files_) || has_below(dirs_)) return OkStatus();  // not empty: it stays
    dirs_.erase(p);
    return OkStatus();
  }

  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string p = Normalize(path);
    DCKPT_RETURN_IF_ERROR(CheckDirLocked(p, "listing directory " + Quoted(path)));
    const std::string prefix = ChildPrefix(p);
    std::vector<std::string> names;
    auto add_children = [&](const auto& container) {
      for (auto it = container.lower_bound(prefix); it != container.end(); ++it) {
        const std::string& key = KeyOf(*it);
        if (!StartsWith(key, prefix)) break;
        // "/" itself sorts first under the prefix "/"; it is not its own child.
        if (key.size() > prefix.size() && key.find('/', prefix.size()) == std::string::npos) {
          names.push_back(key.substr(prefix.size()));
        }
      }
    };
    add_children(dirs_);
    add_children(files_);
    std::sort(names.begin(), names.end());
    return names;
  }

  Result<std::unique_ptr<Directory>> OpenDirectory(const std::string& path) override;

  Result<std::string> Identity(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string p = Normalize(path);
    if (auto d = dirs_.find(p); d != dirs_.end()) return "d" + std::to_string(d->second);
    if (auto f = files_.find(p); f != files_.end()) return "f" + std::to_string(f->second->id);
    return std::string();
  }

  Status Exchange(const std::string& a, const std::string& b) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string pa = Normalize(a), pb = Normalize(b);
    const std::string what = "exchanging " + Quoted(a) + " and " + Quoted(b);
    for (const std::string& p : {pa, pb}) {
      if (dirs_.count(p) == 0 && files_.count(p) == 0) return ErrnoError(ENOENT, what);
      if (p == "/") return ErrnoError(EBUSY, what);
    }
    if (pa == pb) return OkStatus();
    if (StartsWith(pb, ChildPrefix(pa)) || StartsWith(pa, ChildPrefix(pb))) return ErrnoError(EINVAL, what);
    // Through a name that cannot exist (normalised paths never contain "//"), all under one lock: atomic.
    const std::string tmp = pa + "//exchange";
    MoveEntryLocked(pa, tmp);
    MoveEntryLocked(pb, pa);
    MoveEntryLocked(tmp, pb);
    return OkStatus();
  }

  Result<std::unique_ptr<DirectoryLock>> LockDirectory(const std::string& dir,
                                                       std::chrono::milliseconds timeout) override;

  // For MemoryDirectory: opens `name` inside the directory with id `dir_id`, wherever it is now.
  Result<std::unique_ptr<ReadableFile>> OpenInDirectory(uint64_t dir_id, const std::string& shown_path,
                                                        const std::string& name) {
    std::shared_ptr<MemoryNode> node;
    const std::string what = "opening " + Quoted(shown_path + "/" + name) + " for reading";
    {
      std::lock_guard<std::mutex> lock(mu_);
      DCKPT_ASSIGN_OR_RETURN(const std::string dir, DirectoryPathLocked(dir_id, what));
      const std::string p = ChildPrefix(dir) + name;
      if (dirs_.count(p) != 0) {
        return Corrupt(Quoted(shown_path + "/" + name) + " is a directory, not a regular file; distckpt opens only "
                       "regular files inside a checkpoint");
      }
      DCKPT_ASSIGN_OR_RETURN(node, FindFileLocked(p, what));
    }
    uint64_t size;
    {
      std::lock_guard<std::mutex> lock(node->mu);
      size = node->data.size();
    }
    return std::unique_ptr<ReadableFile>(new MemoryReadableFile(std::move(node), shown_path + "/" + name, size));
  }

  Result<bool> ExistsInDirectory(uint64_t dir_id, const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto dir = DirectoryPathLocked(dir_id, "");
    if (!dir.ok()) return false;
    const std::string p = ChildPrefix(*dir) + name;
    return dirs_.count(p) != 0 || files_.count(p) != 0;
  }

 private:
  // The current path of the directory with id `id`; ENOENT once it has been removed.
  Result<std::string> DirectoryPathLocked(uint64_t id, const std::string& what) const {
    for (const auto& [path, dir_id] : dirs_) {
      if (dir_id == id) return path;
    }
    return ErrnoError(ENOENT, what);
  }

  // Renames one file, or one directory with everything below it (the caller has checked both names).
  void MoveEntryLocked(const std::string& from, const std::string& to) {
    if (files_.count(from) != 0) {
      files_[to] = std::move(files_[from]);
      files_.erase(from);
      return;
    }
    MoveSubtree(&dirs_, from, to);
    MoveSubtree(&files_, from, to);
  }

  static const std::string& KeyOf(const std::string& key) { return key; }
  template <typename V>
  static const std::string& KeyOf(const std::pair<const std::string, V>& kv) {
    return kv.first;
  }

  // Entries strictly below directory `p`, in a set or a map.
  template <typename Container>
  static void EraseBelow(Container* c, const std::string& p) {
    const std::string prefix = ChildPrefix(p);
    auto it = c->lower_bound(prefix);
    while (it != c->end() && StartsWith(KeyOf(*it), prefix)) it = c->erase(it);
  }

  // Renames `from` and everything below it to `to` in one container.
  template <typename Container>
  static void MoveSubtree(Container* c, const std::string& from, const std::string& to) {
    const std::string prefix = ChildPrefix(from);
    std::vector<typename Container::node_type> moved;
    if (c->count(from) != 0) moved.push_back(c->extract(from));
    for (auto it = c->lower_bound(prefix); it != c->end() && StartsWith(KeyOf(*it), prefix);) {
      auto next = std::next(it);
      moved.push_back(c->extract(it));
      it = next;
    }
    for (auto& node : moved) {
      RekeyNode(&node, to + NodeKey(node).substr(from.size()));
      c->insert(std::move(node));
    }
  }
  template <typename N>
  static const std::string& NodeKey(const N& n) {
    return n.key();
  }
  template <typename N>
  static void RekeyNode(N* n, std::string key) {
    n->key() = std::move(key);
  }

  // The parent of normalised `p` must be an existing directory: ENOENT if missing, ENOTDIR if it is a file.
  Status CheckParentLocked(const std::string& p, const std::string& what) const {
    const std::string parent = NormalizedParent(p);
    if (dirs_.count(parent) != 0) return OkStatus();
    return ErrnoError(PathErrnoLocked(parent), what);
  }

  Status CheckDirLocked(const std::string& p, const std::string& what) const {
    if (dirs_.count(p) != 0) return OkStatus();
    return ErrnoError(files_.count(p) != 0 ? ENOTDIR : PathErrnoLocked(p), what);
  }

  // What a lookup of missing normalised `p` fails with: ENOTDIR if some ancestor is a file, else ENOENT.
  int PathErrnoLocked(const std::string& p) const {
    for (std::string a = p; a != "/"; a = NormalizedParent(a)) {
      if (files_.count(a) != 0) return ENOTDIR;
    }
    return ENOENT;
  }

  Result<std::shared_ptr<MemoryNode>> FindFileLocked(const std::string& path, const std::string& what) const {
    const std::string p = Normalize(path);
    auto it = files_.find(p);
    if (it != files_.end()) return it->second;
    return ErrnoError(dirs_.count(p) != 0 ? EISDIR : PathErrnoLocked(p), what);
  }

  // O_CREAT | O_TRUNC: an existing file is emptied in place, so handles already open on it see that too.
  Result<std::shared_ptr<MemoryNode>> CreateOrTruncateLocked(const std::string& path, const std::string& what) {
    const std::string p = Normalize(path);
    if (dirs_.count(p) != 0) return ErrnoError(EISDIR, what);
    auto it = files_.find(p);
    if (it != files_.end()) {
      std::lock_guard<std::mutex> lock(it->second->mu);
      it->second->data.clear();
      return it->second;
    }
    DCKPT_RETURN_IF_ERROR(CheckParentLocked(p, what));
    auto node = std::make_shared<MemoryNode>();
    files_.emplace(p, node);
    return node;
  }

  std::mutex mu_;  // guards the namespace (dirs_, files_); each node's bytes have their own mutex
  std::mutex locks_mu_;
  std::map<std::string, std::shared_ptr<CommitLock>> locks_;  // LockDirectory's, by normalised path
  std::map<std::string, uint64_t> dirs_;  // path -> directory id
  std::map<std::string, std::shared_ptr<MemoryNode>> files_;
};

class MemoryDirectory final : public Directory {
 public:
  MemoryDirectory(MemoryStorage* storage, uint64_t id, std::string path)
      : storage_(storage), id_(id), path_(std::move(path)) {}
  const std::string& path() const override { return path_; }
  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& name) override {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      return InvalidArgument("'" + name + "' is not a plain file name inside " + Quoted(path_));
    }
    return storage_->OpenInDirectory(id_, path_, name);
  }
  Result<bool> Exists(const std::string& name) override { return storage_->ExistsInDirectory(id_, name); }

 private:
  MemoryStorage* const storage_;
  const uint64_t id_;
  const std::string path_;
};

class MemoryDirectoryLock final : public DirectoryLock {
 public:
  explicit MemoryDirectoryLock(std::shared_ptr<CommitLock> lock) : lock_(std::move(lock)) {}
  ~MemoryDirectoryLock() override {
    {
      std::lock_guard<std::mutex> guard(lock_->mu);
      lock_->held = false;
    }
    lock_->cv.notify_one();
  }

 private:
  std::shared_ptr<CommitLock> lock_;
};

Result<std::unique_ptr<Directory>> MemoryStorage::OpenDirectory(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string p = Normalize(path);
  auto it = dirs_.find(p);
  if (it == dirs_.end()) return ErrnoError(ENOENT, "opening directory " + Quoted(path));
  return std::unique_ptr<Directory>(new MemoryDirectory(this, it->second, StripTrailingSlashes(path)));
}

Result<std::unique_ptr<DirectoryLock>> MemoryStorage::LockDirectory(const std::string& dir,
                                                                    std::chrono::milliseconds timeout) {
  std::shared_ptr<CommitLock> commit;
  {
    std::lock_guard<std::mutex> lock(locks_mu_);
    std::shared_ptr<CommitLock>& slot = locks_[Normalize(dir)];
    if (!slot) slot = std::make_shared<CommitLock>();
    commit = slot;
  }
  {
    std::unique_lock<std::mutex> lock(commit->mu);
    if (!commit->cv.wait_for(lock, timeout, [&] { return !commit->held; })) {
      return Status(StatusCode::kTimeout, "another save has been committing into " + Quoted(dir) + " for over " +
                                              std::to_string(timeout.count()) + " ms; nothing was committed");
    }
    commit->held = true;
  }
  return std::unique_ptr<DirectoryLock>(new MemoryDirectoryLock(std::move(commit)));
}

}  // namespace
}  // namespace internal_storage

std::unique_ptr<Storage> NewMemoryStorage() { return std::unique_ptr<Storage>(new internal_storage::MemoryStorage()); }

}  // namespace distckpt
