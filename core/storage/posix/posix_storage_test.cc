#include "core/storage/posix/posix_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/storage/storage.h"
#include "core/storage/storage_conformance.h"

namespace distckpt {
namespace {

using testing_util::MakeTempDir;

INSTANTIATE_TEST_SUITE_P(Posix, StorageConformanceTest,
                         ::testing::Values(StorageConformanceParams{"posix", NewPosixStorage,
                                                                    [](Storage*) { return MakeTempDir("storage-"); }}),
                         StorageConformanceTestName);

// Runs `body` in a forked child, for tests that change process-wide state (rlimits, credentials). Returns the
// child's exit code, or 128 + the signal that killed it. The child reports details on stderr.
int RunInChild(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) ::_exit(body());
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

// For use inside RunInChild: prints why and returns `code` unless `st` has `want` and mentions every string.
int ExpectInChild(const Status& st, StatusCode want, const std::vector<std::string>& mentions, int code) {
  ::testing::AssertionResult r = StatusIs(st, want, mentions);
  if (r) return 0;
  std::fprintf(stderr, "child check %d failed: %s\n", code, r.message());
  return code;
}

TEST(PosixStorageTest, DevFullReportsNoSpaceAndNamesThePath) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "/dev/full is not writable here";
  std::unique_ptr<Storage> storage = NewPosixStorage();
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, storage->CreateFile("/dev/full"));
  EXPECT_TRUE(StatusIs(file->WriteAt(0, "x", 1), StatusCode::kNoSpace, {"'/dev/full'", "No space left"}));
  EXPECT_TRUE(StatusIs(storage->WriteFileDurably("/dev/full", "metadata"), StatusCode::kNoSpace, {"'/dev/full'"}));
}

TEST(PosixStorageTest, AShortWriteIsResumedAndTheFileSizeLimitThenReported) {
  // RLIMIT_FSIZE makes the first pwrite come back short (at the limit) and the next one fail with EFBIG: the
  // resumption is visible in the offset the error names.
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/limited";
  constexpr rlim_t kLimit = 10000;
  const int rc = RunInChild([&] {
    ::signal(SIGXFSZ, SIG_IGN);  // or the kernel kills the process instead of returning EFBIG
    struct rlimit lim = {kLimit, kLimit};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 2;
    std::unique_ptr<Storage> storage = NewPosixStorage();
    auto file = storage->CreateFile(path);
    if (!file.ok()) return 3;
    const std::string data(16384, 'x');
    int bad = ExpectInChild((*file)->WriteAt(0, data.data(), data.size()), StatusCode::kIo,
                            {"'" + path + "'", "at offset 10000", "File too large"}, 4);
    if (bad != 0) return bad;
    return ExpectInChild(storage->WriteFileDurably(dir + "/meta", data), StatusCode::kIo, {dir + "/meta"}, 5);
  });
  ASSERT_EQ(rc, 0);
  DCKPT_ASSERT_OK_AND_ASSIGN(uint64_t size, NewPosixStorage()->FileSize(path));
  EXPECT_EQ(size, kLimit);
}

TEST(PosixStorageTest, PermissionDeniedIsAnIoErrorNamingThePath) {
  // Root bypasses permission checks, so as root the checks run in a child that drops to uid/gid 65534 (nobody).
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  const bool as_root = ::geteuid() == 0;
  if (as_root) {
    ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);  // nobody works in here
  }
  const int rc = RunInChild([&] {
    if (as_root) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) return 77;
      if (::access(dir.c_str(), W_OK | X_OK) != 0) return 78;  // some ancestor is closed to nobody
    }
    std::unique_ptr<Storage> storage = NewPosixStorage();
    const std::string locked = dir + "/locked";
    const std::string secret = dir + "/secret";
    if (!storage->CreateDir(locked).ok() || ::chmod(locked.c_str(), 0555) != 0) return 2;
    if (!storage->WriteFileDurably(secret, "s").ok() || ::chmod(secret.c_str(), 0) != 0) return 3;
    int bad = ExpectInChild(storage->CreateFile(locked + "/f").status(), StatusCode::kIo,
                            {"'" + locked + "/f'", "Permission denied"}, 4);
    if (bad == 0) {
      bad = ExpectInChild(storage->CreateDir(locked + "/d"), StatusCode::kIo, {locked + "/d", "Permission denied"}, 5);
    }
    if (bad == 0) {
      bad = ExpectInChild(storage->OpenFile(secret).status(), StatusCode::kIo, {secret, "Permission denied"}, 6);
    }
    if (bad == 0) {
      bad = ExpectInChild(storage->ReadFile(secret, 10).status(), StatusCode::kIo, {secret, "Permission denied"}, 7);
    }
    if (bad == 0 && ::chmod(locked.c_str(), 0) == 0) {
      bad = ExpectInChild(storage->ListDir(locked).status(), StatusCode::kIo, {locked, "Permission denied"}, 8);
    }
    (void)::chmod(locked.c_str(), 0755);
    (void)::chmod(secret.c_str(), 0644);
    return bad;
  });
  if (rc == 77) GTEST_SKIP() << "running as root, which bypasses permission checks, and cannot drop to uid 65534";
  if (rc == 78) GTEST_SKIP() << "running as root, which bypasses permission checks, and uid 65534 cannot reach " << dir;
  EXPECT_EQ(rc, 0);
}

TEST(PosixStorageTest, RemoveAllDeletesSymlinksNotTheirTargets) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Storage> storage = NewPosixStorage();
  DCKPT_ASSERT_OK(storage->CreateDir(dir + "/outside"));
  DCKPT_ASSERT_OK(storage->WriteFileDurably(dir + "/outside/precious", "keep me"));
  DCKPT_ASSERT_OK(storage->CreateDir(dir + "/tree"));
  ASSERT_EQ(::symlink((dir + "/outside").c_str(), (dir + "/tree/dirlink").c_str()), 0);
  ASSERT_EQ(::symlink((dir + "/outside/precious").c_str(), (dir + "/tree/filelink").c_str()), 0);
  ASSERT_EQ(::symlink((dir + "/outside").c_str(), (dir + "/toplink").c_str()), 0);

  DCKPT_ASSERT_OK(storage->RemoveAll(dir + "/tree"));
  DCKPT_ASSERT_OK(storage->RemoveAll(dir + "/toplink"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage->ListDir(dir));
  EXPECT_EQ(names, std::vector<std::string>({"outside"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string precious, storage->ReadFile(dir + "/outside/precious", 100));
  EXPECT_EQ(precious, "keep me");
}

TEST(PosixStorageTest, RemoveAllRefusesAnEmptyPath) {
  EXPECT_EQ(NewPosixStorage()->RemoveAll("").code(), StatusCode::kInvalidArgument);
}

TEST(PosixStorageTest, ADanglingSymlinkExistsAndIsNeverReplaced) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Storage> storage = NewPosixStorage();
  ASSERT_EQ(::symlink("nowhere", (dir + "/dangling").c_str()), 0);
  DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, storage->Exists(dir + "/dangling"));
  EXPECT_TRUE(exists);
  DCKPT_ASSERT_OK(storage->WriteFileDurably(dir + "/f", "x"));
  EXPECT_TRUE(StatusIs(storage->Rename(dir + "/f", dir + "/dangling"), StatusCode::kExists, {dir + "/dangling"}));
}

TEST(PosixStorageTest, RenameFallbackNeverReplacesFilesOrDirectories) {
  using internal_storage::PosixRenameNoReplaceFallback;
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Storage> storage = NewPosixStorage();
  DCKPT_ASSERT_OK(storage->WriteFileDurably(dir + "/a", "A"));
  DCKPT_ASSERT_OK(storage->WriteFileDurably(dir + "/b", "B"));
  EXPECT_TRUE(StatusIs(PosixRenameNoReplaceFallback(dir + "/a", dir + "/b"), StatusCode::kExists, {dir + "/b"}));
  DCKPT_ASSERT_OK(PosixRenameNoReplaceFallback(dir + "/a", dir + "/c"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string c, storage->ReadFile(dir + "/c", 10));
  EXPECT_EQ(c, "A");
  DCKPT_ASSERT_OK_AND_ASSIGN(bool a_exists, storage->Exists(dir + "/a"));
  EXPECT_FALSE(a_exists);

  DCKPT_ASSERT_OK(storage->CreateDir(dir + "/src"));
  DCKPT_ASSERT_OK(storage->WriteFileDurably(dir + "/src/f", "f"));
  DCKPT_ASSERT_OK(storage->CreateDir(dir + "/empty"));
  EXPECT_TRUE(
      StatusIs(PosixRenameNoReplaceFallback(dir + "/src", dir + "/empty"), StatusCode::kExists, {dir + "/empty"}));
  DCKPT_ASSERT_OK(PosixRenameNoReplaceFallback(dir + "/src", dir + "/dst"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string f, storage->ReadFile(dir + "/dst/f", 10));
  EXPECT_EQ(f, "f");
  EXPECT_TRUE(
      StatusIs(PosixRenameNoReplaceFallback(dir + "/gone", dir + "/x"), StatusCode::kNotFound, {dir + "/gone"}));
}

// Writes 3 pages and 100 bytes of a pattern to `path`; returns them.
std::string PatternFile(Storage* storage, const std::string& path) {
  std::string data(3 * 4096 + 100, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  EXPECT_TRUE(storage->WriteFileDurably(path, data).ok());
  return data;
}

// Map, Resident, ReleaseMapped, Reopen and CacheIdentity: the reader's fast paths see the same bytes as ReadAt, and
// a reopened handle stays on the file it was opened from even after another file is renamed over its path.
TEST(PosixStorageTest, MappedAndReopenedHandlesReadTheSameInode) {
  auto storage = NewPosixStorage();
  const std::string dir = MakeTempDir("storage-");
  const std::string path = dir + "/data.bin";
  const std::string data = PatternFile(storage.get(), path);
  auto file = storage->OpenFile(path);
  ASSERT_TRUE(file.ok());
  const char* map = (*file)->Map();
  ASSERT_NE(map, nullptr);
  EXPECT_EQ((*file)->Map(), map);  // one mapping per handle
  EXPECT_EQ(std::string(map, data.size()), data);
  EXPECT_TRUE((*file)->Resident(0, data.size()));   // just written through the page cache
  EXPECT_FALSE((*file)->Resident(1, data.size()));  // past the end
  (*file)->ReleaseMapped(100, 2 * 4096);            // drops the mapping of page 1 only; the bytes stay readable
  EXPECT_EQ(std::string(map, data.size()), data);
  EXPECT_FALSE((*file)->CacheIdentity().empty());

  std::unique_ptr<ReadableFile> again = (*file)->Reopen();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->CacheIdentity(), (*file)->CacheIdentity());
  ASSERT_TRUE(storage->WriteFileDurably(dir + "/other.bin", std::string(data.size(), 'x')).ok());
  ASSERT_EQ(::rename((dir + "/other.bin").c_str(), path.c_str()), 0);
  std::unique_ptr<ReadableFile> after = (*file)->Reopen();
  ASSERT_NE(after, nullptr);
  std::string got(data.size(), '\0');
  ASSERT_TRUE(after->ReadAt(0, &got[0], got.size()).ok());
  EXPECT_EQ(got, data);  // the original inode, not the file now at the path
  auto replaced = storage->OpenFile(path);
  ASSERT_TRUE(replaced.ok());
  EXPECT_NE((*replaced)->CacheIdentity(), (*file)->CacheIdentity());
}

// ReadDirectAt: the same bytes as ReadAt, of the same inode (a file renamed over the path is not read), short only at
// the end of the file; unaligned requests refused before any read; tmpfs (before Linux 6.6) refuses O_DIRECT itself,
// which is kUnsupported naming the file.
TEST(PosixStorageTest, DirectReadsReadTheSameBytesOfTheSameInode) {
  auto storage = NewPosixStorage();
  const std::string dir = MakeTempDir("storage-");
  const std::string path = dir + "/data.bin";
  const std::string data = PatternFile(storage.get(), path);
  auto file = storage->OpenFile(path);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(storage->WriteFileDurably(dir + "/other.bin", std::string(data.size(), 'x')).ok());
  ASSERT_EQ(::rename((dir + "/other.bin").c_str(), path.c_str()), 0);
  constexpr size_t kAlign = ReadableFile::kDirectIoAlignment;
  void* raw = nullptr;
  ASSERT_EQ(::posix_memalign(&raw, kAlign, 4 * kAlign), 0);
  std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(raw), &std::free);
  auto got = (*file)->ReadDirectAt(kAlign, buf.get(), 3 * kAlign);
  if (!got.ok() && got.status().code() == StatusCode::kUnsupported) {
    EXPECT_NE(got.status().message().find(path), std::string::npos) << got.status().message();
    GTEST_SKIP() << "this file system takes no O_DIRECT reads: " << got.status().message();
  }
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got.value(), 2 * kAlign + 100) << "short at the end of the file";
  EXPECT_EQ(std::string(buf.get(), got.value()), data.substr(kAlign)) << "the inode opened, not the file renamed over";
  auto whole = (*file)->ReadDirectAt(0, buf.get(), 4 * kAlign);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  EXPECT_EQ(std::string(buf.get(), whole.value()), data);
  EXPECT_TRUE(StatusIs((*file)->ReadDirectAt(100, buf.get(), kAlign).status(), StatusCode::kInvalidArgument, {path}));
  EXPECT_TRUE(StatusIs((*file)->ReadDirectAt(0, buf.get() + 8, kAlign).status(), StatusCode::kInvalidArgument, {path}));
  EXPECT_TRUE(StatusIs((*file)->ReadDirectAt(0, buf.get(), 100).status(), StatusCode::kInvalidArgument, {path}));
  auto past = (*file)->ReadDirectAt(8 * kAlign, buf.get(), kAlign);
  ASSERT_TRUE(past.ok()) << past.status().message();
  EXPECT_EQ(past.value(), 0u);
}

TEST(PosixStorageTest, OpeningADirectorySaysSo) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  EXPECT_TRUE(StatusIs(NewPosixStorage()->OpenFile(dir).status(), StatusCode::kIo, {dir, "Is a directory"}));
}

// A checkpoint path that is a file or a FIFO is "not found" as a directory, and the message says what it is (it said
// "No such file or directory"); opening never blocks on the FIFO.
TEST(PosixStorageTest, OpeningAFileOrFifoAsADirectorySaysItIsNotOne) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Storage> storage = NewPosixStorage();
  DCKPT_ASSERT_OK(storage->WriteFileDurably(dir + "/file", "x"));
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0644), 0);
  for (const char* name : {"file", "fifo"}) {
    EXPECT_TRUE(StatusIs(storage->OpenDirectory(dir + "/" + name).status(), StatusCode::kNotFound,
                         {dir + "/" + name, "it is not a directory"}))
        << name;
  }
  EXPECT_TRUE(StatusIs(storage->OpenDirectory(dir + "/missing").status(), StatusCode::kNotFound,
                       {"No such file or directory"}));
}

TEST(PosixStorageTest, ReadFileReadsToEndOfFileNotToTheStatSize) {
  // procfs reports size 0 for files that have content.
  std::unique_ptr<Storage> storage = NewPosixStorage();
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string status, storage->ReadFile("/proc/self/status", 1 << 20));
  EXPECT_NE(status.find("Pid:"), std::string::npos);
  EXPECT_TRUE(StatusIs(storage->ReadFile("/proc/self/status", 10).status(), StatusCode::kCorrupt,
                       {"/proc/self/status", "at least 11 bytes"}));
}

// Large writes at page-aligned offsets take the O_DIRECT path (the page-aligned body) plus the page cache (the tail),
// from aligned and unaligned (bounced) buffers; small or unaligned-offset writes take the page cache only. Whatever
// the path, the file holds exactly what was written, next to neighbours written the other way.
TEST(PosixStorageTest, LargeAlignedWritesMixDirectAndBufferedIo) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Storage> storage = NewPosixStorage();
  const size_t big = (3 << 20) + 1234;  // body through O_DIRECT, a 1234-byte tail through the page cache
  const uint64_t second = 4 << 20, third = 8 << 20, small_at = 12 << 20;
  std::vector<char> src(big + 4096 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 131 + 7);
  char* aligned = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(src.data()) + 4095) & ~uintptr_t(4095));
  char* unaligned = aligned + 64;
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, storage->CreateFile(dir + "/data"));
  DCKPT_ASSERT_OK(f->Preallocate(small_at + 100));
  DCKPT_ASSERT_OK(f->WriteAt(0, aligned, big));
  DCKPT_ASSERT_OK(f->WriteAt(second, unaligned, big));
  DCKPT_ASSERT_OK(f->WriteAt(third + 512, aligned, big - 512));  // unaligned offset: page cache only
  DCKPT_ASSERT_OK(f->WriteAt(small_at, unaligned, 100));
  DCKPT_ASSERT_OK(f->Truncate(small_at + 100));
  DCKPT_ASSERT_OK(f->Sync());
  DCKPT_ASSERT_OK(f->Close());
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string got, storage->ReadFile(dir + "/data", 64 << 20));
  ASSERT_EQ(got.size(), small_at + 100);
  EXPECT_EQ(got.compare(0, big, aligned, big), 0);
  EXPECT_EQ(got.compare(second, big, unaligned, big), 0);
  EXPECT_EQ(got.compare(third + 512, big - 512, aligned, big - 512), 0);
  EXPECT_EQ(got.compare(small_at, 100, unaligned, 100), 0);
  EXPECT_EQ(got.find_first_not_of('\0', big), second);  // the gap between writes reads as zeros
}

// Nothing outside a checkpoint: a directory handle refuses links, FIFOs and devices inside it, without opening them
// (a FIFO would block the reader forever; a device could be anything). The directory itself may be reached through a
// link ("latest" -> "step-100").
TEST(PosixStorageTest, ADirectoryHandleRefusesLinksFifosAndDevicesWithoutOpeningThem) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Storage> storage = NewPosixStorage();
  DCKPT_ASSERT_OK(storage->WriteFileDurably(dir + "/outside", "secret outside the checkpoint"));
  DCKPT_ASSERT_OK(storage->CreateDir(dir + "/step-100"));
  const std::string ckpt = dir + "/step-100";
  DCKPT_ASSERT_OK(storage->WriteFileDurably(ckpt + "/regular", "inside"));
  ASSERT_EQ(::symlink((dir + "/outside").c_str(), (ckpt + "/abs-link").c_str()), 0);
  ASSERT_EQ(::symlink("../outside", (ckpt + "/rel-link").c_str()), 0);
  ASSERT_EQ(::symlink("regular", (ckpt + "/inner-link").c_str()), 0);  // even one that stays inside
  ASSERT_EQ(::symlink("/dev/zero", (ckpt + "/dev-link").c_str()), 0);
  ASSERT_EQ(::symlink("/proc/self/mem", (ckpt + "/mem-link").c_str()), 0);
  ASSERT_EQ(::mkfifo((ckpt + "/fifo").c_str(), 0644), 0);
  ASSERT_EQ(::symlink((dir + "/step-100").c_str(), (dir + "/latest").c_str()), 0);

  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Directory> handle, storage->OpenDirectory(dir + "/latest"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> ok, handle->OpenFile("regular"));
  EXPECT_EQ(ok->size(), 6u);
  for (const char* name : {"abs-link", "rel-link", "inner-link", "dev-link", "mem-link"}) {
    EXPECT_TRUE(StatusIs(handle->OpenFile(name).status(), StatusCode::kCorrupt,
                         {dir + "/latest/" + name, "symbolic link", "never follows links"}))
        << name;
    DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, handle->Exists(name));
    EXPECT_TRUE(exists) << name;
  }
  EXPECT_TRUE(StatusIs(handle->OpenFile("fifo").status(), StatusCode::kCorrupt, {"fifo", "a FIFO"}));
  // A device node inside: /dev/null's type, made where mknod is allowed.
  if (::mknod((ckpt + "/dev").c_str(), S_IFCHR | 0644, ::makedev(1, 3)) == 0) {
    EXPECT_TRUE(StatusIs(handle->OpenFile("dev").status(), StatusCode::kCorrupt, {"a device"}));
  }
}

TEST(PosixStorageTest, WritesNeverGoThroughALinkPlantedAtTheTarget) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Storage> storage = NewPosixStorage();
  DCKPT_ASSERT_OK(storage->WriteFileDurably(dir + "/victim", "do not touch"));
  ASSERT_EQ(::symlink((dir + "/victim").c_str(), (dir + "/data-00000.bin").c_str()), 0);
  ASSERT_EQ(::symlink((dir + "/victim").c_str(), (dir + "/metadata.dckpt").c_str()), 0);
  EXPECT_TRUE(StatusIs(storage->CreateFile(dir + "/data-00000.bin").status(), StatusCode::kInvalidArgument,
                       {dir + "/data-00000.bin", "symbolic link"}));
  EXPECT_TRUE(StatusIs(storage->WriteFileDurably(dir + "/metadata.dckpt", "x"), StatusCode::kInvalidArgument,
                       {"symbolic link"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string victim, storage->ReadFile(dir + "/victim", 100));
  EXPECT_EQ(victim, "do not touch");
}

// An overwrite of "latest" -> "step-100" replaces the link with the new checkpoint and never touches the link's target;
// an overwrite of a link to a directory that is not a checkpoint is refused like the directory itself.
TEST(PosixStorageTest, AnOverwriteOfALinkReplacesTheLinkNeverItsTarget) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Storage> storage = NewPosixStorage();
  DCKPT_ASSERT_OK(storage->CreateDir(dir + "/step-100"));
  DCKPT_ASSERT_OK(storage->WriteFileDurably(dir + "/step-100/metadata.dckpt", "step 100"));
  ASSERT_EQ(::symlink("step-100", (dir + "/latest").c_str()), 0);
  DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint staged,
                             StagedCheckpoint::Create(storage.get(), dir + "/latest", NewNonce(), true));
  DCKPT_ASSERT_OK(storage->WriteFileDurably(staged.StagingFile("metadata.dckpt"), "new"));
  DCKPT_ASSERT_OK(staged.Commit());
  struct stat st;
  ASSERT_EQ(::lstat((dir + "/latest").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode)) << "latest is now the new checkpoint's directory";
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string meta, storage->ReadFile(dir + "/latest/metadata.dckpt", 100));
  EXPECT_EQ(meta, "new");
  DCKPT_ASSERT_OK_AND_ASSIGN(meta, storage->ReadFile(dir + "/step-100/metadata.dckpt", 100));
  EXPECT_EQ(meta, "step 100") << "the link's target must be untouched";
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage->ListDir(dir));
  EXPECT_EQ(names, std::vector<std::string>({"latest", "step-100"}));

  DCKPT_ASSERT_OK(storage->CreateDir(dir + "/home"));
  DCKPT_ASSERT_OK(storage->WriteFileDurably(dir + "/home/keep", "k"));
  ASSERT_EQ(::symlink("home", (dir + "/home-link").c_str()), 0);
  EXPECT_TRUE(StatusIs(StagedCheckpoint::Create(storage.get(), dir + "/home-link", NewNonce(), true).status(),
                       StatusCode::kExists, {"is not a distckpt checkpoint"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(meta, storage->ReadFile(dir + "/home/keep", 100));
  EXPECT_EQ(meta, "k");
}

// The commit lock holds across processes (flock), and a process that dies holding it releases it.
TEST(PosixStorageTest, TheCommitLockHoldsAcrossProcessesAndDiesWithItsHolder) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  std::unique_ptr<Storage> storage = NewPosixStorage();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  std::fflush(nullptr);
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    auto lock = NewPosixStorage()->LockDirectory(dir, std::chrono::seconds(5));
    const char c = lock.ok() ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();  // holds the lock until killed
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  EXPECT_EQ(storage->LockDirectory(dir, std::chrono::milliseconds(200)).status().code(), StatusCode::kTimeout);
  ::kill(holder, SIGKILL);
  int status;
  ::waitpid(holder, &status, 0);
  DCKPT_EXPECT_OK(storage->LockDirectory(dir, std::chrono::seconds(5)).status());
  ::close(ready[0]);
  ::close(ready[1]);
}

// A reader pins every data file of a checkpoint with a descriptor; a soft limit too low for that is lifted to the
// hard limit instead of failing the open.
TEST(PosixStorageTest, OpeningPastTheSoftDescriptorLimitLiftsIt) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  DCKPT_ASSERT_OK(NewPosixStorage()->WriteFileDurably(dir + "/f", "x"));
  const int rc = RunInChild([&] {
    struct rlimit rl;
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max < 512) return 0;  // nothing to lift here
    rl.rlim_cur = 64;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
    std::unique_ptr<Storage> storage = NewPosixStorage();
    auto dir_handle = storage->OpenDirectory(dir);
    if (!dir_handle.ok()) return 1;
    std::vector<std::unique_ptr<ReadableFile>> held;
    for (int i = 0; i < 200; ++i) {
      auto f = (*dir_handle)->OpenFile("f");
      if (!f.ok()) {
        std::fprintf(stderr, "open #%d: %s\n", i, f.status().ToString().c_str());
        return 2;
      }
      held.push_back(std::move(f).value());
    }
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

// The descriptor table's size (FDSize in /proc/self/status) and the descriptors open, for the test below.
std::pair<long, long> DescriptorTable() {
  long size = -1, open = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("FDSize:", 0) == 0) size = std::stol(line.substr(7));
  }
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) open += e->d_name[0] != '.';
    ::closedir(d);
    --open;  // opendir's own descriptor
  }
  return {size, open};
}

// A reader about to pin many data files says so first: the table grows once, to hold all of them (each growth in a
// process with threads waits for an RCU grace period), the soft limit is lifted if it is too low, no descriptor is
// left behind, and the opens that follow grow nothing. Where the hard limit is too low the hint does nothing, and
// the opens fail as they would have, naming the file.
TEST(PosixStorageTest, ExpectingManyOpenFilesGrowsTheDescriptorTableOnce) {
  const std::string dir = MakeTempDir("storage-");
  ASSERT_FALSE(dir.empty());
  DCKPT_ASSERT_OK(NewPosixStorage()->WriteFileDurably(dir + "/f", "x"));
  EXPECT_EQ(RunInChild([&] {
              struct rlimit rl;
              if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max < 1024) return 0;  // cannot test here
              rl.rlim_cur = 64;
              if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
              auto dir_handle = NewPosixStorage()->OpenDirectory(dir);
              if (!dir_handle.ok()) return 1;
              const auto before = DescriptorTable();
              (*dir_handle)->ExpectOpenFiles(600);
              const auto after = DescriptorTable();
              if (after.first < before.second + 600 || after.second != before.second) {
                std::fprintf(stderr, "table %ld -> %ld, open %ld -> %ld\n", before.first, after.first, before.second,
                             after.second);
                return 2;
              }
              std::vector<std::unique_ptr<ReadableFile>> held;
              for (int i = 0; i < 600; ++i) {
                auto f = (*dir_handle)->OpenFile("f");
                if (!f.ok()) return 3;
                held.push_back(std::move(f).value());
              }
              return DescriptorTable().first == after.first ? 0 : 4;
            }),
            0);
  EXPECT_EQ(RunInChild([&] {
              struct rlimit rl = {100, 100};
              if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
              auto dir_handle = NewPosixStorage()->OpenDirectory(dir);
              if (!dir_handle.ok()) return 1;
              const auto before = DescriptorTable();
              (*dir_handle)->ExpectOpenFiles(1000);
              if (DescriptorTable().second != before.second) return 2;
              std::vector<std::unique_ptr<ReadableFile>> held;
              for (int i = 0; i < 200; ++i) {
                auto f = (*dir_handle)->OpenFile("f");
                if (!f.ok()) {
                  return ExpectInChild(f.status(), StatusCode::kIo, {dir + "/f", "ulimit -n"}, 3);
                }
                held.push_back(std::move(f).value());
              }
              return 4;
            }),
            0);
}

}  // namespace
}  // namespace distckpt
