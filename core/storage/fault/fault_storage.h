// A Storage decorator that injects faults: errors from the operating system (EIO, ENOSPC...), short writes, stalls,
// and the death of the process, at chosen operations. For tests: the fault-injection and crash-consistency suites run
// real saves and loads (one process or many ranks) over it. With no rules it forwards everything unchanged.
//
// Rules, as text (what a test worker takes from its command line), separated by ';':
//
//   OP:PATH:WHEN:ACTION
//
//   OP      create write preallocate truncate sync close open read readfile writefile syncdir rename remove list
//           mkdir exists opendir exchange lock identity, or any (every operation counts)
//   PATH    a substring of the path the operation names (for rename and exchange: of either path), or * for all
//   WHEN    nth=N   the N-th operation that matches OP and PATH (1-based)
//           after=B for write: once B bytes in all have been written to the matching file (K, M, G, KiB, MiB,
//                   GiB suffixes); the write that crosses B is cut at B
//           every   every matching operation
//   ACTION  an errno name (EIO, ENOSPC, EDQUOT, EROFS, EACCES, ENOENT, EEXIST, ENOMEM, EFBIG, ENOTDIR, EISDIR,
//           EINVAL): the operation fails as the POSIX backend reports that errno, naming the path
//           short   (write) the first part is written for real, then ENOSPC, as a disk that fills up mid-write does
//           stall=D sleeps D (ms, s, m suffixes) before doing the operation
//           kill    raise(SIGKILL) before doing the operation
//
// Examples: "write:data-00001.bin:after=3MiB:ENOSPC", "sync:*:nth=1:EIO", "read:data-:nth=2:stall=30s",
// "any:*:nth=17:kill", "rename:*:nth=1:EIO".
#ifndef DISTCKPT_CORE_STORAGE_FAULT_FAULT_STORAGE_H_
#define DISTCKPT_CORE_STORAGE_FAULT_FAULT_STORAGE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {

/// One fault. See the header comment for the text form.
struct FaultRule {
  enum class Op {
    kAny, kCreate, kWrite, kPreallocate, kTruncate, kSync, kClose, kOpen, kRead, kReadFile, kWriteFile, kSyncDir,
    kRename, kRemove, kList, kMkdir, kExists, kOpenDir, kExchange, kLock, kIdentity,
  };
  enum class Action { kError, kShortWrite, kStall, kKill };
  Op op = Op::kAny;
  std::string path;            ///< substring of the path; empty: any path
  uint64_t nth = 0;            ///< fire on the nth match (1-based); 0 with after_bytes == 0: every match
  uint64_t after_bytes = 0;    ///< write rules: fire once the matching file has taken this many bytes
  Action action = Action::kError;
  int err = 0;                 ///< kError (kShortWrite fails with ENOSPC)
  std::chrono::milliseconds stall{0};
};

/// Parses the text form; an error names the rule and what is wrong with it.
Result<std::vector<FaultRule>> ParseFaultRules(const std::string& text);

/// The decorator. Thread-safe, as every Storage.
class FaultStorage final : public Storage {
 public:
  /// `base` must outlive this object.
  FaultStorage(Storage* base, std::vector<FaultRule> rules);
  /// Owns its base (for factories, e.g. the conformance suite).
  FaultStorage(std::unique_ptr<Storage> base, std::vector<FaultRule> rules);

  /// Operations seen so far (every call of any kind, the ones of opened files included).
  uint64_t operations() const { return ops_.load(); }
  /// How many times a rule fired.
  uint64_t faults() const { return fired_.load(); }

  std::string name() const override { return base_->name() + "+faults"; }
  Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& path) override;
  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& path) override;
  Result<std::string> ReadFile(const std::string& path, uint64_t max_size) override;
  Status WriteFileDurably(const std::string& path, const std::string& data) override;
  Result<uint64_t> FileSize(const std::string& path) override;
  Result<bool> Exists(const std::string& path) override;
  Result<bool> IsDirectory(const std::string& path) override;
  Status CreateDir(const std::string& path) override;
  Status SyncDir(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status RemoveAll(const std::string& path) override;
  Status RemoveEmptyDir(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& path) override;
  Result<std::unique_ptr<Directory>> OpenDirectory(const std::string& path) override;
  Result<std::string> Identity(const std::string& path) override;
  Status Exchange(const std::string& a, const std::string& b) override;
  Result<std::unique_ptr<DirectoryLock>> LockDirectory(const std::string& dir,
                                                       std::chrono::milliseconds timeout) override;

  /// Counts the operation and applies the first rule that fires for it: OK to go on, or the injected error (a stall
  /// sleeps, a kill does not return). `bytes` is the size of a write; `*cut` receives how many of its bytes a short
  /// write or an `after` rule lets through. For the decorated files; tests need not call it.
  Status Check(FaultRule::Op op, const std::string& path, const std::string& what, const std::string& other = "",
               uint64_t bytes = 0, uint64_t written_before = 0, uint64_t* cut = nullptr);

 private:
  std::unique_ptr<Storage> owned_;
  Storage* base_;
  std::vector<FaultRule> rules_;
  std::mutex mu_;
  std::vector<uint64_t> matches_;  // per rule
  std::vector<bool> done_;         // per rule: nth and after rules fire once
  std::atomic<uint64_t> ops_{0};
  std::atomic<uint64_t> fired_{0};
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_FAULT_FAULT_STORAGE_H_
