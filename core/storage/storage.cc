// Staging names, nonces and the staged-commit protocol. Backend-independent: everything here goes through the
// Storage interface, so the memory backend exercises exactly the protocol the filesystem runs.
#include "core/storage/storage.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <set>

#include "core/storage/backend_util.h"

namespace distckpt {
namespace internal_storage {
namespace {

constexpr char kStagingInfix[] = ".dckpt-staging-";
constexpr char kReplacedInfix[] = ".dckpt-old-";
constexpr char kDeletingInfix[] = ".dckpt-deleting-";

// splitmix64's finaliser: a bijective mixer, so distinct inputs stay distinct.
uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Fills `out` from the kernel's CSPRNG; false if neither getrandom nor /dev/urandom is usable.
bool KernelRandom(uint64_t* out) {
  unsigned char* p = reinterpret_cast<unsigned char*>(out);
  size_t done = 0;
  while (done < sizeof(*out)) {
    ssize_t n = getrandom(p + done, sizeof(*out) - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // ENOSYS (old kernel) or seccomp: try the device instead.
    done += static_cast<size_t>(n);
  }
  if (done == sizeof(*out)) return true;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  done = 0;
  while (done < sizeof(*out)) {
    ssize_t n = read(fd, p + done, sizeof(*out) - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
  return done == sizeof(*out);
}

bool IsLowerHex(const std::string& s, size_t pos) {
  if (pos >= s.size()) return false;
  for (size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Accepts "<final_name><infix><hex nonce>" with a non-empty final name.
bool ParseSuffixedName(const std::string& name, const char* infix, std::string* final_name) {
  const std::string marker(infix);
  const size_t pos = name.rfind(marker);
  if (pos == std::string::npos || pos == 0) return false;
  if (!IsLowerHex(name, pos + marker.size())) return false;
  if (name.find('/') != std::string::npos) return false;
  if (final_name != nullptr) *final_name = name.substr(0, pos);
  return true;
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

std::string Quoted(const std::string& path) { return "'" + path + "'"; }

std::vector<std::string> LexicalComponents(const std::string& path) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    const std::string part = path.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    i = j + 1;
  }
  return parts;
}

std::string StripTrailingSlashes(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;
  return path.substr(0, end);
}

Status TruncatedFileError(const std::string& path, uint64_t offset, size_t size, uint64_t file_size) {
  return Corrupt("data file '" + path + "' is truncated: wanted " + std::to_string(size) + " bytes at offset " +
                 std::to_string(offset) + ", file has " + std::to_string(file_size) + " bytes");
}

Status ClosedFileError(const std::string& path, const char* operation) {
  return Status(StatusCode::kState, std::string(operation) + " '" + path + "': the file was already closed");
}

Status CheckRange(const std::string& path, uint64_t offset, size_t size) {
  constexpr uint64_t kMaxOffset = static_cast<uint64_t>(INT64_MAX);
  if (offset > kMaxOffset || size > kMaxOffset - offset) {
    return InvalidArgument("range of " + std::to_string(size) + " bytes at offset " + std::to_string(offset) + " in '" +
                           path + "' is beyond the largest file offset");
  }
  return OkStatus();
}

}  // namespace internal_storage

Result<uint64_t> ReadableFile::ReadDirectAt(uint64_t offset, void* data, size_t size) const {
  (void)offset, (void)data, (void)size;
  return Status(StatusCode::kUnsupported, "'" + path() + "': this storage has no direct (O_DIRECT) reads");
}

Status ReadableFile::Populate(uint64_t offset, uint64_t size) const {
  const char* map = Map();
  if (map == nullptr || size == 0) return OkStatus();
  DCKPT_RETURN_IF_ERROR(internal_storage::CheckRange(path(), offset, size));
  volatile char sink = 0;
  for (uint64_t at = offset; at < offset + size; at += 4096) sink = sink + map[at];
  sink = sink + map[offset + size - 1];
  return OkStatus();
}

using internal_storage::StripTrailingSlashes;

std::string ParentDir(const std::string& path) {
  const std::string p = StripTrailingSlashes(path);
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const std::string p = StripTrailingSlashes(path);
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string StagingPath(const std::string& final_path, const std::string& nonce) {
  // "<parent>/<basename>.dckpt-staging-<nonce>" is the final path with a suffix: same directory, so the commit is a
  // rename within one filesystem.
  return StripTrailingSlashes(final_path) + internal_storage::kStagingInfix + nonce;
}

bool ParseStagingName(const std::string& name, std::string* final_name) {
  return internal_storage::ParseSuffixedName(name, internal_storage::kStagingInfix, final_name);
}

std::string ReplacedPath(const std::string& final_path, const std::string& nonce) {
  return StripTrailingSlashes(final_path) + internal_storage::kReplacedInfix + nonce;
}

bool ParseReplacedName(const std::string& name, std::string* final_name) {
  return internal_storage::ParseSuffixedName(name, internal_storage::kReplacedInfix, final_name);
}

std::string DeletingPath(const std::string& final_path, const std::string& nonce) {
  return StripTrailingSlashes(final_path) + internal_storage::kDeletingInfix + nonce;
}

bool ParseDeletingName(const std::string& name, std::string* final_name) {
  return internal_storage::ParseSuffixedName(name, internal_storage::kDeletingInfix, final_name);
}

std::string ObjectMarkerName(const std::string& nonce) { return std::string(kStagingMarkerName) + "." + nonce; }

bool ParseObjectMarkerName(const std::string& name, std::string* nonce) {
  const std::string prefix = std::string(kStagingMarkerName) + ".";
  if (name.size() != prefix.size() + 16 || name.compare(0, prefix.size(), prefix) != 0) return false;
  if (!internal_storage::IsLowerHex(name, prefix.size())) return false;
  if (nonce != nullptr) *nonce = name.substr(prefix.size());
  return true;
}

std::string NoncedFileName(const std::string& name, const std::string& nonce) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return name + "." + nonce;
  return name.substr(0, dot) + "." + nonce + name.substr(dot);
}

bool ParseNoncedFileName(const std::string& name, std::string* nonce) {
  // "data-" digits "." 16 hex ".bin"
  constexpr size_t kNonce = 16;
  const std::string prefix = "data-", suffix = ".bin";
  if (name.size() < prefix.size() + 1 + 1 + kNonce + suffix.size()) return false;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  const size_t nonce_at = name.size() - suffix.size() - kNonce;
  if (name[nonce_at - 1] != '.') return false;
  for (size_t i = prefix.size(); i + 1 < nonce_at; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  const std::string hex = name.substr(nonce_at, kNonce);
  if (!internal_storage::IsLowerHex(hex, 0)) return false;
  if (nonce != nullptr) *nonce = hex;
  return true;
}

std::string NewNonce() {
  // Kernel randomness alone would do; time, pid and a counter are mixed in so two nonces from one process differ
  // even where the kernel source is unavailable (seccomp sandboxes, no /dev).
  static std::atomic<uint64_t> counter{0};
  uint64_t random = 0;
  (void)internal_storage::KernelRandom(&random);
  const uint64_t time_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  uint64_t x = internal_storage::Mix64(random ^ time_ns);
  x = internal_storage::Mix64(x ^ (static_cast<uint64_t>(getpid()) << 32) ^ counter.fetch_add(1));
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

namespace {

// An overwrite removes what it replaces, so it replaces only a checkpoint (a directory with a metadata file, damaged
// or not) or an empty directory: never a directory of other files, nor a file. A symbolic link at the path is
// replaced as a link; its target is never touched.
Status CheckReplaceable(Storage* storage, const std::string& path) {
  const std::string why = "'" + path +
                          "' exists and is not a distckpt checkpoint: overwrite replaces only a "
                          "checkpoint (a directory holding metadata.dckpt) or an empty directory, and never removes "
                          "anything else; move it away or choose another path";
  DCKPT_ASSIGN_OR_RETURN(bool is_dir, storage->IsDirectory(path));
  if (!is_dir) return Status(StatusCode::kExists, why);
  DCKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, storage->ListDir(path));
  if (names.empty()) return OkStatus();
  // The metadata file's name is fixed by FORMAT.md (kMetadataFileName in core/format, which storage does not use).
  if (std::find(names.begin(), names.end(), "metadata.dckpt") == names.end()) return Status(StatusCode::kExists, why);
  return OkStatus();
}

}  // namespace

Status CreateDirectories(Storage* storage, const std::string& path) {
  const std::string clean = StripTrailingSlashes(path);
  DCKPT_ASSIGN_OR_RETURN(bool is_dir, storage->IsDirectory(clean));
  if (is_dir) return OkStatus();
  DCKPT_ASSIGN_OR_RETURN(bool exists, storage->Exists(clean));
  const std::string in_the_way = "'" + clean + "' exists and is not a directory";
  if (exists) return Status(StatusCode::kExists, in_the_way);
  const std::string parent = ParentDir(clean);
  if (parent == clean) return NotFound("directory '" + clean + "' does not exist");  // "/" or "." missing: no parent
  DCKPT_RETURN_IF_ERROR(CreateDirectories(storage, parent));
  Status made = storage->CreateDir(clean);
  if (made.code() == StatusCode::kExists) {  // another process made it meanwhile (mkdir -p does the same)
    DCKPT_ASSIGN_OR_RETURN(is_dir, storage->IsDirectory(clean));
    return is_dir ? OkStatus() : Status(StatusCode::kExists, in_the_way);
  }
  DCKPT_RETURN_IF_ERROR(made);
  // The new entry is durable only once its parent is synced: a crash must not lose the directory (and with it a
  // checkpoint committed below it).
  return storage->SyncDir(parent);
}

Result<std::unique_ptr<Directory>> Directory::OpenSubdirectory(const std::string& name) {
  return Status(StatusCode::kUnsupported,
                "opening directory '" + name + "' inside '" + path() + "': this storage has no directories");
}

Status Storage::Publish(const std::string& path, const std::string& data, bool replace) {
  if (!replace) {
    DCKPT_ASSIGN_OR_RETURN(bool exists, Exists(path));
    if (exists) return Status(StatusCode::kExists, "'" + path + "' already exists");
  }
  return WriteFileDurably(path, data);
}

namespace {

std::mutex& LiveNoncesMutex() {
  static std::mutex* mu = new std::mutex;  // never destroyed: saves may end during static destruction
  return *mu;
}

std::multiset<std::string>& LiveNonces() {
  static auto* nonces = new std::multiset<std::string>;
  return *nonces;
}

}  // namespace

std::shared_ptr<void> StagedCheckpoint::HoldLiveNonce(const std::string& nonce) {
  {
    std::lock_guard<std::mutex> lock(LiveNoncesMutex());
    LiveNonces().insert(nonce);
  }
  return std::shared_ptr<void>(new std::string(nonce), [](void* p) {
    auto* held = static_cast<std::string*>(p);
    {
      std::lock_guard<std::mutex> lock(LiveNoncesMutex());
      auto it = LiveNonces().find(*held);
      if (it != LiveNonces().end()) LiveNonces().erase(it);
    }
    delete held;
  });
}

bool StagedSaveIsLive(const std::string& nonce) {
  std::lock_guard<std::mutex> lock(LiveNoncesMutex());
  return LiveNonces().count(nonce) != 0;
}

std::string StagingMarkerText(const std::string& final_path) {
  return "distckpt staging directory (not committed)\nhost: " + internal_storage::HostName() +
         "\npid: " + std::to_string(getpid()) + "\nstarted_utc: " + internal_storage::UtcNow() +
         "\nfinal_path: " + final_path + "\n";
}

Result<StagedCheckpoint> StagedCheckpoint::Create(Storage* storage, const std::string& final_path,
                                                  const std::string& nonce, bool overwrite) {
  return Create(storage, final_path, nonce, overwrite, storage->commit_protocol());
}

Result<StagedCheckpoint> StagedCheckpoint::Create(Storage* storage, const std::string& final_path,
                                                  const std::string& nonce, bool overwrite, CommitProtocol protocol) {
  if (!internal_storage::IsLowerHex(nonce, 0)) {
    return InvalidArgument("staging nonce '" + nonce + "' for checkpoint '" + final_path +
                           "' must be lower-case hex digits (use NewNonce())");
  }
  const std::string final_clean = StripTrailingSlashes(final_path);
  if (final_clean.empty() || final_clean == "/") {
    return InvalidArgument("'" + final_path + "' cannot be a checkpoint path");
  }
  if (protocol == CommitProtocol::kMetadataLast) return CreateMetadataLast(storage, final_clean, nonce, overwrite);
  DCKPT_ASSIGN_OR_RETURN(bool exists, storage->Exists(final_clean));
  if (exists && !overwrite) {
    return Status(StatusCode::kExists,
                  "checkpoint '" + final_clean + "' already exists; pass overwrite or choose another path");
  }
  if (exists) DCKPT_RETURN_IF_ERROR(CheckReplaceable(storage, final_clean));
  // A missing parent is made, as torch.distributed.checkpoint and `mkdir -p` do (each new directory made durable).
  const std::string parent = ParentDir(final_clean);
  DCKPT_RETURN_IF_ERROR(
      CreateDirectories(storage, parent)
          .WithContext("creating the parent directory '" + parent + "' of checkpoint '" + final_clean + "'"));

  // What the commit must still find at the final path (compare-and-swap against racing saves).
  DCKPT_ASSIGN_OR_RETURN(std::string expected, storage->Identity(final_clean));
  StagedCheckpoint staged(storage, final_clean, StagingPath(final_clean, nonce), overwrite, nonce, std::move(expected));
  const std::string context = "creating staging directory for checkpoint '" + final_clean + "'";
  DCKPT_RETURN_IF_ERROR(storage->CreateDir(staged.staging_dir_).WithContext(context));
  // The marker says who was writing and when, so a staging directory left by a crash can be judged and removed.
  Status st = storage->WriteFileDurably(staged.StagingFile(kStagingMarkerName), StagingMarkerText(final_clean));
  if (st.ok()) st = storage->SyncDir(staged.staging_dir_);
  if (!st.ok()) {
    (void)storage->RemoveAll(staged.staging_dir_);
    return st.WithContext(context);
  }
  return staged;
}

StagedCheckpoint StagedCheckpoint::Join(Storage* storage, const std::string& final_path, const std::string& nonce,
                                        bool overwrite) {
  const std::string final_clean = StripTrailingSlashes(final_path);
  if (storage->commit_protocol() == CommitProtocol::kMetadataLast) {
    return StagedCheckpoint(storage, final_clean, final_clean, overwrite, nonce, "", CommitProtocol::kMetadataLast);
  }
  return StagedCheckpoint(storage, final_clean, StagingPath(final_clean, nonce), overwrite, nonce, "");
}

std::string StagedCheckpoint::FileName(const std::string& name) const {
  return protocol_ == CommitProtocol::kMetadataLast ? NoncedFileName(name, nonce_) : name;
}

Status StagedCheckpoint::CommitWithMetadata(const std::string& metadata, std::chrono::milliseconds lock_timeout) {
  if (protocol_ == CommitProtocol::kMetadataLast) return CommitMetadataLast(metadata);
  DCKPT_RETURN_IF_ERROR(storage_->WriteFileDurably(StagingFile("metadata.dckpt"), metadata));
  return Commit(lock_timeout);
}

Status StagedCheckpoint::Commit(std::chrono::milliseconds lock_timeout) {
  const std::string context = "committing checkpoint '" + final_path_ + "' from '" + staging_dir_ + "'";
  // Marker gone + directory synced before the move: whatever appears at final_path is complete.
  DCKPT_RETURN_IF_ERROR(storage_->RemoveAll(StagingFile(kStagingMarkerName)).WithContext(context));
  DCKPT_RETURN_IF_ERROR(storage_->SyncDir(staging_dir_).WithContext(context));

  std::string previous;  // where the replaced checkpoint ends up, removed once the lock is released
  {
    // Commits into one directory take turns, so that the check below and the move cannot interleave with another
    // save's. Without locks (some network filesystems) the no-replace rename still stops a non-overwrite race.
    auto lock = storage_->LockDirectory(ParentDir(final_path_), lock_timeout);
    if (!lock.ok() && lock.status().code() != StatusCode::kUnsupported) return lock.status().WithContext(context);
    Result<std::string> current = storage_->Identity(final_path_);
    if (!current.ok()) return current.status().WithContext(context);
    if (*current != expected_) {
      return Status(StatusCode::kExists,
                    context + ": another save committed a checkpoint at '" + final_path_ +
                        "' (or something else changed what is there) while this save was running; this save "
                        "committed nothing and left what is there untouched");
    }
    Result<std::string> moved = current->empty() ? Result<std::string>(std::string()) : SwapIntoPlace(context);
    if (!moved.ok()) return moved.status();
    previous = std::move(moved).value();
    if (current->empty()) DCKPT_RETURN_IF_ERROR(RenameIntoPlace(context));
    Status synced = storage_->SyncDir(ParentDir(final_path_));
    if (!synced.ok()) return UndoMove(previous, synced.WithContext(context));
  }
  if (!previous.empty()) {
    // The new checkpoint is durable at final_path, so the commit has succeeded whatever happens next. A failed
    // removal leaves a "<final>.dckpt-old-<nonce>" directory that ParseReplacedName recognises for cleanup; it is
    // not reported as a failed save.
    (void)storage_->RemoveAll(previous);
  }
  return OkStatus();
}

Status StagedCheckpoint::UndoMove(const std::string& previous, const Status& why) {
  // The move happened but cannot be made durable: a save that reports failure must not leave its checkpoint at the
  // final path, so put things back as they were (the previous checkpoint, or nothing) and let Abort remove the new one.
  Status undone;
  if (previous.empty()) {
    undone = storage_->Rename(final_path_, staging_dir_);
  } else {
    undone = storage_->Exchange(previous, final_path_);
    if (undone.code() == StatusCode::kUnsupported) {
      undone = storage_->Rename(final_path_, staging_dir_);
      if (undone.ok()) undone = storage_->Rename(previous, final_path_);
    } else if (undone.ok()) {
      staging_dir_ = previous;  // the new checkpoint is back under its parked name
    }
  }
  if (undone.ok()) return why;
  return Status(why.code(), why.message() + "; undoing the move also failed (" + undone.message() + "): '" +
                                final_path_ + "' may hold the new checkpoint, complete but perhaps not durable");
}

Status StagedCheckpoint::RenameIntoPlace(const std::string& context) {
  Status renamed = storage_->Rename(staging_dir_, final_path_);
  if (renamed.code() == StatusCode::kExists) {
    // Something appeared at the final path after the check (a writer that does not take the lock).
    return Status(StatusCode::kExists, context + ": '" + final_path_ +
                                           "' appeared while this save was committing; this save committed nothing");
  }
  return renamed.WithContext(context);
}

Result<std::string> StagedCheckpoint::SwapIntoPlace(const std::string& context) {
  // First the new checkpoint takes the name of a replaced one: from here on, whatever a crash leaves under a
  // ".dckpt-old-" name is garbage, and the final path holds the old checkpoint until the swap.
  const std::string incoming = ReplacedPath(final_path_, nonce_);
  DCKPT_RETURN_IF_ERROR(storage_->Rename(staging_dir_, incoming).WithContext(context));
  staging_dir_ = incoming;  // what Abort removes if the rest fails
  Status swapped = storage_->Exchange(incoming, final_path_);
  if (swapped.ok()) return incoming;  // now holds the previous checkpoint
  if (swapped.code() != StatusCode::kUnsupported) return swapped.WithContext(context);
  // No atomic swap here: move the previous checkpoint aside, then the new one in. Between the two renames the final
  // path is empty (FORMAT.md section 6 says where that leaves a crash).
  const std::string aside = ReplacedPath(final_path_, NewNonce());
  DCKPT_RETURN_IF_ERROR(storage_->Rename(final_path_, aside).WithContext(context));
  Status renamed = storage_->Rename(incoming, final_path_);
  if (!renamed.ok()) {
    Status restored = storage_->Rename(aside, final_path_);
    if (!restored.ok()) {
      return Status(renamed.code(), context + ": " + renamed.message() +
                                        "; moving the previous checkpoint back from '" + aside + "' also failed (" +
                                        restored.message() + "); it is intact there, rename it back by hand");
    }
    return renamed.WithContext(context);
  }
  return aside;
}

Status StagedCheckpoint::Abort() {
  if (protocol_ == CommitProtocol::kMetadataLast) return AbortMetadataLast();
  return storage_->RemoveAll(staging_dir_).WithContext("aborting checkpoint '" + final_path_ + "'");
}

}  // namespace distckpt
