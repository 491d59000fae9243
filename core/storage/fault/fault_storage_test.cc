#include "core/storage/fault/fault_storage.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "core/storage/storage.h"
#include "core/storage/storage_conformance.h"

namespace distckpt {
namespace {

std::string MakeMemoryRoot(Storage* storage) {
  if (!storage->CreateDir("/tmp").ok() || !storage->CreateDir("/tmp/conformance").ok()) return "";
  return "/tmp/conformance";
}

// With no rules the decorator is invisible: it passes the whole conformance suite.
INSTANTIATE_TEST_SUITE_P(
    FaultsOverMemory, StorageConformanceTest,
    ::testing::Values(StorageConformanceParams{
        "faults_over_memory",
        [] { return std::unique_ptr<Storage>(new FaultStorage(NewMemoryStorage(), {})); }, MakeMemoryRoot}),
    StorageConformanceTestName);

std::vector<FaultRule> Rules(const std::string& text) {
  auto rules = ParseFaultRules(text);
  EXPECT_TRUE(rules.ok()) << rules.status().ToString();
  return rules.ok() ? *rules : std::vector<FaultRule>{};
}

TEST(FaultRulesTest, ParseEveryFormAndRefuseNonsense) {
  auto rules = ParseFaultRules("write:data-00001.bin:after=3MiB:ENOSPC;sync:*:nth=1:EIO;read:data-:nth=2:stall=30s;"
                               "any:*:nth=17:kill;write:*:every:short");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  ASSERT_EQ(rules->size(), 5u);
  EXPECT_EQ((*rules)[0].after_bytes, 3u << 20);
  EXPECT_EQ((*rules)[0].err, ENOSPC);
  EXPECT_EQ((*rules)[1].path, "");
  EXPECT_EQ((*rules)[2].stall, std::chrono::seconds(30));
  EXPECT_EQ((*rules)[3].action, FaultRule::Action::kKill);
  EXPECT_EQ((*rules)[3].nth, 17u);
  EXPECT_EQ((*rules)[4].action, FaultRule::Action::kShortWrite);
  for (const char* bad : {"write:*:nth=1", "fly:*:nth=1:EIO", "write:*:nth=0:EIO", "sync:*:after=1K:EIO",
                          "sync:*:nth=1:EWHAT", "read:*:nth=1:short", "write:*:sometimes:EIO", "sync:*:nth=1:stall=x"}) {
    auto r = ParseFaultRules(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().ToString();
  }
}

TEST(FaultStorageTest, AnErrorNamesThePathAndTheErrnoAndFiresOnTheNthMatchOnly) {
  FaultStorage fs(NewMemoryStorage(), Rules("sync:victim:nth=2:EIO"));
  for (const char* name : {"/other", "/victim"}) {
    auto f = fs.CreateFile(name);
    ASSERT_TRUE(f.ok());
    EXPECT_TRUE((*f)->Sync().ok()) << name;  // match #1 for /victim
  }
  auto f = fs.CreateFile("/victim2");
  ASSERT_TRUE(f.ok());
  Status st = (*f)->Sync();  // match #2
  EXPECT_EQ(st.code(), StatusCode::kIo);
  EXPECT_EQ(st.message(), "syncing '/victim2': " + std::string(std::strerror(EIO)));
  EXPECT_TRUE((*f)->Sync().ok()) << "an nth rule fires once";
  EXPECT_EQ(fs.faults(), 1u);
  EXPECT_GE(fs.operations(), 6u);
}

TEST(FaultStorageTest, AfterBytesCutsTheWriteThatCrossesAndKeepsWhatWentBefore) {
  FaultStorage fs(NewMemoryStorage(), Rules("write:data:after=10:ENOSPC"));
  auto f = fs.CreateFile("/data");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->WriteAt(0, "abcdef", 6).ok());
  Status st = (*f)->WriteAt(6, "ghijklmn", 8);  // crosses byte 10: 4 bytes get through
  EXPECT_EQ(st.code(), StatusCode::kNoSpace);
  EXPECT_NE(st.message().find("writing 8 bytes at offset 6 to '/data'"), std::string::npos) << st.ToString();
  auto data = fs.ReadFile("/data", 100);
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(*data, "abcdefghij");
}

TEST(FaultStorageTest, AShortWriteWritesHalfThenFailsWithNoSpace) {
  FaultStorage fs(NewMemoryStorage(), Rules("write:*:nth=1:short"));
  auto f = fs.CreateFile("/f");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->WriteAt(0, "12345678", 8).code(), StatusCode::kNoSpace);
  EXPECT_EQ(*fs.ReadFile("/f", 100), "1234");
}

TEST(FaultStorageTest, ReadFaultsReachReadsThroughADirectoryAndReopenedHandles) {
  auto base = NewMemoryStorage();
  ASSERT_TRUE(base->CreateDir("/d").ok());
  ASSERT_TRUE(base->WriteFileDurably("/d/f", "payload").ok());
  FaultStorage fs(base.get(), Rules("read:/d/f:every:EIO"));
  auto dir = fs.OpenDirectory("/d");
  ASSERT_TRUE(dir.ok());
  auto f = (*dir)->OpenFile("f");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->Map(), nullptr) << "mapped reads would bypass the fault";
  char buf[7];
  EXPECT_EQ((*f)->ReadAt(0, buf, 7).code(), StatusCode::kIo);
  EXPECT_EQ((*f)->ReadAt(0, buf, 7).code(), StatusCode::kIo) << "every";
}

TEST(FaultStorageTest, AStallDelaysAndAKillKills) {
  FaultStorage fs(NewMemoryStorage(), Rules("mkdir:*:nth=1:stall=200ms"));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(fs.CreateDir("/x").ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(190));

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FaultStorage dying(NewMemoryStorage(), Rules("any:*:nth=3:kill"));
    (void)dying.CreateDir("/a");
    (void)dying.CreateDir("/b");
    (void)dying.CreateDir("/c");  // the third operation
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

}  // namespace
}  // namespace distckpt
