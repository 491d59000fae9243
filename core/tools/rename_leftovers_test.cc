// The leftovers of the rename layout (FORMAT.md 6.1) on a real file system: what each kind of directory is judged,
// that links and foreign names are never looked into or removed, and that removal takes only what was judged.
#include "core/tools/rename_leftovers.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/storage/storage.h"
#include "core/tools/leftovers.h"

namespace distckpt {
namespace {

using std::chrono::seconds;

class RenameLeftoversTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing_util::MakeTempDir("leftovers-"); }
  void TearDown() override { (void)DefaultStorage()->RemoveAll(dir_); }

  std::string MakeDir(const std::string& name) {
    const std::string p = dir_ + "/" + name;
    EXPECT_EQ(::mkdir(p.c_str(), 0755), 0) << p;
    return p;
  }
  static void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
  // Sets the modification time of `path` (not following a link) `ago` seconds into the past.
  static void Age(const std::string& path, int ago) {
    timespec t[2];
    ::clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= ago;
    t[1] = t[0];
    EXPECT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, AT_SYMLINK_NOFOLLOW), 0) << path;
  }
  static std::string Marker(const std::string& host, long pid) {
    return "distckpt staging directory (not committed)\nhost: " + host + "\npid: " + std::to_string(pid) +
           "\nstarted_utc: 2026-01-01T00:00:00Z\nfinal_path: x\n";
  }
  static std::string Host() {
    char h[256] = {};
    gethostname(h, sizeof h - 1);
    return h;
  }
  // A pid that no process has: a child that has exited and was reaped.
  static long DeadPid() {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    int status = 0;
    ::waitpid(child, &status, 0);
    return child;
  }
  const RenameLeftover* Find(const std::vector<RenameLeftover>& all, const std::string& name) {
    for (const RenameLeftover& l : all) {
      if (l.name == name) return &l;
    }
    return nullptr;
  }

  std::string dir_;
};

TEST_F(RenameLeftoversTest, EachKindIsJudgedByItsWriterAndItsIdleTime) {
  const std::string live = MakeDir("a.dckpt-staging-0000000000000001");
  Write(live + "/STAGING", Marker(Host(), ::getpid()));
  const std::string exited = MakeDir("b.dckpt-staging-0000000000000002");
  Write(exited + "/STAGING", Marker(Host(), DeadPid()));
  const std::string elsewhere = MakeDir("c.dckpt-staging-0000000000000003");
  Write(elsewhere + "/STAGING", Marker("another-host.example", 4242));
  const std::string bare = MakeDir("d.dckpt-staging-0000000000000004");
  const std::string unrenamed = MakeDir("e.dckpt-staging-0000000000000005");
  Write(unrenamed + "/metadata.dckpt", "m");
  Write(unrenamed + "/data-00000.bin", std::string(1000, 'x'));
  const std::string old = MakeDir("f.dckpt-old-0000000000000006");
  const std::string deleting = MakeDir("g.dckpt-deleting-0000000000000007");
  MakeDir("h");  // a checkpoint's name, not a leftover
  for (const std::string& p : {live, exited, elsewhere, bare, unrenamed, old, deleting}) Age(p, 7200);
  Age(unrenamed + "/metadata.dckpt", 7200);
  Age(unrenamed + "/data-00000.bin", 7200);
  Age(exited + "/STAGING", 7200);
  Age(elsewhere + "/STAGING", 7200);
  Age(live + "/STAGING", 7200);

  auto all = ScanRenameLeftovers(dir_, seconds(3600));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 7u);
  const RenameLeftover* l = Find(*all, "a.dckpt-staging-0000000000000001");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->kind, RenameLeftover::Kind::kStaging);
  EXPECT_EQ(l->writer, WriterState::kRunning);
  EXPECT_FALSE(l->garbage) << "a live writer's directory is never garbage, however idle";
  EXPECT_NE(l->reason.find("is running"), std::string::npos) << l->reason;
  l = Find(*all, "b.dckpt-staging-0000000000000002");
  EXPECT_EQ(l->writer, WriterState::kExited);
  EXPECT_TRUE(l->garbage);
  EXPECT_NE(l->reason.find("has exited; idle 2h0"), std::string::npos) << l->reason;
  l = Find(*all, "c.dckpt-staging-0000000000000003");
  EXPECT_EQ(l->writer, WriterState::kUnknown);
  EXPECT_TRUE(l->garbage);
  EXPECT_NE(l->reason.find("on host another-host.example"), std::string::npos) << l->reason;
  l = Find(*all, "d.dckpt-staging-0000000000000004");
  EXPECT_TRUE(l->garbage);
  EXPECT_NE(l->reason.find("no STAGING marker"), std::string::npos) << l->reason;
  l = Find(*all, "e.dckpt-staging-0000000000000005");
  EXPECT_EQ(l->kind, RenameLeftover::Kind::kCompleteUnrenamed);
  EXPECT_EQ(l->final_name, "e");
  EXPECT_EQ(l->bytes, 1001u);
  EXPECT_TRUE(l->garbage);
  EXPECT_EQ(Find(*all, "f.dckpt-old-0000000000000006")->kind, RenameLeftover::Kind::kReplaced);
  EXPECT_EQ(Find(*all, "g.dckpt-deleting-0000000000000007")->kind, RenameLeftover::Kind::kDeleting);
  EXPECT_TRUE(Find(*all, "g.dckpt-deleting-0000000000000007")->garbage);

  // Within a longer grace period nothing idle for two hours is garbage.
  auto patient = ScanRenameLeftovers(dir_, seconds(3 * 3600));
  ASSERT_TRUE(patient.ok());
  for (const RenameLeftover& x : *patient) EXPECT_FALSE(x.garbage) << x.name << ": " << x.reason;
  // Something written into a staging directory just now makes it active again.
  Write(bare + "/data-00000.bin", "fresh");
  auto again = ScanRenameLeftovers(dir_, seconds(3600), "d");
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), 1u);
  EXPECT_FALSE((*again)[0].garbage) << (*again)[0].reason;
}

TEST_F(RenameLeftoversTest, LinksAndFilesNamedLikeLeftoversAreNeverTouched) {
  const std::string outside = MakeDir("outside");
  Write(outside + "/precious", "keep me");
  ASSERT_EQ(::symlink(outside.c_str(), (dir_ + "/x.dckpt-old-00000000000000aa").c_str()), 0);
  Write(dir_ + "/y.dckpt-deleting-00000000000000bb", "a file");
  MakeDir("z.dckpt-old-NOTHEX");
  MakeDir(".dckpt-old-00000000000000cc");  // no checkpoint name
  auto all = ScanRenameLeftovers(dir_, seconds(0));
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty()) << (*all)[0].name;
  EXPECT_EQ(RemoveRenameLeftover(dir_ + "/x.dckpt-old-00000000000000aa", seconds(0)).code(), StatusCode::kNotFound);
  EXPECT_EQ(RemoveRenameLeftover(dir_ + "/y.dckpt-deleting-00000000000000bb", seconds(0)).code(),
            StatusCode::kNotFound);
  std::ifstream in(outside + "/precious");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "keep me");
  struct stat st;
  EXPECT_EQ(::lstat((dir_ + "/x.dckpt-old-00000000000000aa").c_str(), &st), 0);
}

TEST_F(RenameLeftoversTest, RemovalTakesOnlyGarbageAndNeverFollowsLinksInside) {
  const std::string outside = MakeDir("outside");
  Write(outside + "/precious", "keep me");
  const std::string old = MakeDir("ckpt.dckpt-old-00000000000000dd");
  MakeDir("ckpt.dckpt-old-00000000000000dd/sub");
  Write(old + "/sub/data-00000.bin", "data");
  ASSERT_EQ(::symlink(outside.c_str(), (old + "/sub/link").c_str()), 0);
  Age(old, 100);
  Age(old + "/sub", 100);
  const std::string live = MakeDir("ckpt.dckpt-staging-00000000000000ee");
  Write(live + "/STAGING", Marker(Host(), ::getpid()));

  Status kept = RemoveRenameLeftover(old, seconds(3600));
  EXPECT_EQ(kept.code(), StatusCode::kState) << kept.ToString();
  EXPECT_NE(kept.message().find("grace period"), std::string::npos) << kept.message();
  Status running = RemoveRenameLeftover(live, seconds(0));
  EXPECT_EQ(running.code(), StatusCode::kState);
  EXPECT_NE(running.message().find("is running"), std::string::npos) << running.message();

  Status removed = RemoveRenameLeftover(old, seconds(10));
  ASSERT_TRUE(removed.ok()) << removed.ToString();
  auto left = DefaultStorage()->ListDir(dir_);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(*left, (std::vector<std::string>{"ckpt.dckpt-staging-00000000000000ee", "outside"}));
  EXPECT_TRUE(*DefaultStorage()->Exists(outside + "/precious"));
}

// dckpt_storage_stat / dckpt_storage_remove_leftovers on a POSIX checkpoint path take in what lies beside it.
TEST_F(RenameLeftoversTest, ACheckpointPathOnAFileSystemCountsAndRemovesWhatLiesBesideIt) {
  const std::string exited = MakeDir("ckpt.dckpt-staging-0000000000000011");
  const std::string marker = Marker(Host(), DeadPid());
  Write(exited + "/STAGING", marker);
  Write(exited + "/data-00000.bin", std::string(10, 'x'));
  const std::string live = MakeDir("ckpt.dckpt-staging-0000000000000012");
  Write(live + "/STAGING", Marker(Host(), ::getpid()));
  MakeDir("other.dckpt-old-0000000000000013");  // another checkpoint's: not this path's
  Storage* posix = DefaultStorage();
  auto scan = ScanCheckpointPath(posix, dir_ + "/ckpt", seconds(0));
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_EQ(scan->kind, CheckpointScan::Kind::kIncomplete);
  EXPECT_EQ(scan->leftover_files, 1u);
  EXPECT_EQ(scan->leftover_bytes, 10u + marker.size());
  EXPECT_EQ(scan->saves_in_progress, 1u);
  std::vector<std::string> reported;
  Status st = RemoveLeftovers(posix, dir_ + "/ckpt", seconds(0), /*dry_run=*/false, [&](const std::string& p) {
    reported.push_back(p);
    return OkStatus();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(reported, std::vector<std::string>{exited});
  EXPECT_FALSE(*posix->Exists(exited));
  EXPECT_TRUE(*posix->Exists(live));
  EXPECT_TRUE(*posix->Exists(dir_ + "/other.dckpt-old-0000000000000013"));
}

}  // namespace
}  // namespace distckpt
