// A real full disk: a 16 MiB tmpfs, mounted in a private mount namespace by a child process (so nothing outside the
// test sees it, and it goes away with the child). Skipped, saying why, where mounting is not allowed.
//
// A save larger than the free space fails with ENOSPC naming the file, commits nothing and frees the space it took;
// an overwrite that does not fit leaves the old checkpoint in place; one that fits beside the old checkpoint replaces
// it and frees the old one's space.
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/base/testing/temp_dir.h"
#include "core/engine/save.h"
#include "core/engine/save_async.h"
#include "core/storage/storage.h"
#include "tests/faults/test_state.h"

namespace distckpt {
namespace {

using testing_util::CheckCheckpoint;
using testing_util::TestState;

constexpr int kSkip = 77;

uint64_t FreeMiB(const std::string& dir) {
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) != 0) return 0;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize >> 20;
}

Status SaveMiB(const std::string& path, uint64_t variant, uint64_t mib, bool overwrite, bool async) {
  TestState s(/*for_save=*/true, 0, 1, variant, mib);
  SaveOptions so;
  so.overwrite = overwrite;
  if (!async) return Save(path, s.state(), nullptr, so).status();
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<SaveFuture> future, SaveAsync(path, s.state(), nullptr, so));
  return future->Wait(std::chrono::minutes(1)).status();
}

std::string Listing(const std::string& dir) {
  auto names = DefaultStorage()->ListDir(dir);
  std::string s;
  for (const std::string& n : names.ok() ? *names : std::vector<std::string>{}) s += (s.empty() ? "" : " ") + n;
  return s;
}

// Runs inside the child, on the mounted tmpfs at `dir`. Returns the number of failed checks.
void Scenarios(const std::string& dir) {
  ASSERT_GE(FreeMiB(dir), 15u);
  ASSERT_TRUE(SaveMiB(dir + "/step-1", 1, 6, false, false).ok());
  const uint64_t free_with_one = FreeMiB(dir);

  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    // Larger than the free space, at a new path.
    Status st = SaveMiB(dir + "/step-2", 2, 12, false, async);
    EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.ToString();
    EXPECT_NE(st.message().find(dir + "/step-2.dckpt-staging-"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("data-00000.bin"), std::string::npos) << st.ToString();
    EXPECT_EQ(Listing(dir), "step-1") << "a failed save left something behind";
    EXPECT_GE(FreeMiB(dir) + 1, free_with_one) << "the failed save did not give its space back";
    EXPECT_EQ(CheckCheckpoint(dir + "/step-1", 1, 6), "");

    // An overwrite that does not fit beside the old checkpoint: the old one stays.
    st = SaveMiB(dir + "/step-1", 3, 12, true, async);
    EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.ToString();
    EXPECT_EQ(Listing(dir), "step-1");
    EXPECT_EQ(CheckCheckpoint(dir + "/step-1", 1, 6), "");
  }

  // An overwrite that fits beside it (6 + 8 <= 16 MiB): replaces it, and the old one's space comes back.
  ASSERT_TRUE(SaveMiB(dir + "/step-1", 4, 8, true, false).ok());
  EXPECT_EQ(Listing(dir), "step-1");
  EXPECT_EQ(CheckCheckpoint(dir + "/step-1", 4, 8), "");
  EXPECT_GE(FreeMiB(dir) + 1, 16 - 9) << "the replaced checkpoint's space was not freed";
}

TEST(FullDiskTest, NoSpaceIsAClearErrorAndCommitsNothing) {
  const std::string dir = testing_util::MakeTempDir("small-disk-");
  int why[2];
  ASSERT_EQ(::pipe(why), 0);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(why[0]);
    std::string reason;
    if (::unshare(CLONE_NEWNS) != 0) {
      reason = std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
    } else if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      reason = std::string("making / private: ") + std::strerror(errno);
    } else if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=16m") != 0) {
      reason = std::string("mounting a 16 MiB tmpfs: ") + std::strerror(errno);
    }
    if (!reason.empty()) {
      (void)!::write(why[1], reason.data(), reason.size());
      ::_exit(kSkip);
    }
    Scenarios(dir);
    std::fflush(nullptr);
    ::_exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  ::close(why[1]);
  char buf[256] = {};
  const ssize_t n = ::read(why[0], buf, sizeof buf - 1);
  ::close(why[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == kSkip) {
    GTEST_SKIP() << "cannot mount a small filesystem here (" << std::string(buf, n > 0 ? n : 0)
                 << "); the ENOSPC paths are still covered by fault_injection_test";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the scenarios failed in the child (see above)";
}

}  // namespace
}  // namespace distckpt
