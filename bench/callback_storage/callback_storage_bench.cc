// Overhead of storage plugged in through dckpt_storage_callbacks against the built-in POSIX backend, on the same disk
// in the same run. The callback storage here is a small object store over local files written against the C
// callbacks only (an object is a file written as "<path>.part" and renamed into place on close; ranged reads pread an
// fd cached per path), so the difference measured is the callback path itself: the metadata-last commit, the
// in-flight gate, the per-call indirection, and no mmap. Every value is checked after each load.
//
//   bazel run -c opt //bench/callback_storage -- --dir /path/on/disk --mib 1024 --runs 3 [--multipart 1]
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <mutex>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"

namespace {

struct Files {
  std::mutex mu;
  std::map<std::string, int> read_fds;  // cached for ranged reads; dropped when the path is replaced or removed
};

struct Part {
  std::string path;
  int fd;         // buffered
  int direct_fd;  // O_DIRECT (as the built-in backend writes data files), for aligned writes; -1 if unavailable
};

constexpr uint64_t kAlign = 4096;

int Errno() { return errno == ENOENT ? DCKPT_ENOTFOUND : errno == ENOSPC ? DCKPT_ENOSPC : DCKPT_EIO; }

void Forget(Files* f, const std::string& path) {
  std::lock_guard<std::mutex> lock(f->mu);
  const std::string prefix = path + "\n";
  for (auto it = f->read_fds.lower_bound(prefix); it != f->read_fds.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    close(it->second);
    it = f->read_fds.erase(it);
  }
}

int MkdirsFor(const std::string& path) {
  for (size_t i = 1; i < path.size(); ++i) {
    if (path[i] == '/') {
      if (mkdir(path.substr(0, i).c_str(), 0755) != 0 && errno != EEXIST) return Errno();
    }
  }
  return 0;
}

int Create(dckpt_storage_file** file, const char* path, uint64_t size_hint, void*) {
  if (int rc = MkdirsFor(path)) return rc;
  const std::string part = std::string(path) + ".part";
  const int fd = open(part.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno();
  // The size hint lets the file's blocks be allocated once: without it, concurrent writes that extend the file
  // serialise on the inode (ext4, xfs).
  if (size_hint > 0 && fallocate(fd, 0, 0, static_cast<off_t>(size_hint)) != 0 && errno == ENOSPC) {
    close(fd);
    unlink(part.c_str());
    return DCKPT_ENOSPC;
  }
  const int direct_fd = open(part.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  *file = new Part{path, fd, direct_fd};
  return 0;
}

int Write(dckpt_storage_file* file, uint64_t offset, const void* data, size_t size, void*) {
  auto* p = static_cast<Part*>(file);
  const char* d = static_cast<const char*>(data);
  // Page-aligned ranges bypass the page cache (O_DIRECT), through a per-thread aligned bounce buffer when the caller's
  // buffer is not aligned, as a local object store tuned for large sequential uploads would.
  if (((offset | size) & (kAlign - 1)) == 0 && p->direct_fd >= 0) {
    const bool aligned = (reinterpret_cast<uintptr_t>(data) & (kAlign - 1)) == 0;
    constexpr size_t kBounce = 8 << 20;
    thread_local std::unique_ptr<char, decltype(&std::free)> bounce(
        static_cast<char*>(std::aligned_alloc(kAlign, kBounce)), &std::free);
    while (size > 0) {
      const size_t n = aligned ? size : std::min(size, kBounce);
      const char* from = aligned ? d : static_cast<const char*>(std::memcpy(bounce.get(), d, n));
      const ssize_t w = pwrite(p->direct_fd, from, n, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0 || (static_cast<size_t>(w) & (kAlign - 1)) != 0) return Errno();
      d += w, offset += static_cast<uint64_t>(w), size -= static_cast<size_t>(w);
    }
    return 0;
  }
  const int fd = p->fd;
  while (size > 0) {
    const ssize_t n = pwrite(fd, d, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno();
    d += n, offset += static_cast<uint64_t>(n), size -= static_cast<size_t>(n);
  }
  return 0;
}

int Sync(dckpt_storage_file* file, void*) { return fdatasync(static_cast<Part*>(file)->fd) == 0 ? 0 : Errno(); }

int Close(dckpt_storage_file* file, uint64_t size, int discard, void* user) {
  auto* p = static_cast<Part*>(file);
  const std::string part = p->path + ".part";
  int rc = 0;
  if (!discard && (ftruncate(p->fd, static_cast<off_t>(size)) != 0 || fdatasync(p->fd) != 0)) rc = Errno();
  close(p->fd);
  if (p->direct_fd >= 0) close(p->direct_fd);
  if (discard || rc != 0) {
    unlink(part.c_str());
  } else {
    Forget(static_cast<Files*>(user), p->path);
    if (rename(part.c_str(), p->path.c_str()) != 0) rc = Errno();
  }
  delete p;
  return rc;
}

int Size(uint64_t* size, const char* path, void*) {
  struct stat st;
  if (stat(path, &st) != 0) return Errno();
  if (!S_ISREG(st.st_mode)) return DCKPT_ENOTFOUND;
  *size = static_cast<uint64_t>(st.st_size);
  return 0;
}

int Read(size_t* got, const char* path, uint64_t offset, void* data, size_t size, void* user) {
  auto* f = static_cast<Files*>(user);
  // One descriptor per reading thread and path, so each thread's front-to-back reads get the kernel's readahead.
  const std::string key = std::string(path) + "\n" + std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
  int fd;
  {
    std::lock_guard<std::mutex> lock(f->mu);
    auto it = f->read_fds.find(key);
    if (it == f->read_fds.end()) {
      fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) return Errno();
      it = f->read_fds.emplace(key, fd).first;
    }
    fd = it->second;
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pread(fd, static_cast<char*>(data) + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno();
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  *got = done;
  return 0;
}

int List(dckpt_storage_list* out, const char* dir, void*) {
  DIR* d = opendir(dir);
  if (d == nullptr) return errno == ENOENT || errno == ENOTDIR ? 0 : Errno();  // nothing below it
  int rc = 0;
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || (name.size() > 5 && name.compare(name.size() - 5, 5, ".part") == 0)) continue;
    if ((rc = dckpt_storage_list_add(out, name.c_str())) != 0) break;
  }
  closedir(d);
  return rc;
}

int Remove(const char* path, void* user) {
  Forget(static_cast<Files*>(user), path);
  if (unlink(path) == 0 || errno == ENOENT) return 0;
  return errno == EISDIR || errno == EPERM ? (rmdir(path) == 0 ? 0 : Errno()) : Errno();
}

// Multipart uploads (--multipart 1): distckpt assembles the data file into parts of kPartSize; each part is written
// at its place in "<path>.part" (the object store keeps parts where the object will have them), completed by the
// same fsync + rename as close.
constexpr uint64_t kPartSize = 8 << 20;

struct Upload {
  dckpt_storage_file* file;
  std::mutex mu;
  uint64_t end = 0;
};

int UploadBegin(dckpt_upload** up, const char* path, uint64_t size_hint, void* user) {
  auto* u = new Upload;
  if (int rc = Create(&u->file, path, size_hint, user)) {
    delete u;
    return rc;
  }
  *up = u;
  return 0;
}

int UploadPart(dckpt_upload* up, unsigned number, const void* data, size_t size, void* user) {
  auto* u = static_cast<Upload*>(up);
  const uint64_t offset = (number - 1) * kPartSize;
  {
    std::lock_guard<std::mutex> lock(u->mu);
    u->end = std::max(u->end, offset + size);
  }
  return Write(u->file, offset, data, size, user);
}

int UploadComplete(dckpt_upload* up, void* user) {
  std::unique_ptr<Upload> u(static_cast<Upload*>(up));
  return Close(u->file, u->end, 0, user);
}

int UploadAbort(dckpt_upload* up, void* user) {
  std::unique_ptr<Upload> u(static_cast<Upload*>(up));
  return Close(u->file, 0, 1, user);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Check(int rc, const char* what) {
  if (rc != 0) {
    std::fprintf(stderr, "%s failed: %s\n", what, dckpt_error_last());
    std::exit(1);
  }
}

struct Sample {
  double save, cold, warm;
};

// Drops the page cache of every file below `dir` (fdatasync + POSIX_FADV_DONTNEED), so the next load reads the disk.
void Evict(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = dir + "/" + name;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  closedir(d);
}

// Saves `w` (rows x cols f32, as `pieces` row pieces) to `path` and loads it back by column halves.
Sample SaveAndLoad(const std::string& path, dckpt_storage* storage, const std::vector<float>& w, uint64_t rows,
                   uint64_t cols, int map_files = 1) {
  dckpt_state* s = nullptr;
  Check(dckpt_state_new(&s), "state");
  const uint64_t shape[2] = {rows, cols}, zero[2] = {0, 0};
  Check(dckpt_state_add_tensor(s, "w", DCKPT_DTYPE_F32, 2, shape), "tensor");
  Check(dckpt_state_add_piece_const(s, "w", zero, shape, w.data()), "piece");
  dckpt_save_options so;
  dckpt_save_options_init(&so, DCKPT_SAVE_OPTIONS_VERSION);
  so.storage = storage;
  const double t0 = Now();
  Check(dckpt_save(nullptr, path.c_str(), s, nullptr, &so), "save");
  const double t1 = Now();
  dckpt_state_free(s);

  Evict(path);
  double load[2];
  for (double& seconds : load) {  // cold, then warm
    std::vector<float> left(rows * cols / 2), right(rows * cols / 2);
    Check(dckpt_state_new(&s), "state");
    const uint64_t half[2] = {rows, cols / 2}, mid[2] = {0, cols / 2};
    Check(dckpt_state_add_tensor(s, "w", DCKPT_DTYPE_F32, 2, shape), "tensor");
    Check(dckpt_state_add_piece(s, "w", zero, half, left.data()), "piece");
    Check(dckpt_state_add_piece(s, "w", mid, half, right.data()), "piece");
    dckpt_read_options ro;
    dckpt_read_options_init(&ro, DCKPT_READ_OPTIONS_VERSION);
    ro.storage = storage;
    ro.map_files = map_files;
    const double t2 = Now();
    Check(dckpt_load(nullptr, path.c_str(), s, nullptr, &ro), "load");
    seconds = Now() - t2;
    dckpt_state_free(s);
    for (uint64_t r = 0; r < rows; ++r) {
      if (std::memcmp(&left[r * cols / 2], &w[r * cols], cols / 2 * 4) != 0 ||
          std::memcmp(&right[r * cols / 2], &w[r * cols + cols / 2], cols / 2 * 4) != 0) {
        std::fprintf(stderr, "%s: wrong values in row %llu\n", path.c_str(), static_cast<unsigned long long>(r));
        std::exit(1);
      }
    }
  }
  return {t1 - t0, load[0], load[1]};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/dckpt-callback-bench";
  uint64_t mib = 512;
  int runs = 3;
  bool multipart = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir") dir = argv[i + 1];
    else if (flag == "--multipart") multipart = std::atoi(argv[i + 1]) != 0;
    else if (flag == "--mib") mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--runs") runs = std::atoi(argv[i + 1]);
  }
  mkdir(dir.c_str(), 0755);
  const uint64_t cols = 8192, rows = mib * (1 << 20) / (cols * 4);
  std::vector<float> w(rows * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 1000003);

  Files files;
  dckpt_storage_callbacks cb;
  dckpt_storage_callbacks_init(&cb, DCKPT_STORAGE_CALLBACKS_VERSION);
  cb.create = Create;
  cb.write = Write;
  cb.sync = Sync;
  cb.close = Close;
  cb.size = Size;
  cb.read = Read;
  cb.list = List;
  cb.remove = Remove;
  cb.user_data = &files;
  if (multipart) {
    cb.upload_begin = UploadBegin;
    cb.upload_part = UploadPart;
    cb.upload_complete = UploadComplete;
    cb.upload_abort = UploadAbort;
    cb.min_part_size = kPartSize;
  }
  dckpt_storage* callbacks = nullptr;
  Check(dckpt_storage_new_callbacks(&callbacks, &cb), "storage");

  std::vector<double> ps, pc, pw, cs, cc, cw, rs, rc, rw;
  for (int r = 0; r < runs; ++r) {  // interleaved, so both see the same disk state
    const std::string p = dir + "/posix-" + std::to_string(r), c = dir + "/callback-" + std::to_string(r);
    Sample a = SaveAndLoad(p, nullptr, w, rows, cols);
    Sample b = SaveAndLoad(c, callbacks, w, rows, cols);
    const std::string q = dir + "/posix-pread-" + std::to_string(r);
    Sample d = SaveAndLoad(q, nullptr, w, rows, cols, /*map_files=*/0);
    rs.push_back(d.save), rc.push_back(d.cold), rw.push_back(d.warm);
    ps.push_back(a.save), pc.push_back(a.cold), pw.push_back(a.warm);
    cs.push_back(b.save), cc.push_back(b.cold), cw.push_back(b.warm);
    Check(dckpt_storage_remove_checkpoint(callbacks, c.c_str()), "remove");
    if (std::system(("rm -rf '" + p + "' '" + c + "' '" + q + "'").c_str()) != 0) std::fprintf(stderr, "cleanup failed\n");
  }
  const double gib = static_cast<double>(rows * cols * 4) / (1 << 30);
  std::printf("callback storage%s vs built-in POSIX, %.2f GiB f32, 1 rank, median of %d interleaved runs; save with "
              "fsync,\nload by column halves (a resharded read) with checksums verified, cold (page cache dropped) and "
              "warm\n",
              multipart ? " (multipart uploads, 8 MiB parts)" : "", gib, runs);
  std::printf("%-10s %12s %14s %10s %18s %10s\n", "", "posix GiB/s", "callback GiB/s", "overhead",
              "posix pread GiB/s", "overhead");
  auto row = [&](const char* what, const std::vector<double>& posix, const std::vector<double>& cb,
                 const std::vector<double>& pread) {
    std::printf("%-10s %12.2f %14.2f %9.1f%% %18.2f %9.1f%%\n", what, gib / Median(posix), gib / Median(cb),
                100.0 * (Median(cb) / Median(posix) - 1), gib / Median(pread), 100.0 * (Median(cb) / Median(pread) - 1));
  };
  row("save", ps, cs, rs);
  row("load cold", pc, cc, rc);
  row("load warm", pw, cw, rw);
  std::printf("(posix pread: the built-in backend with map_files = 0, the read path callback storage also takes)\n");
  dckpt_storage_free(callbacks);
  return 0;
}
