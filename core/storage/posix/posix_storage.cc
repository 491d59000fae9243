// The real filesystem through POSIX calls on raw descriptors.
//
// The data path (WriteAt/ReadAt) is positional I/O with no locks: the engine drives many threads at one file on
// disjoint ranges, and pread/pwrite need no shared file offset.
//
// Large writes bypass the page cache: a WritableFile also holds an O_DIRECT descriptor, and WriteAt sends the
// page-aligned body of a large write at a page-aligned offset through it (straight from the caller's buffer when that
// is page-aligned, else through a per-thread aligned bounce buffer), and only the sub-page tail through the page
// cache. On the bench machine (bench/NOTES.md) this made a 4-rank durable save faster, since fdatasync no longer waits
// for gigabytes of dirty pages to be written back, and the saving process stops filling the page cache. The format
// aligns chunks to 4 KiB, and distinct chunks never share a page, so the two descriptors never write the same page.
// Where O_DIRECT is refused (tmpfs, some FUSE filesystems) every write goes through the page cache, as before.
#include "core/storage/posix/posix_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/storage/backend_util.h"
#include "core/storage/storage.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)  // linux/fs.h; older libcs do not define it
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace distckpt {
namespace internal_storage {
namespace {

static_assert(sizeof(off_t) == 8, "distckpt needs 64-bit file offsets (_FILE_OFFSET_BITS=64)");

// Linux moves at most this much in one read/write (MAX_RW_COUNT); larger requests just come back short.
constexpr size_t kMaxIoChunk = 0x7ffff000;

// Retries `f` while it fails with EINTR. Only for calls where a retry is harmless (not close()).
template <typename F>
auto RetryOnEintr(F f) -> decltype(f()) {
  decltype(f()) r;
  do {
    r = f();
  } while (r == -1 && errno == EINTR);
  return r;
}

// Owns a descriptor on the non-data paths (ReadFile, WriteFileDurably, SyncDir) so early returns cannot leak it.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  /// Gives up the descriptor (the caller closes it).
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// Closes the descriptor held, and holds `fd` instead.
  void Reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  /// Closes now and reports the error, which the destructor would swallow. See PosixWritableFile::Close on EINTR.
  Status Close(const std::string& path) {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && errno != EINTR) return ErrnoError(errno, "closing " + Quoted(path));
    return OkStatus();
  }

 private:
  int fd_;
};

// Writes all of [data, data + size) at `offset`, resuming after short writes and EINTR.
Status PwriteAll(int fd, uint64_t offset, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, p, std::min(size, kMaxIoChunk), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "writing " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                                   " to " + Quoted(path));
    }
    if (n == 0) {
      // POSIX allows it only for size 0; looping on it would spin forever.
      return IoError("writing to " + Quoted(path) + " at offset " + std::to_string(offset) +
                     ": the kernel accepted no bytes");
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
}

// O_DIRECT needs the offset, the length and the buffer aligned to the device's logical block; a page covers every
// block size in use.
constexpr uint64_t kDirectAlignment = 4096;
// Writes shorter than this go through the page cache: small chunks (norms, biases) gain nothing from O_DIRECT.
constexpr size_t kMinDirectWrite = 256 << 10;
// Size of the per-thread bounce buffer for unaligned caller buffers (the engine writes segments of 8 MiB).
constexpr size_t kBounceBytes = 8 << 20;

// The calling thread's aligned bounce buffer, allocated on first use and freed when the thread exits.
char* BounceBuffer() {
  struct Holder {
    char* p = nullptr;
    ~Holder() { std::free(p); }
  };
  thread_local Holder holder;
  if (holder.p == nullptr) holder.p = static_cast<char*>(std::aligned_alloc(kDirectAlignment, kBounceBytes));
  return holder.p;
}

bool Aligned(uint64_t x) { return x % kDirectAlignment == 0; }

class PosixWritableFile final : public WritableFile {
 public:
  /// `direct_fd`: the same file opened with O_DIRECT, or -1.
  PosixWritableFile(int fd, int direct_fd, std::string path) : fd_(fd), direct_fd_(direct_fd), path_(std::move(path)) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }

  Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    if (fd_ < 0) return ClosedFileError(path_, "writing to");
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, offset, size));
    const char* p = static_cast<const char*>(data);
    if (direct_fd_ >= 0 && size >= kMinDirectWrite && Aligned(offset)) {
      const size_t body = size / kDirectAlignment * kDirectAlignment;
      DCKPT_RETURN_IF_ERROR(WriteDirect(offset, p, body));
      offset += body;
      p += body;
      size -= body;
    }
    return PwriteAll(fd_, offset, p, size, path_);
  }

  Status Preallocate(uint64_t size) override {
    if (fd_ < 0) return ClosedFileError(path_, "preallocating");
    if (size == 0) return OkStatus();
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, 0, size));
#ifdef __linux__
    // fallocate rather than posix_fallocate: where the filesystem cannot preallocate, glibc's posix_fallocate
    // "emulates" it by writing a byte into every block, which doubles the I/O of a multi-GiB checkpoint.
    const int rc = RetryOnEintr([&] { return ::fallocate(fd_, 0, 0, static_cast<off_t>(size)); });
    const int err = rc == 0 ? 0 : errno;
#else
    int err;
    do {
      err = ::posix_fallocate(fd_, 0, static_cast<off_t>(size));
    } while (err == EINTR);
#endif
    // Not supported by this filesystem (EOPNOTSUPP, which equals ENOTSUP on Linux), this kernel (ENOSYS) or this
    // kind of file (EINVAL, e.g. some FUSE and network filesystems): preallocation is only an optimisation.
    if (err == 0 || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) return OkStatus();
    return ErrnoError(err, "preallocating " + std::to_string(size) + " bytes for " + Quoted(path_));
  }

  Status Truncate(uint64_t size) override {
    if (fd_ < 0) return ClosedFileError(path_, "truncating");
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, 0, size));
    if (RetryOnEintr([&] { return ::ftruncate(fd_, static_cast<off_t>(size)); }) != 0) {
      return ErrnoError(errno, "setting the size of " + Quoted(path_) + " to " + std::to_string(size) + " bytes");
    }
    return OkStatus();
  }

  Status Sync() override {
    if (fd_ < 0) return ClosedFileError(path_, "syncing");
    // fdatasync also flushes the file size, which is all the metadata a reader needs; the directory entry is made
    // durable separately (SyncDir). A real I/O error is never retried: after a failed writeback Linux may mark the
    // pages clean, so a second fdatasync can "succeed" without the data being on disk.
    if (RetryOnEintr([&] { return ::fdatasync(fd_); }) != 0) return ErrnoError(errno, "syncing " + Quoted(path_));
    return OkStatus();
  }

  Status Close() override {
    if (fd_ < 0) return ClosedFileError(path_, "closing");
    const int fd = fd_;
    fd_ = -1;
    if (direct_fd_ >= 0) {
      ::close(direct_fd_);  // wrote nothing that Sync has not already made durable through fd_
      direct_fd_ = -1;
    }
    // Linux releases the descriptor even when close() fails, so it is never retried (a retry could close a
    // descriptor another thread has just been given). EINTR means the release happened; durability comes from
    // Sync, not from close.
    if (::close(fd) != 0 && errno != EINTR) return ErrnoError(errno, "closing " + Quoted(path_));
    return OkStatus();
  }

  const std::string& path() const override { return path_; }

 private:
  // Writes `size` bytes (a multiple of kDirectAlignment) at the aligned `offset` through the O_DIRECT descriptor.
  // Falls back to the page cache where the filesystem rejects a direct write (EINVAL) or no bounce buffer exists.
  Status WriteDirect(uint64_t offset, const char* data, size_t size) {
    const bool aligned = reinterpret_cast<uintptr_t>(data) % kDirectAlignment == 0;
    char* bounce = aligned ? nullptr : BounceBuffer();
    if (!aligned && bounce == nullptr) return PwriteAll(fd_, offset, data, size, path_);
    size_t done = 0;
    while (done < size) {
      const size_t n = aligned ? std::min(size - done, kMaxIoChunk / kDirectAlignment * kDirectAlignment)
                               : std::min(kBounceBytes, size - done);
      const char* from = data + done;
      if (!aligned) from = static_cast<const char*>(std::memcpy(bounce, from, n));
      const ssize_t w = ::pwrite(direct_fd_, from, n, static_cast<off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      // EINVAL: this filesystem takes O_DIRECT opens but not these writes. A short write leaves an unaligned rest.
      // Either way the page cache takes the remainder.
      if (w <= 0 || static_cast<size_t>(w) != n) {
        if (w < 0 && errno != EINVAL) {
          return ErrnoError(errno, "writing " + std::to_string(n) + " bytes at offset " +
                                       std::to_string(offset + done) + " to " + Quoted(path_));
        }
        if (w > 0) done += static_cast<size_t>(w);
        return PwriteAll(fd_, offset + done, data + done, size - done, path_);
      }
      done += n;
    }
    return OkStatus();
  }

  int fd_;         // -1 once closed; Close racing with other calls on the same file is a caller bug
  int direct_fd_;  // O_DIRECT descriptor of the same file, or -1
  const std::string path_;
};

// cachestat(2), Linux 6.5; the same number on every architecture (the unified syscall table).
constexpr long kSysCachestat = 451;

// This boot of this kernel: files with the same (device, inode) under the same boot id share one page cache.
const std::string& BootId() {
  static const std::string id = [] {
    std::string s;
    if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
      char buf[64] = {0};
      if (std::fgets(buf, sizeof buf, f) != nullptr) s = buf;
      std::fclose(f);
    }
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }();
  return id;
}

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(int fd, std::string path, const struct stat& st)
      : fd_(fd), path_(std::move(path)), size_(static_cast<uint64_t>(st.st_size)) {
    if (!BootId().empty()) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s:%llx:%llx:%llx:%lld.%09ld", BootId().c_str(),
                    static_cast<unsigned long long>(st.st_dev), static_cast<unsigned long long>(st.st_ino),
                    static_cast<unsigned long long>(st.st_size), static_cast<long long>(st.st_mtim.tv_sec),
                    static_cast<long>(st.st_mtim.tv_nsec));
      identity_ = buf;
    }
  }
  ~PosixReadableFile() override {
    if (map_ != nullptr) ::munmap(const_cast<char*>(map_), size_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
    ::close(fd_);
  }

  Result<uint64_t> ReadDirectAt(uint64_t offset, void* data, size_t size) const override {
    constexpr uint64_t kAlign = kDirectIoAlignment;
    if (offset % kAlign != 0 || size % kAlign != 0 || reinterpret_cast<uintptr_t>(data) % kAlign != 0) {
      return InvalidArgument("direct read of " + Quoted(path_) + ": offset " + std::to_string(offset) + ", size " +
                             std::to_string(size) + " and buffer must be multiples of " + std::to_string(kAlign));
    }
    // A second descriptor on the same inode (never the path again: it may name another file by now), opened on first
    // use; a file system that refuses O_DIRECT (tmpfs) says so once.
    std::call_once(direct_once_, [this] {
      const std::string self = "/proc/self/fd/" + std::to_string(fd_);
      direct_fd_ = RetryOnEintr([&] { return ::open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC); });
      if (direct_fd_ < 0) direct_errno_ = errno;
    });
    if (direct_fd_ < 0) {
      return Status(StatusCode::kUnsupported,
                    "direct (O_DIRECT) reads of " + Quoted(path_) + ": " + std::strerror(direct_errno_));
    }
    char* p = static_cast<char*>(data);
    uint64_t done = 0;
    while (done < size) {
      const ssize_t n = ::pread(direct_fd_, p + done, std::min<uint64_t>(size - done, kMaxIoChunk),
                                static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        // EINVAL: the file system's logical block is larger than kAlign, or it takes no direct I/O after all.
        if (errno == EINVAL) {
          return Status(StatusCode::kUnsupported,
                        "direct (O_DIRECT) reads of " + Quoted(path_) + ": " + std::strerror(errno));
        }
        return ErrnoError(errno, "reading " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                                     " from " + Quoted(path_) + " (O_DIRECT)");
      }
      if (n == 0) break;  // the end of the file
      done += static_cast<uint64_t>(n);
      if (static_cast<uint64_t>(n) % kAlign != 0) break;  // a short read ends at the end of the file
    }
    return done;
  }

  const char* Map() const override {
    std::call_once(map_once_, [this] {
      if (size_ == 0 || size_ > static_cast<uint64_t>(SIZE_MAX)) return;
      void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
      if (p != MAP_FAILED) map_ = static_cast<const char*>(p);
    });
    return map_;
  }

  bool Resident(uint64_t offset, uint64_t size) const override {
    const char* base = Map();
    if (base == nullptr || offset > size_ || size > size_ - offset) return false;
    if (size == 0) return true;
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t lo = offset / page * page, hi = offset + size;
    const size_t pages = static_cast<size_t>((hi - lo + page - 1) / page);
    // cachestat (Linux >= 6.5) counts the cached pages of a range folio by folio; mincore looks up every page.
    static std::atomic<bool> has_cachestat{true};
    if (has_cachestat.load(std::memory_order_relaxed)) {
      struct {
        uint64_t off, len;
      } range{lo, hi - lo};
      struct {
        uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
      } stat{};
      if (::syscall(kSysCachestat, fd_, &range, &stat, 0) == 0) return stat.nr_cache >= pages;
      // ENOSYS: an older kernel; EPERM: a file this process may not write (where mincore is limited too).
      if (errno == ENOSYS) has_cachestat.store(false, std::memory_order_relaxed);
    }
    thread_local std::vector<unsigned char> vec;
    if (vec.size() < pages) vec.resize(pages);
    // mincore reports the page cache for files the caller may write; for others only pages this process has mapped
    // already (Linux >= 5.0), so a false "not resident" only costs the pread path.
    if (::mincore(const_cast<char*>(base + lo), static_cast<size_t>(hi - lo), vec.data()) != 0) return false;
    for (size_t i = 0; i < pages; ++i) {
      if ((vec[i] & 1) == 0) return false;
    }
    return true;
  }

  void ReleaseMapped(uint64_t offset, uint64_t size) const override {
    if (map_ == nullptr || offset > size_ || size > size_ - offset) return;
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t lo = (offset + page - 1) / page * page, hi = (offset + size) / page * page;
    // On a shared file mapping MADV_DONTNEED only removes page table entries; the data stays in the page cache.
    if (hi > lo) (void)::madvise(const_cast<char*>(map_ + lo), static_cast<size_t>(hi - lo), MADV_DONTNEED);
  }

  void WillNeed(uint64_t offset, uint64_t size) const override {
    if (offset < size_ && size > 0) {
      (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(std::min(size, size_ - offset)),
                            POSIX_FADV_WILLNEED);
    }
  }

  Status Populate(uint64_t offset, uint64_t size) const override {
    const char* base = Map();
    if (base == nullptr || size == 0) return OkStatus();
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, offset, size));
    static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t lo = offset / page * page, hi = offset + size;
    static std::atomic<bool> has_populate{true};
    if (has_populate.load(std::memory_order_relaxed)) {
      // MADV_POPULATE_READ (Linux 5.14): faults the range in, mapped, in one call; errors come back as errno.
      constexpr int kMadvPopulateRead = 22;
      if (::madvise(const_cast<char*>(base + lo), static_cast<size_t>(hi - lo), kMadvPopulateRead) == 0) {
        return OkStatus();
      }
      if (errno != EINVAL) {
        return ErrnoError(errno, "reading bytes " + std::to_string(offset) + ".." + std::to_string(offset + size) +
                                     " of " + Quoted(path_) + " into memory");
      }
      has_populate.store(false, std::memory_order_relaxed);  // an older kernel
    }
    return ReadableFile::Populate(offset, size);
  }

  std::string CacheIdentity() const override { return identity_; }

  std::unique_ptr<ReadableFile> Reopen() const override {
    // /proc/self/fd/N opens the inode this descriptor refers to, not whatever the path names now.
    const std::string self = "/proc/self/fd/" + std::to_string(fd_);
    const int fd = RetryOnEintr([&] { return ::open(self.c_str(), O_RDONLY | O_CLOEXEC); });
    if (fd < 0) return nullptr;
    struct stat st;
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != size_) {
      ::close(fd);
      return nullptr;
    }
    return std::unique_ptr<ReadableFile>(new PosixReadableFile(fd, path_, st));
  }

  Status ReadAt(uint64_t offset, void* data, size_t size) const override {
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, offset, size));
    char* p = static_cast<char*>(data);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pread(fd_, p + done, std::min(size - done, kMaxIoChunk), static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, "reading " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                                     " from " + Quoted(path_));
      }
      if (n == 0) {
        // EOF before `size` bytes. Report the size the file has now (it may differ from size() at open).
        struct stat st;
        const uint64_t now = ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : offset + done;
        return TruncatedFileError(path_, offset, size, now);
      }
      done += static_cast<size_t>(n);
    }
    return OkStatus();
  }

  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  const int fd_;
  const std::string path_;
  const uint64_t size_;
  std::string identity_;
  mutable std::once_flag map_once_;
  mutable std::once_flag direct_once_;
  mutable int direct_fd_ = -1;    // O_DIRECT descriptor of the same inode (ReadDirectAt), opened on first use
  mutable int direct_errno_ = 0;  // why it could not be opened
  mutable const char* map_ = nullptr;
};

// Opens `path` for reading and checks it is not a directory (whose read() fails only later, with EISDIR).
Result<int> OpenForReading(const std::string& path, struct stat* st) {
  const int fd = RetryOnEintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); });
  if (fd < 0) return ErrnoError(errno, "opening " + Quoted(path) + " for reading");
  if (::fstat(fd, st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, "reading the size of " + Quoted(path));
  }
  if (S_ISDIR(st->st_mode)) {
    ::close(fd);
    return ErrnoError(EISDIR, "opening " + Quoted(path) + " for reading");
  }
  return fd;
}

// Reads the names in an open directory stream, without "." and "..", unsorted.
Status ReadDirNames(DIR* dir, const std::string& path, std::vector<std::string>* names) {
  while (true) {
    errno = 0;
    const struct dirent* entry = ::readdir(dir);
    if (entry == nullptr) {
      if (errno != 0) return ErrnoError(errno, "listing directory " + Quoted(path));
      return OkStatus();
    }
    const char* name = entry->d_name;
    if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'))) continue;
    names->emplace_back(name);
  }
}

// Removes `name` (relative to `dir_fd`) and, if it is a directory, everything below it. Symlinks are removed, never
// followed: the walk goes through descriptors opened with O_NOFOLLOW, so a link swapped in mid-walk cannot redirect
// it outside the tree. Uses one descriptor per level; checkpoint trees are shallow.
Status RemoveTree(int dir_fd, const std::string& name, const std::string& path) {
  struct stat st;
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return OkStatus();
    return ErrnoError(errno, "removing " + Quoted(path));
  }
  if (S_ISDIR(st.st_mode)) {
    const int fd =
        RetryOnEintr([&] { return ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); });
    if (fd < 0) {
      if (errno == ENOENT) return OkStatus();
      return ErrnoError(errno, "opening directory " + Quoted(path) + " to remove it");
    }
    DIR* dir = ::fdopendir(fd);
    if (dir == nullptr) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(err, "opening directory " + Quoted(path) + " to remove it");
    }
    // Names first, removals after: unlinking while readdir is mid-stream may skip entries on some filesystems.
    std::vector<std::string> children;
    Status st_list = ReadDirNames(dir, path, &children);
    for (size_t i = 0; st_list.ok() && i < children.size(); ++i) {
      st_list = RemoveTree(::dirfd(dir), children[i], path + "/" + children[i]);
    }
    ::closedir(dir);
    DCKPT_RETURN_IF_ERROR(st_list);
  }
  if (::unlinkat(dir_fd, name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) != 0 && errno != ENOENT) {
    return ErrnoError(errno, "removing " + Quoted(path));
  }
  return OkStatus();
}

// Creates (or truncates) `path` for writing. A symbolic link at `path` is refused, never written through: a link
// planted where a checkpoint file is about to be written must not redirect the write outside the checkpoint.
Result<int> CreateForWriting(const std::string& path) {
  const int fd =
      RetryOnEintr([&] { return ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644); });
  if (fd >= 0) return fd;
  const int err = errno;
  struct stat st;
  if (err == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    return InvalidArgument("refusing to write " + Quoted(path) +
                           ": it is a symbolic link (distckpt never writes "
                           "through links; remove it)");
  }
  return ErrnoError(err, "creating " + Quoted(path) + " for writing");
}

// Lifts this process's soft limit on open descriptors to its hard limit, once. A reader pins every data file of a
// checkpoint with a descriptor, and checkpoints of thousands of ranks have thousands of files, while many systems
// start processes with a soft limit of 1024 (Go's runtime lifts it the same way at start-up). True if it was raised.
bool RaiseOpenFileLimit() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  struct rlimit rl;
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return false;
  rl.rlim_cur = rl.rlim_max;
  return ::setrlimit(RLIMIT_NOFILE, &rl) == 0;
}

const char* FileTypeName(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

Status NotARegularFile(const std::string& path, mode_t mode) {
  return Corrupt(Quoted(path) + " is " + FileTypeName(mode) +
                 ", not a regular file; distckpt opens only regular files inside a checkpoint and never follows links "
                 "(replace it with the file itself)");
}

// Opens the regular file `name` inside the directory `dir_fd` for reading, never through a link. `full` is the path
// the file is known by (its ReadableFile's), `shown` names it in I/O errors, and `refused(mode)` is the error for
// anything but a regular file (a link, a directory, a FIFO, a device).
Result<std::unique_ptr<ReadableFile>> OpenRegularFileAt(int dir_fd, const std::string& name, const std::string& full,
                                                        const std::string& shown,
                                                        const std::function<Status(mode_t)>& refused) {
  // Look first, so that a FIFO or a device is never opened (opening one can block, or act on the device).
  struct stat st;
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoError(errno, "opening " + shown + " for reading");
  }
  if (!S_ISREG(st.st_mode)) return refused(st.st_mode);
  // O_NOFOLLOW and O_NONBLOCK cover a swap between the look and the open: a link is refused, and a FIFO put there
  // meanwhile opens without blocking and is refused by the fstat below.
  const int flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY;
  int fd = RetryOnEintr([&] { return ::openat(dir_fd, name.c_str(), flags); });
  if (fd < 0 && errno == EMFILE && RaiseOpenFileLimit()) {
    fd = RetryOnEintr([&] { return ::openat(dir_fd, name.c_str(), flags); });
  }
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) return refused(S_IFLNK);
    if (err == EMFILE) {
      return ErrnoError(err, "opening " + shown +
                                 " for reading (this process has too many open files; "
                                 "raise `ulimit -n`)");
    }
    return ErrnoError(err, "opening " + shown + " for reading");
  }
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, "reading the size of " + shown);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return refused(st.st_mode);
  }
  (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return std::unique_ptr<ReadableFile>(new PosixReadableFile(fd, full, st));
}

bool IsPlainName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

// How deep below `<repo>/snapshots/<revision>` a directory read as a hub cache snapshot may be.
constexpr int kMaxHubSnapshotDepth = 16;

// `path` with its last `up` components removed, then `leaf` appended; lexically, for messages ("a/b/c", 2, "x" ->
// "a/x"). Where the path has fewer plain components than that, the "../" are spelled out.
std::string UpThenInto(const std::string& path, int up, const std::string& leaf) {
  std::string p = path;
  for (int i = 0; i < up; ++i) {
    const size_t slash = p.find_last_of('/');
    const std::string last = slash == std::string::npos ? p : p.substr(slash + 1);
    if (last.empty() || last == "." || last == ".." || p == "/") {
      std::string spelled = path;
      for (int j = 0; j < up; ++j) spelled += "/..";
      return spelled + "/" + leaf;
    }
    p = slash == std::string::npos ? "" : slash == 0 ? "/" : p.substr(0, slash);
  }
  if (p.empty()) return leaf;
  return p == "/" ? "/" + leaf : p + "/" + leaf;
}

// A directory held open by its descriptor; files inside are opened with openat, never through a link. Read as a hub
// cache snapshot (OpenAsHubCacheSnapshot), it also opens the blob a link "<link_prefix><name>" names, as <name> in the
// repository's blobs directory it holds open (blobs_fd).
class PosixDirectory final : public Directory {
 public:
  PosixDirectory(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  PosixDirectory(int fd, std::string path, int blobs_fd, std::string blobs_path, std::string link_prefix)
      : fd_(fd),
        path_(std::move(path)),
        blobs_fd_(blobs_fd),
        blobs_path_(std::move(blobs_path)),
        link_prefix_(std::move(link_prefix)) {}
  ~PosixDirectory() override {
    ::close(fd_);
    if (blobs_fd_ >= 0) ::close(blobs_fd_);
  }

  const std::string& path() const override { return path_; }

  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& name) override {
    const std::string full = path_ + "/" + name;
    if (!IsPlainName(name)) {
      return InvalidArgument("'" + name + "' is not a plain file name inside " + Quoted(path_));
    }
    if (blobs_fd_ >= 0) {
      struct stat st;
      if (::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        return OpenBlob(name, full);
      }
    }
    return OpenRegularFileAt(fd_, name, full, Quoted(full), [&](mode_t mode) { return NotARegularFile(full, mode); });
  }

  Result<std::unique_ptr<Directory>> OpenSubdirectory(const std::string& name) override {
    const std::string full = path_ + "/" + name;
    if (!IsPlainName(name)) {
      return InvalidArgument("'" + name + "' is not a plain directory name inside " + Quoted(path_));
    }
    const int fd =
        RetryOnEintr([&] { return ::openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); });
    if (fd < 0) {
      const int err = errno;
      struct stat st;
      if ((err == ELOOP || err == ENOTDIR) && ::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        return Corrupt(Quoted(full) + " is " + FileTypeName(st.st_mode) +
                       ", not a directory (distckpt does not follow links to directories here)");
      }
      return ErrnoError(err, "opening directory " + Quoted(full));
    }
    return std::unique_ptr<Directory>(new PosixDirectory(fd, full));
  }

  // Walks up from this directory through its descriptors ("..", never a path), looking for the repository: the
  // directory whose "snapshots" entry is the one just left (same device and inode, and not a link) and which has a
  // "blobs" directory beside it.
  Result<std::unique_ptr<Directory>> OpenAsHubCacheSnapshot() override {
    struct stat cur_st;
    if (::fstat(fd_, &cur_st) != 0) return ErrnoError(errno, "looking at directory " + Quoted(path_));
    ScopedFd cur(::fcntl(fd_, F_DUPFD_CLOEXEC, 0));
    if (cur.get() < 0) return ErrnoError(errno, "looking at directory " + Quoted(path_));
    for (int up = 1; up <= kMaxHubSnapshotDepth + 1; ++up) {
      ScopedFd parent(RetryOnEintr([&] { return ::openat(cur.get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC); }));
      struct stat parent_st;
      if (parent.get() < 0 || ::fstat(parent.get(), &parent_st) != 0) return std::unique_ptr<Directory>();
      if (parent_st.st_dev == cur_st.st_dev && parent_st.st_ino == cur_st.st_ino) {
        return std::unique_ptr<Directory>();  // the root: no repository above
      }
      struct stat snapshots, blobs;
      if (up >= 2 && ::fstatat(parent.get(), "snapshots", &snapshots, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISDIR(snapshots.st_mode) && snapshots.st_dev == cur_st.st_dev && snapshots.st_ino == cur_st.st_ino &&
          ::fstatat(parent.get(), "blobs", &blobs, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(blobs.st_mode)) {
        const std::string blobs_path = UpThenInto(path_, up, "blobs");
        const int blobs_fd = RetryOnEintr(
            [&] { return ::openat(parent.get(), "blobs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); });
        if (blobs_fd < 0) return ErrnoError(errno, "opening the hub cache blobs directory " + Quoted(blobs_path));
        const int self = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
        if (self < 0) {
          const int err = errno;
          ::close(blobs_fd);
          return ErrnoError(err, "looking at directory " + Quoted(path_));
        }
        std::string prefix;
        for (int i = 0; i < up; ++i) prefix += "../";
        return std::unique_ptr<Directory>(new PosixDirectory(self, path_, blobs_fd, blobs_path, prefix + "blobs/"));
      }
      cur_st = parent_st;
      cur.Reset(parent.Release());
    }
    return std::unique_ptr<Directory>();
  }

  // The kernel grows a process's descriptor table by doubling it, and a process with several threads waits for an
  // RCU grace period at each growth (about 5 ms on the bench's VM): pinning 1,024 files one by one paid three of
  // them. One descriptor placed past the files to come grows the table once; it is closed at once.
  void ExpectOpenFiles(size_t count) override {
    if (count < 64) return;
    const int lowest = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);  // the lowest free descriptor: where the files will start
    if (lowest < 0) return;
    ::close(lowest);
    const uint64_t last = static_cast<uint64_t>(lowest) + count;
    struct rlimit rl;
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (last >= rl.rlim_cur && (!RaiseOpenFileLimit() || ::getrlimit(RLIMIT_NOFILE, &rl) != 0)) return;
    if (last >= rl.rlim_cur || last > static_cast<uint64_t>(INT_MAX)) return;  // the opens will say EMFILE
    const int placed = ::fcntl(fd_, F_DUPFD_CLOEXEC, static_cast<int>(last));
    if (placed >= 0) ::close(placed);
  }

  Result<bool> Exists(const std::string& name) override {
    struct stat st;
    if (::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return true;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoError(errno, "checking whether " + Quoted(path_ + "/" + name) + " exists");
  }

 private:
  // The link `name` (at `full`) of a hub cache snapshot: its text must be link_prefix_ + a plain name, which is then
  // opened in blobs_fd_ as a regular file, not through a link (a chain of links stops there).
  Result<std::unique_ptr<ReadableFile>> OpenBlob(const std::string& name, const std::string& full) {
    char buf[4096];
    const ssize_t n = ::readlinkat(fd_, name.c_str(), buf, sizeof buf);
    if (n < 0) return ErrnoError(errno, "reading the symbolic link " + Quoted(full));
    const std::string target(buf, static_cast<size_t>(n));
    const std::string what = Quoted(full) + " is a symbolic link to " + Quoted(target);
    std::string blob;
    if (static_cast<size_t>(n) < sizeof buf && target.compare(0, link_prefix_.size(), link_prefix_) == 0) {
      blob = target.substr(link_prefix_.size());
    }
    if (!IsPlainName(blob)) {
      return Corrupt(what + ", which does not lead to a file in its hub cache repository's blobs directory " +
                     Quoted(blobs_path_) + ": in a hub cache snapshot distckpt follows only links that read \"" +
                     link_prefix_ + "<blob>\", as huggingface_hub writes them (replace the link with the file itself)");
    }
    const std::string blob_path = blobs_path_ + "/" + blob;
    return OpenRegularFileAt(blobs_fd_, blob, full, Quoted(full) + " (a link to " + Quoted(blob_path) + ")",
                             [&](mode_t mode) {
                               return Corrupt(what + ", and the blob " + Quoted(blob_path) + " is " +
                                              FileTypeName(mode) + ", not a regular file" +
                                              (S_ISLNK(mode) ? " (distckpt follows one link, from the snapshot into "
                                                               "blobs/, never a chain of links)"
                                                             : ""));
                             });
  }

  const int fd_;
  const std::string path_;
  const int blobs_fd_ = -1;  // a hub cache snapshot's blobs directory, or -1
  const std::string blobs_path_;
  const std::string link_prefix_;  // "../../blobs/" and so on
};

class PosixDirectoryLock final : public DirectoryLock {
 public:
  explicit PosixDirectoryLock(int fd) : fd_(fd) {}
  ~PosixDirectoryLock() override { ::close(fd_); }  // closing the descriptor releases the flock

 private:
  const int fd_;
};

class PosixStorage final : public Storage {
 public:
  std::string name() const override { return "posix"; }

  Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& path) override {
    DCKPT_ASSIGN_OR_RETURN(const int fd, CreateForWriting(path));
    // Optional: a filesystem that refuses O_DIRECT (EINVAL) just gets every write through the page cache.
    const int direct_fd =
        RetryOnEintr([&] { return ::open(path.c_str(), O_WRONLY | O_DIRECT | O_NOFOLLOW | O_CLOEXEC); });
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, direct_fd, path));
  }

  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& path) override {
    struct stat st;
    DCKPT_ASSIGN_OR_RETURN(const int fd, OpenForReading(path, &st));
    return std::unique_ptr<ReadableFile>(new PosixReadableFile(fd, path, st));
  }

  Result<std::string> ReadFile(const std::string& path, uint64_t max_size) override {
    struct stat st;
    DCKPT_ASSIGN_OR_RETURN(const int raw_fd, OpenForReading(path, &st));
    ScopedFd fd(raw_fd);
    const uint64_t stat_size = static_cast<uint64_t>(st.st_size);
    if (stat_size > max_size) return TooLarge(path, stat_size, max_size, /*exact=*/true);
    // Read to EOF rather than trusting st_size (the file may grow, and some files report 0), but never more than
    // max_size + 1 bytes: enough to tell that the limit was exceeded.
    const uint64_t cap = max_size == UINT64_MAX ? max_size : max_size + 1;
    std::string out(static_cast<size_t>(std::min<uint64_t>(stat_size + 1, cap)), '\0');
    size_t len = 0;
    while (true) {
      if (len == out.size()) {
        if (len >= cap) break;
        out.resize(static_cast<size_t>(std::min<uint64_t>(cap, std::max<uint64_t>(len * 2, len + 4096))));
      }
      const ssize_t n = ::read(fd.get(), &out[len], std::min(out.size() - len, kMaxIoChunk));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, "reading " + Quoted(path));
      }
      if (n == 0) break;
      len += static_cast<size_t>(n);
    }
    if (len > max_size) return TooLarge(path, len, max_size, /*exact=*/false);
    out.resize(len);
    return out;
  }

  Status WriteFileDurably(const std::string& path, const std::string& data) override {
    DCKPT_ASSIGN_OR_RETURN(const int raw_fd, CreateForWriting(path));
    ScopedFd fd(raw_fd);
    DCKPT_RETURN_IF_ERROR(PwriteAll(fd.get(), 0, data.data(), data.size(), path));
    // fsync, not fdatasync: this is the metadata path (small files), where the inode matters as much as the bytes.
    if (RetryOnEintr([&] { return ::fsync(fd.get()); }) != 0) return ErrnoError(errno, "syncing " + Quoted(path));
    return fd.Close(path);
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoError(errno, "reading the size of " + Quoted(path));
    return static_cast<uint64_t>(st.st_size);
  }

  Result<bool> Exists(const std::string& path) override {
    // lstat: a dangling symlink exists as far as Rename (which never replaces) is concerned.
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoError(errno, "checking whether " + Quoted(path) + " exists");
  }

  Result<bool> IsDirectory(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode) != 0;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoError(errno, "checking whether " + Quoted(path) + " is a directory");
  }

  Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0) return ErrnoError(errno, "creating directory " + Quoted(path));
    return OkStatus();
  }

  Status SyncDir(const std::string& path) override {
    const int raw_fd = RetryOnEintr([&] { return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
    if (raw_fd < 0) return ErrnoError(errno, "opening directory " + Quoted(path) + " to sync it");
    ScopedFd fd(raw_fd);
    // EINVAL: the filesystem cannot sync directories (some FUSE and network filesystems). Failing every save there
    // would make the library unusable, and such filesystems order their metadata updates themselves.
    if (RetryOnEintr([&] { return ::fsync(fd.get()); }) != 0 && errno != EINVAL) {
      return ErrnoError(errno, "syncing directory " + Quoted(path));
    }
    return fd.Close(path);
  }

  Status Rename(const std::string& from, const std::string& to) override {
#ifdef SYS_renameat2
    // The raw syscall: glibc only wraps renameat2 since 2.28.
    const long rc = RetryOnEintr(
        [&] { return ::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE); });
    if (rc == 0) return OkStatus();
    // ENOSYS: kernel before 3.15. EINVAL: this filesystem rejects the flag (or `to` lies inside `from`, which the
    // fallback's rename reports again).
    if (errno != ENOSYS && errno != EINVAL) {
      return ErrnoError(errno, "renaming " + Quoted(from) + " to " + Quoted(to));
    }
#endif
    return PosixRenameNoReplaceFallback(from, to);
  }

  Status RemoveAll(const std::string& path) override {
    const std::string clean = StripTrailingSlashes(path);
    if (clean.empty() || clean == "/" || clean == "." || clean == "..") {
      return InvalidArgument("refusing to remove " + Quoted(path) + " recursively");
    }
    return RemoveTree(AT_FDCWD, clean, clean);
  }

  Status RemoveEmptyDir(const std::string& path) override {
    // Missing, not empty, or not a directory (a symbolic link to one: the link stays): nothing to do.
    if (::rmdir(path.c_str()) == 0 || errno == ENOENT || errno == ENOTEMPTY || errno == EEXIST || errno == ENOTDIR) {
      return OkStatus();
    }
    return ErrnoError(errno, "removing the empty directory " + Quoted(path));
  }

  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return ErrnoError(errno, "listing directory " + Quoted(path));
    std::vector<std::string> names;
    Status st = ReadDirNames(dir, path, &names);
    ::closedir(dir);
    DCKPT_RETURN_IF_ERROR(st);
    std::sort(names.begin(), names.end());
    return names;
  }

  Result<std::unique_ptr<Directory>> OpenDirectory(const std::string& path) override {
    const std::string clean = StripTrailingSlashes(path);
    int fd = RetryOnEintr([&] { return ::open(clean.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
    if (fd < 0 && errno == EMFILE && RaiseOpenFileLimit()) {
      fd = RetryOnEintr([&] { return ::open(clean.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
    }
    if (fd < 0 && errno == ENOTDIR) {  // a file, FIFO or device: not found as a directory, and said so
      return NotFound("opening directory " + Quoted(clean) + ": it is not a directory");
    }
    if (fd < 0) return ErrnoError(errno, "opening directory " + Quoted(clean));
    return std::unique_ptr<Directory>(new PosixDirectory(fd, clean));
  }

  Result<std::string> Identity(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return std::string();
      return ErrnoError(errno, "looking at " + Quoted(path));
    }
    // The inode, and its change time: a rename, or a new inode that reuses a freed number, changes one of them.
    char buf[96];
    std::snprintf(buf, sizeof buf, "%llx:%llx:%lld.%09ld", static_cast<unsigned long long>(st.st_dev),
                  static_cast<unsigned long long>(st.st_ino), static_cast<long long>(st.st_ctim.tv_sec),
                  static_cast<long>(st.st_ctim.tv_nsec));
    return std::string(buf);
  }

  Status Exchange(const std::string& a, const std::string& b) override {
#ifdef SYS_renameat2
    const long rc = RetryOnEintr(
        [&] { return ::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE); });
    if (rc == 0) return OkStatus();
    // ENOSYS: kernel before 3.15; EINVAL: this filesystem cannot exchange (NFS, some FUSE filesystems).
    if (errno != ENOSYS && errno != EINVAL) return ErrnoError(errno, "exchanging " + Quoted(a) + " and " + Quoted(b));
#endif
    return Status(StatusCode::kUnsupported,
                  "exchanging " + Quoted(a) + " and " + Quoted(b) + ": this filesystem has no atomic exchange");
  }

  Result<std::unique_ptr<DirectoryLock>> LockDirectory(const std::string& dir,
                                                       std::chrono::milliseconds timeout) override {
    const int fd = RetryOnEintr([&] { return ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
    if (fd < 0) return ErrnoError(errno, "opening directory " + Quoted(dir) + " to lock it");
    std::unique_ptr<DirectoryLock> lock(new PosixDirectoryLock(fd));
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(200);
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) {
        // EBADF, ENOLCK, EINVAL, EOPNOTSUPP: a filesystem without directory locks (NFS maps flock onto byte-range
        // locks, which need a descriptor open for writing).
        return Status(StatusCode::kUnsupported, "locking directory " + Quoted(dir) + ": " + std::strerror(errno));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status(StatusCode::kTimeout, "another save has been committing into " + Quoted(dir) + " for over " +
                                                std::to_string(timeout.count()) +
                                                " ms (its process may be stopped); nothing was committed");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
    }
    return lock;
  }

 private:
  // `exact`: `size` is the file's size; otherwise only a lower bound (reading stopped past the limit).
  static Status TooLarge(const std::string& path, uint64_t size, uint64_t max_size, bool exact) {
    return Corrupt("file " + Quoted(path) + " is larger than the limit of " + std::to_string(max_size) + " bytes (" +
                   (exact ? "" : "at least ") + std::to_string(size) + " bytes)");
  }
};

}  // namespace

Status PosixRenameNoReplaceFallback(const std::string& from, const std::string& to) {
  const std::string what = "renaming " + Quoted(from) + " to " + Quoted(to);
  struct stat st;
  if (::lstat(from.c_str(), &st) != 0) return ErrnoError(errno, what);
  if (!S_ISDIR(st.st_mode)) {
    // link() fails with EEXIST atomically, so a file is never replaced; then the old name goes.
    if (::link(from.c_str(), to.c_str()) == 0) {
      if (::unlink(from.c_str()) != 0) {
        const int err = errno;
        (void)::unlink(to.c_str());
        return ErrnoError(err, what);
      }
      return OkStatus();
    }
    if (errno != EPERM && errno != EOPNOTSUPP && errno != EMLINK) return ErrnoError(errno, what);
    // No hard links on this filesystem: fall through to check-then-rename.
  }
  // Check, then rename. RACE: an entry created at `to` between the lstat and the rename is replaced if it is an empty
  // directory (rename(2) allows that for a directory source) or a file (for a file source). A non-empty directory
  // still fails with ENOTEMPTY. This path only runs on kernels or filesystems without RENAME_NOREPLACE, and the
  // staging protocol uses fresh random names, so the window matters only against a concurrent writer of the same
  // checkpoint path.
  if (::lstat(to.c_str(), &st) == 0) return ErrnoError(EEXIST, what);
  if (errno != ENOENT) return ErrnoError(errno, what);
  if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoError(errno, what);
  return OkStatus();
}

}  // namespace internal_storage

std::unique_ptr<Storage> NewPosixStorage() { return std::unique_ptr<Storage>(new internal_storage::PosixStorage()); }

Storage* DefaultStorage() {
  // Never destroyed: it holds no state, and callers may still use it from static destructors.
  static Storage* const storage = NewPosixStorage().release();
  return storage;
}

}  // namespace distckpt
