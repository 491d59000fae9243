#include "core/tools/rename_leftovers.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <optional>
#include <utility>

#include "core/storage/storage.h"

namespace distckpt {
namespace {

constexpr int kMaxDepth = 64;                // deeper trees are not walked further for their size
constexpr size_t kMaxMarkerBytes = 1 << 16;  // a marker is a few lines

Status Errno(int err, const std::string& what) {
  return Status(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIo, what + ": " + std::strerror(err));
}

// Closes a descriptor on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

double Seconds(const timespec& t) { return static_cast<double>(t.tv_sec) + t.tv_nsec / 1e9; }

// Sums the regular files below the directory `fd` (taken) without following links; `newest` gets the newest change
// time of the entries directly in it when `top`.
void Usage(int fd, bool top, int depth, uint64_t* bytes, double* newest) {
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return;
  }
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    struct stat st;
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (top) *newest = std::max(*newest, Seconds(st.st_mtim));
    if (S_ISREG(st.st_mode)) {
      *bytes += static_cast<uint64_t>(st.st_size);
    } else if (S_ISDIR(st.st_mode) && depth < kMaxDepth) {
      const int sub = ::openat(::dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) Usage(sub, false, depth + 1, bytes, newest);
    }
  }
  ::closedir(d);
}

// The STAGING marker in the directory `fd`, if there is a readable one (never through a link).
std::optional<std::string> ReadMarker(int fd) {
  Fd f(::openat(fd, kStagingMarkerName, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (f.fd < 0) return std::nullopt;
  std::string text(kMaxMarkerBytes, '\0');
  const ssize_t n = ::read(f.fd, text.data(), text.size());
  if (n < 0) return std::nullopt;
  text.resize(static_cast<size_t>(n));
  return text;
}

bool KindOfName(const std::string& name, RenameLeftover::Kind* kind, std::string* final_name) {
  if (ParseDeletingName(name, final_name)) {
    *kind = RenameLeftover::Kind::kDeleting;
  } else if (ParseReplacedName(name, final_name)) {
    *kind = RenameLeftover::Kind::kReplaced;
  } else if (ParseStagingName(name, final_name)) {
    *kind = RenameLeftover::Kind::kStaging;
  } else {
    return false;
  }
  return true;
}

// The rules of what is garbage (the reasons are what prune prints).
void Decide(RenameLeftover* l, double grace) {
  const std::string idle = HumanDuration(l->idle_seconds);
  const std::string within = "within the " + HumanDuration(grace) + " grace period";
  const bool idle_enough = l->idle_seconds > grace;
  switch (l->kind) {
    case RenameLeftover::Kind::kStaging: {
      const std::string pid = std::to_string(l->marker.pid);
      if (l->writer == WriterState::kRunning) {
        l->reason = "being written: writer pid " + pid + " on this host is running";
      } else if (!idle_enough) {
        l->reason = "active " + idle + " ago, " + within;
      } else if (l->writer == WriterState::kExited) {
        l->garbage = true;
        l->reason = "abandoned: writer pid " + pid + " on this host has exited; idle " + idle;
      } else if (l->has_marker) {
        l->garbage = true;
        l->reason = "abandoned: idle " + idle + " (writer pid " + pid + " on host " + l->marker.host + ")";
      } else {
        l->garbage = true;
        l->reason = "abandoned: idle " + idle + ", no STAGING marker";
      }
      return;
    }
    case RenameLeftover::Kind::kCompleteUnrenamed:
      l->garbage = idle_enough;
      l->reason = idle_enough ? "a save that died before its rename (it never reported success); idle " + idle
                              : "complete but not renamed, active " + idle + " ago: a commit may be in progress";
      return;
    case RenameLeftover::Kind::kReplaced:
    case RenameLeftover::Kind::kDeleting:
      l->garbage = idle_enough;
      l->reason = idle_enough
                      ? std::string("leftover of an interrupted ") +
                            (l->kind == RenameLeftover::Kind::kReplaced ? "overwrite" : "prune") + ", idle " + idle
                      : "leftover, but active " + idle + " ago, " + within;
      return;
  }
}

// Judges the entry `name` of the directory `dirfd` (`dir`); nullopt if it is not a leftover directory.
Result<std::optional<RenameLeftover>> Judge(int dirfd, const std::string& dir, const std::string& name, double grace) {
  RenameLeftover l;
  if (!KindOfName(name, &l.kind, &l.final_name)) return std::optional<RenameLeftover>();
  l.name = name;
  l.path = dir + "/" + name;
  struct stat st;
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return std::optional<RenameLeftover>();
    return Errno(errno, "looking at '" + l.path + "'");
  }
  if (!S_ISDIR(st.st_mode)) return std::optional<RenameLeftover>();  // a link or a file named like one: not ours
  const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) return std::optional<RenameLeftover>();
    return Errno(errno, "opening '" + l.path + "'");
  }
  struct stat opened;
  if (::fstat(fd, &opened) != 0 || opened.st_dev != st.st_dev || opened.st_ino != st.st_ino) {
    ::close(fd);
    return std::optional<RenameLeftover>();  // replaced between the two looks: judged on the next scan
  }
  l.device = static_cast<uint64_t>(st.st_dev);
  l.inode = static_cast<uint64_t>(st.st_ino);
  if (l.kind == RenameLeftover::Kind::kStaging) {
    if (std::optional<std::string> text = ReadMarker(fd)) {
      l.has_marker = true;
      l.marker = ParseStagingMarker(*text);
      l.writer = WriterStateOf(l.marker);
    } else {
      struct stat meta;
      if (::fstatat(fd, "metadata.dckpt", &meta, AT_SYMLINK_NOFOLLOW) == 0) {
        l.kind = RenameLeftover::Kind::kCompleteUnrenamed;
      }
    }
  }
  double newest = Seconds(st.st_mtim);
  Usage(fd, true, 0, &l.bytes, &newest);  // takes fd
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  l.idle_seconds = std::max(0.0, Seconds(now) - newest);
  Decide(&l, grace);
  return std::optional<RenameLeftover>(std::move(l));
}

// "a/b//" -> {"a", "b"}; "b" -> {".", "b"}; "/b" -> {"/", "b"}.
std::pair<std::string, std::string> SplitPath(const std::string& path) { return {ParentDir(path), BaseName(path)}; }

Status Same(int dirfd, const std::string& name, const RenameLeftover& l) {
  struct stat st;
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return Errno(errno, "looking at '" + SplitPath(l.path).first + "/" + name + "'");
  }
  if (!S_ISDIR(st.st_mode) || static_cast<uint64_t>(st.st_dev) != l.device ||
      static_cast<uint64_t>(st.st_ino) != l.inode) {
    return Status(StatusCode::kState, "'" + l.path +
                                          "' changed while it was being removed (another directory or a "
                                          "link took its place): not removed");
  }
  return OkStatus();
}

}  // namespace

std::string HumanDuration(double seconds) {
  const long s = static_cast<long>(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%ldm", s / 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lds", s);
  }
  return buf;
}

Result<std::vector<RenameLeftover>> ScanRenameLeftovers(const std::string& dir, std::chrono::seconds grace,
                                                        const std::string& final_name) {
  std::vector<RenameLeftover> out;
  Fd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dirfd.fd < 0) {
    if (errno == ENOENT) return out;
    return Errno(errno, "listing '" + dir + "' for leftovers");
  }
  std::vector<std::string> names;
  {
    DIR* d = ::fdopendir(::dup(dirfd.fd));
    if (d == nullptr) return Errno(errno, "listing '" + dir + "' for leftovers");
    while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    DCKPT_ASSIGN_OR_RETURN(std::optional<RenameLeftover> l,
                           Judge(dirfd.fd, dir, name, static_cast<double>(grace.count())));
    if (l && (final_name.empty() || l->final_name == final_name)) out.push_back(std::move(*l));
  }
  return out;
}

Result<std::vector<RenameLeftover>> RenameLeftoversBeside(const std::string& checkpoint_path,
                                                          std::chrono::seconds grace) {
  const auto [dir, name] = SplitPath(checkpoint_path);
  if (name.empty() || name == "." || name == "..") return std::vector<RenameLeftover>();
  return ScanRenameLeftovers(dir, grace, name);
}

Status RemoveRenameLeftover(const std::string& path, std::chrono::seconds grace) {
  const auto [dir, name] = SplitPath(path);
  const std::string context = "removing the leftover '" + path + "'";
  Fd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dirfd.fd < 0) return Errno(errno, context);
  DCKPT_ASSIGN_OR_RETURN(std::optional<RenameLeftover> l,
                         Judge(dirfd.fd, dir, name, static_cast<double>(grace.count())));
  if (!l) return NotFound(context + ": it is not a leftover of a save, an overwrite or a prune");
  if (!l->garbage) return Status(StatusCode::kState, context + ": not removed: " + l->reason);
  std::string doomed = name;
  if (l->kind != RenameLeftover::Kind::kDeleting) {
    // Out of its name in one step, so that nothing can start using it (a writer, an overwrite putting it back).
    doomed = SplitPath(DeletingPath(l->final_name, NewNonce())).second;
    if (::renameat2(dirfd.fd, name.c_str(), dirfd.fd, doomed.c_str(), RENAME_NOREPLACE) != 0) {
      return Errno(errno, context + ": moving it aside");
    }
    if (Status same = Same(dirfd.fd, doomed, *l); !same.ok()) {
      (void)::renameat2(dirfd.fd, doomed.c_str(), dirfd.fd, name.c_str(), RENAME_NOREPLACE);  // put it back
      return same;
    }
    (void)::fsync(dirfd.fd);
  } else {
    DCKPT_RETURN_IF_ERROR(Same(dirfd.fd, doomed, *l).WithContext(context));
  }
  return DefaultStorage()->RemoveAll(dir + "/" + doomed).WithContext(context);
}

}  // namespace distckpt
