// Storage interface: the file operations a checkpoint needs, and the atomic commit protocol built on them.
// Backends: posix/ (the real filesystem) and memory/ (tests). Both pass storage_conformance.
#ifndef DISTCKPT_CORE_STORAGE_STORAGE_H_
#define DISTCKPT_CORE_STORAGE_STORAGE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace distckpt {

/// A file being written. WriteAt may be called from several threads at once on disjoint ranges.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  /// Writes all `size` bytes at `offset` (retries short writes and EINTR). Errors name the file.
  virtual Status WriteAt(uint64_t offset, const void* data, size_t size) = 0;
  /// Reserves space for `size` bytes (fallocate where supported; a no-op elsewhere). ENOSPC surfaces here early.
  virtual Status Preallocate(uint64_t size) = 0;
  /// Sets the final size (ftruncate).
  virtual Status Truncate(uint64_t size) = 0;
  /// Makes the data durable (fdatasync/fsync).
  virtual Status Sync() = 0;
  /// Closes; further calls fail. Destruction closes too (errors then are lost: call Close to see them).
  virtual Status Close() = 0;
  virtual const std::string& path() const = 0;
  /// A hint, given before the first write: the byte ranges {offset, length} that will be written (every other byte
  /// stays zero). A backend that uploads in parts sends a part once the bytes expected in it are in, rather than
  /// waiting for bytes that never come. The default ignores it.
  virtual void ExpectWrites(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {}
};

/// A file opened for reading. ReadAt is thread-safe.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  /// Reads exactly `size` bytes at `offset`. A read past the end is kCorrupt ("file X is truncated: ...").
  virtual Status ReadAt(uint64_t offset, void* data, size_t size) const = 0;
  virtual uint64_t size() const = 0;
  virtual const std::string& path() const = 0;

  /// The whole file mapped read-only, or nullptr where the backend or the file cannot be mapped (the default). The
  /// mapping lives as long as this object. Reading through it avoids the kernel's copy out of the page cache; the
  /// price is that a file truncated by someone else while mapped raises SIGBUS on access, as with any mapped reader
  /// (committed checkpoints are never modified in place, so this only happens when a file is sabotaged mid-read).
  virtual const char* Map() const { return nullptr; }
  /// True when every page of [offset, offset + size) is known to be in memory (the page cache), so that reading it
  /// through Map() costs no I/O. False when unknown, not resident, or the file is not mapped.
  virtual bool Resident(uint64_t offset, uint64_t size) const { return false; }
  /// Drops this process's mapping of the pages that lie wholly inside [offset, offset + size) (they stay in the page
  /// cache, and a later access maps them again), so that the resident set does not grow with the bytes read.
  virtual void ReleaseMapped(uint64_t offset, uint64_t size) const {}
  /// Starts reading [offset, offset + size) into the page cache without waiting for it (a hint; the default does
  /// nothing).
  virtual void WillNeed(uint64_t offset, uint64_t size) const {}
  /// Reads [offset, offset + size) past the page cache (O_DIRECT) into `data`: `offset`, `size` and `data` must be
  /// multiples of kDirectIoAlignment. Returns the bytes read, fewer than `size` only at the end of the file. For data
  /// not in the page cache, read once: no copy out of the cache and no cache pages evicted for it. kUnsupported where
  /// the backend or the file system cannot (the default; tmpfs, some network file systems), saying why: the caller
  /// reads with ReadAt instead.
  static constexpr uint64_t kDirectIoAlignment = 4096;
  virtual Result<uint64_t> ReadDirectAt(uint64_t offset, void* data, size_t size) const;
  /// Reads [offset, offset + size) into the page cache, waiting for it, and maps those pages into Map()'s mapping in
  /// one call (no page fault per page afterwards). An I/O error is returned here, naming the file, instead of
  /// raising SIGBUS at the first access. The default touches one byte per page of Map() (nothing without a mapping).
  virtual Status Populate(uint64_t offset, uint64_t size) const;
  /// Another handle on the same file (the same inode, never a file since renamed over the path) with its own file
  /// position and readahead state, or nullptr where the backend has none (then share this one). A thread that reads
  /// a region front to back through its own handle looks sequential to the kernel, which then reads ahead into large
  /// page-cache folios.
  virtual std::unique_ptr<ReadableFile> Reopen() const { return nullptr; }
  /// An identity of the bytes this file reads: two ReadableFiles (in any processes) with the same non-empty identity
  /// read the same bytes from the same cache (for POSIX: the same inode on the same running kernel). Empty: unknown.
  virtual std::string CacheIdentity() const { return {}; }
};

/// A directory opened once, for reading the files directly inside it. Files are reached through this handle, never by
/// resolving the directory's path again and never through a symbolic link, so a directory renamed, replaced or removed
/// after it was opened stays the one this handle reads (a file removed from it is gone). This is how a checkpoint is
/// read: nothing outside it can be opened, and what it is cannot change under an open reader. Thread-safe. Must not
/// outlive the Storage that opened it.
class Directory {
 public:
  virtual ~Directory() = default;
  /// The path it was opened with (for messages).
  virtual const std::string& path() const = 0;
  /// Opens the regular file `name` (a plain name, no '/') for reading. kNotFound if it is missing; kCorrupt, without
  /// opening it, if it is a symbolic link, a directory, a FIFO, a device or anything else but a regular file.
  virtual Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& name) = 0;
  /// Whether anything named `name` is in the directory (a symbolic link counts; it is not followed).
  virtual Result<bool> Exists(const std::string& name) = 0;
  /// A hint that about `count` files are about to be opened and kept open (a reader pinning a checkpoint's data
  /// files). Backends that hold a descriptor per file prepare for them at once; the default does nothing.
  virtual void ExpectOpenFiles(size_t count) { (void)count; }
  /// The directory `name` (a plain name) directly inside this one, never reached through a symbolic link. kNotFound
  /// if it is missing; kCorrupt if it is a link or not a directory. The default (backends without directories):
  /// kUnsupported.
  virtual Result<std::unique_ptr<Directory>> OpenSubdirectory(const std::string& name);
  /// This directory read as a snapshot of a Hugging Face hub cache repository, if it is one: the layout
  /// huggingface_hub writes, `<repo>/snapshots/<revision>/<file>` (or a directory below the revision), where each
  /// file is a relative symbolic link `../../blobs/<hash>` (one more `../` per level below the revision) into the
  /// repository's `blobs/` directory. The returned Directory reads the same directory; its OpenFile follows such a
  /// link, and only such a link: the link's text must be exactly that (a plain name after `blobs/`), and the blob is
  /// opened inside the repository's own `blobs/` directory (held open, reached from this directory's descriptor, never
  /// through a link) without following a link, and only if it is a regular file. Every other link is refused as
  /// OpenFile refuses it, saying why. nullptr when this directory is not below a `snapshots/<revision>` beside a
  /// `blobs/` directory; the default (backends without links): nullptr.
  virtual Result<std::unique_ptr<Directory>> OpenAsHubCacheSnapshot() { return std::unique_ptr<Directory>(); }
};

/// Held while a commit moves a checkpoint into place (Storage::LockDirectory); destroying it releases the lock.
class DirectoryLock {
 public:
  virtual ~DirectoryLock() = default;
};

/// How a checkpoint is made visible on a backend (FORMAT.md section 6).
enum class CommitProtocol {
  /// Write under a staging directory, then rename it into place (file systems).
  kRename,
  /// Write data files under nonce-qualified names directly below the checkpoint path, then the metadata last: its
  /// appearance is the commit (object stores, which have no rename; section 6.2).
  kMetadataLast,
};

/// A storage backend. Paths are plain strings ("/a/b/c"); the backend defines what they mean.
/// All methods are thread-safe. Error messages name the path and say what failed.
class Storage {
 public:
  virtual ~Storage() = default;
  virtual std::string name() const = 0;  ///< "posix", "memory"
  /// How checkpoints are committed here. Backends without Rename/Exchange (object stores) say kMetadataLast.
  virtual CommitProtocol commit_protocol() const { return CommitProtocol::kRename; }
  /// Writes `data` to `path` in one atomic, durable step (a reader sees all of it or what was there before). Without
  /// `replace`, kExists when something is at `path`. The default checks, then writes (a check a racing writer can
  /// beat); object stores override it with a conditional write.
  virtual Status Publish(const std::string& path, const std::string& data, bool replace);

  /// Creates (or truncates) a file for writing.
  virtual Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& path) = 0;
  virtual Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& path) = 0;
  /// Reads a whole file; kCorrupt if it is larger than max_size.
  virtual Result<std::string> ReadFile(const std::string& path, uint64_t max_size) = 0;
  /// Writes a whole file and syncs it.
  virtual Status WriteFileDurably(const std::string& path, const std::string& data) = 0;
  /// kNotFound if missing.
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
  virtual Result<bool> Exists(const std::string& path) = 0;
  virtual Result<bool> IsDirectory(const std::string& path) = 0;
  /// Creates one directory; kExists if present.
  virtual Status CreateDir(const std::string& path) = 0;
  /// fsyncs a directory so that entries created/renamed in it are durable.
  virtual Status SyncDir(const std::string& path) = 0;
  /// Renames a file or directory. Fails with kExists if `to` exists (never replaces).
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  /// Removes a file or a directory tree. OK if missing.
  virtual Status RemoveAll(const std::string& path) = 0;
  /// Removes the directory `path` if it is empty (POSIX rmdir: never a symbolic link, never anything inside); OK if it
  /// is missing or not empty (something else is there: it stays). Backends without directories: nothing to do.
  virtual Status RemoveEmptyDir(const std::string& path) { return OkStatus(); }
  /// Names (not paths) in a directory, sorted.
  virtual Result<std::vector<std::string>> ListDir(const std::string& path) = 0;

  /// Opens the directory `path` for reading files inside it (see Directory). Symbolic links within `path` itself are
  /// followed (a link "latest" -> "step-100" opens step-100); nothing is followed below it. kNotFound if it is missing
  /// or not a directory.
  virtual Result<std::unique_ptr<Directory>> OpenDirectory(const std::string& path) = 0;
  /// An identity of what is at `path` (a final symbolic link is not followed) that changes when anything else is put
  /// there, or when it is renamed; empty when nothing is there. The commit uses it to notice that another save
  /// replaced a checkpoint while this one ran.
  virtual Result<std::string> Identity(const std::string& path) = 0;
  /// Swaps `a` and `b` in one atomic step; both must exist. kUnsupported where the backend or the filesystem cannot
  /// (the commit then falls back to two renames).
  virtual Status Exchange(const std::string& a, const std::string& b) = 0;
  /// Takes an exclusive lock that serialises commits into directory `dir` across threads and processes, waiting at
  /// most `timeout` (kTimeout after that). kUnsupported where the filesystem has no such locks (the commit then goes on
  /// without). The lock is released when the returned object is destroyed, or when the process dies.
  virtual Result<std::unique_ptr<DirectoryLock>> LockDirectory(const std::string& dir,
                                                               std::chrono::milliseconds timeout) = 0;
};

/// Creates directory `path` and every missing directory above it (mkdir -p), each new one made durable in its parent
/// (SyncDir), so that a checkpoint saved below it survives a crash together with its path. OK if it exists as a
/// directory; kExists naming the path if something else is in the way. Backends without directories (object stores,
/// whose prefixes need no creating) are never asked: the commit protocol kMetadataLast does not call it.
Status CreateDirectories(Storage* storage, const std::string& path);

/// The real filesystem through POSIX calls (pread/pwrite, fsync, rename).
std::unique_ptr<Storage> NewPosixStorage();
/// An in-process filesystem for tests. Not durable, obviously.
std::unique_ptr<Storage> NewMemoryStorage();
/// The process-wide POSIX backend.
Storage* DefaultStorage();

/// Names of the metadata-last layout (CommitProtocol::kMetadataLast, FORMAT.md section 6.2), all directly below the
/// checkpoint path: "STAGING.<nonce>" is a save's marker (written first, removed after the commit), and a data file
/// "data-00000.bin" is written as "data-00000.<nonce>.bin", so that saves never write over each other's files.
std::string ObjectMarkerName(const std::string& nonce);
/// True if `name` is a marker; sets *nonce.
bool ParseObjectMarkerName(const std::string& name, std::string* nonce);
/// "data-00000.bin" + nonce -> "data-00000.<nonce>.bin".
std::string NoncedFileName(const std::string& name, const std::string& nonce);
/// True if `name` is a data file of the metadata-last layout ("data-<digits>.<16 hex>.bin"); sets *nonce.
bool ParseNoncedFileName(const std::string& name, std::string* nonce);
/// The text of a staging marker: host, pid, start time (UTC) and final path.
std::string StagingMarkerText(const std::string& final_path);

/// Marker file inside a staging directory (holds host, pid and start time as text). Its presence means "not
/// committed"; it is removed just before the rename.
constexpr char kStagingMarkerName[] = "STAGING";

/// The directory holding `path`: "a/b" -> "a", "/a" -> "/", "a" -> "." (trailing separators ignored; on an object
/// store, the key prefix above it).
std::string ParentDir(const std::string& path);
/// The last component of `path`: "a/b/" -> "b", "b" -> "b".
std::string BaseName(const std::string& path);

/// The staging directory for `final_path` and a nonce: "<parent>/<basename>.dckpt-staging-<nonce>".
std::string StagingPath(const std::string& final_path, const std::string& nonce);
/// True if a directory name looks like a staging directory; sets *final_name to the checkpoint name it is for.
bool ParseStagingName(const std::string& name, std::string* final_name);
/// A random 16-hex-digit nonce.
std::string NewNonce();

/// Where Commit (with overwrite) parks the previous checkpoint while the new one moves in:
/// "<parent>/<basename>.dckpt-old-<nonce>". It is removed right after the commit. One left behind beside a checkpoint
/// at the final path is garbage (failed removal); with nothing at the final path, the commit crashed between its two
/// renames, and either it or the staging directory (complete: its marker is already gone) can be renamed into place.
std::string ReplacedPath(const std::string& final_path, const std::string& nonce);
/// True if a directory name looks like a parked previous checkpoint; sets *final_name like ParseStagingName.
bool ParseReplacedName(const std::string& name, std::string* final_name);
/// Where a prune moves a directory it is about to remove, so that it leaves its name in one step:
/// "<parent>/<basename>.dckpt-deleting-<nonce>". One left behind is the leftover of an interrupted prune.
std::string DeletingPath(const std::string& final_path, const std::string& nonce);
/// True if a directory name looks like one a prune moved aside; sets *final_name like ParseStagingName.
bool ParseDeletingName(const std::string& name, std::string* final_name);

/// Whether a save of this process with this nonce is in progress: a StagedCheckpoint (or a copy of it) made with it
/// still exists. Judges the markers this process wrote: a save that failed left a marker naming a running process.
bool StagedSaveIsLive(const std::string& nonce);

/// A checkpoint being written under a staging name. Protocol (FORMAT.md "Commit"): create staging dir and marker ->
/// write + fsync data files -> write + fsync metadata -> remove marker -> fsync staging dir -> move to the final
/// path -> fsync the parent directory.
///
/// Racing saves to one path: Create records what is at the final path; Commit, holding the parent directory's commit
/// lock, moves the new checkpoint in only if the same thing is still there (compare-and-swap). Of two saves to one
/// path, the first to commit wins and the other fails with kExists, committing nothing.
class StagedCheckpoint {
 public:
  /// Coordinator side: fails with kExists if final_path exists (and !overwrite); creates the staging directory.
  /// `nonce` must be lower-case hex (NewNonce()), so that ParseStagingName recognises a directory left behind.
  static Result<StagedCheckpoint> Create(Storage* storage, const std::string& final_path, const std::string& nonce,
                                         bool overwrite);
  /// Create with a protocol other than the storage's own (any backend can run kMetadataLast).
  static Result<StagedCheckpoint> Create(Storage* storage, const std::string& final_path, const std::string& nonce,
                                         bool overwrite, CommitProtocol protocol);
  /// Other ranks: refer to the staging directory the coordinator created.
  static StagedCheckpoint Join(Storage* storage, const std::string& final_path, const std::string& nonce,
                               bool overwrite);

  /// Where files are written: the staging directory (kRename) or the final path itself (kMetadataLast).
  const std::string& staging_dir() const { return staging_dir_; }
  const std::string& final_path() const { return final_path_; }
  CommitProtocol protocol() const { return protocol_; }
  /// The name a data file gets in the checkpoint (and in its metadata): `name` itself (kRename), or
  /// NoncedFileName(name, nonce) (kMetadataLast).
  std::string FileName(const std::string& name) const;
  std::string StagingFile(const std::string& name) const { return staging_dir_ + "/" + name; }

  /// Writes the metadata and commits: kRename writes it into the staging directory then Commit()s; kMetadataLast
  /// publishes it at the final path (Storage::Publish; without overwrite, kExists if a checkpoint appeared
  /// meanwhile), then removes the marker and the files of the checkpoint it replaced (and garbage of earlier saves
  /// whose writers are gone: nonced files with no marker). A reader still reading the replaced checkpoint then fails
  /// with kNotFound naming the file; it never reads a mix.
  Status CommitWithMetadata(const std::string& metadata,
                            std::chrono::milliseconds lock_timeout = std::chrono::seconds(60));

  /// Makes the checkpoint visible at final_path, if what is there is still what Create found (else kExists). With
  /// overwrite, the previous checkpoint is swapped out in one atomic step where the storage can (Exchange), so the
  /// final path holds the old or the new checkpoint at every instant, and is removed afterwards; elsewhere it is
  /// renamed aside first. Waits at most `lock_timeout` for another commit into the same directory.
  Status Commit(std::chrono::milliseconds lock_timeout = std::chrono::seconds(60));
  /// Removes the staging directory (kMetadataLast: this save's files and marker). Safe to call after a failed Commit.
  Status Abort();

 private:
  StagedCheckpoint(Storage* storage, std::string final_path, std::string staging_dir, bool overwrite, std::string nonce,
                   std::string expected, CommitProtocol protocol = CommitProtocol::kRename)
      : storage_(storage),
        final_path_(std::move(final_path)),
        staging_dir_(std::move(staging_dir)),
        overwrite_(overwrite),
        nonce_(std::move(nonce)),
        expected_(std::move(expected)),
        protocol_(protocol),
        live_(HoldLiveNonce(nonce_)) {}
  // Registers `nonce` as a save of this process in progress until the last copy of the returned token goes.
  static std::shared_ptr<void> HoldLiveNonce(const std::string& nonce);
  // The kMetadataLast halves of Create, CommitWithMetadata and Abort (object_commit.cc).
  static Result<StagedCheckpoint> CreateMetadataLast(Storage* storage, const std::string& final_path,
                                                     const std::string& nonce, bool overwrite);
  Status CommitMetadataLast(const std::string& metadata);
  Status AbortMetadataLast();
  // The two ways into place: a rename where nothing is there, a swap (returning where the previous checkpoint went)
  // where an overwrite replaces one.
  Status RenameIntoPlace(const std::string& context);
  // After a move that cannot be made durable: puts back what was there and returns `why`.
  Status UndoMove(const std::string& previous, const Status& why);
  Result<std::string> SwapIntoPlace(const std::string& context);
  Storage* storage_;
  std::string final_path_;
  std::string staging_dir_;
  bool overwrite_;
  std::string nonce_;
  std::string expected_;  // Identity() of the final path when Create ran ("" = nothing there)
  CommitProtocol protocol_;
  std::shared_ptr<void> live_;  // keeps nonce_ in the process's live saves (StagedSaveIsLive) while any copy exists
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_STORAGE_H_
