// What a restore loads from (CheckpointManager::RestoreFromParts): the merged metadata of a step's parts, the data
// files of parts on this node read where they are, and the byte ranges of other parts received from peers straight
// into memory laid out as those files. A read-only Storage holding one checkpoint, so that the load engine (which
// verifies every byte it reads) runs unchanged over it; nothing is written to the tier. Internal to core/manager.
#ifndef DISTCKPT_CORE_MANAGER_RESTORE_SOURCE_H_
#define DISTCKPT_CORE_MANAGER_RESTORE_SOURCE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {
namespace manager_internal {

/// A data file of another node's part, as much of it as was fetched: an anonymous mapping of the file's size (only
/// the pages written take memory), into which peers' bytes are received in place. Bytes never received read as zeros
/// and fail verification, so a hole can never pass for data.
class FetchedFile {
 public:
  /// `path` names the part's file on the node that sent it (for messages).
  static Result<std::unique_ptr<FetchedFile>> Create(std::string path, uint64_t size);
  ~FetchedFile();
  FetchedFile(const FetchedFile&) = delete;
  FetchedFile& operator=(const FetchedFile&) = delete;

  char* data() const { return base_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// [lo, hi) holds received bytes (thread-safe).
  void MarkReceived(uint64_t lo, uint64_t hi);
  bool Received(uint64_t lo, uint64_t hi) const;
  /// Gives the memory of the whole pages inside [lo, hi) back (they read as zeros, and as not received, afterwards).
  void Release(uint64_t lo, uint64_t hi);

 private:
  FetchedFile(std::string path, char* base, uint64_t size, uint64_t mapped);
  std::string path_;
  char* base_;
  uint64_t size_, mapped_;
  mutable std::mutex mu_;
  std::vector<std::pair<uint64_t, uint64_t>> received_;  // disjoint, sorted
};

/// The checkpoint a restore reads, at `path` (any name: only OpenDirectory(path) works; everything else is
/// kUnsupported). Data file k of the merged metadata is `local[k]` (a part's file on this node, opened by name in
/// its part's directory) or `fetched[k]`.
class RestoreSource final : public Storage {
 public:
  struct File {
    std::shared_ptr<Directory> part_dir;  ///< local: the part's directory; the file is `name` in it
    std::string name;
    std::shared_ptr<FetchedFile> fetched;  ///< or this
  };
  RestoreSource(std::string path, std::string metadata, std::vector<File> files);

  std::string name() const override { return "restore"; }
  Result<std::unique_ptr<Directory>> OpenDirectory(const std::string& path) override;

  Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& path) override { return Refuse(path); }
  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& path) override { return Refuse(path); }
  Result<std::string> ReadFile(const std::string& path, uint64_t) override { return Refuse(path); }
  Status WriteFileDurably(const std::string& path, const std::string&) override { return Refuse(path); }
  Result<uint64_t> FileSize(const std::string& path) override { return Refuse(path); }
  Result<bool> Exists(const std::string& path) override { return Refuse(path); }
  Result<bool> IsDirectory(const std::string& path) override { return path == path_; }
  Status CreateDir(const std::string& path) override { return Refuse(path); }
  Status SyncDir(const std::string& path) override { return Refuse(path); }
  Status Rename(const std::string& from, const std::string&) override { return Refuse(from); }
  Status RemoveAll(const std::string& path) override { return Refuse(path); }
  Result<std::vector<std::string>> ListDir(const std::string& path) override { return Refuse(path); }
  Result<std::string> Identity(const std::string& path) override { return Refuse(path); }
  Status Exchange(const std::string& a, const std::string&) override { return Refuse(a); }
  Result<std::unique_ptr<DirectoryLock>> LockDirectory(const std::string& dir, std::chrono::milliseconds) override {
    return Refuse(dir);
  }

 private:
  Status Refuse(const std::string& path) const;
  const std::string path_;
  const std::shared_ptr<const std::string> metadata_;
  const std::shared_ptr<const std::vector<File>> files_;
};

}  // namespace manager_internal
}  // namespace distckpt

#endif  // DISTCKPT_CORE_MANAGER_RESTORE_SOURCE_H_
