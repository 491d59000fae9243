// The fault-injection suite (issue 10): EIO on write and read, ENOSPC part way, short writes, fsync failures, failed
// renames and swaps, and stalled disks, in save, async save and load, in one process (here, in-process, where leaks
// of descriptors are counted) and on one rank of several (real processes over Gloo). Each fault must give a clear
// error naming the path; nothing is committed; the previous checkpoint (another path, or the same one for an
// overwrite) stays byte-exact; no other rank hangs; no descriptor leaks (memory leaks: under --config=asan).
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/engine/load.h"
#include "core/engine/save.h"
#include "core/engine/save_async.h"
#include "core/storage/fault/fault_storage.h"
#include "core/storage/storage.h"
#include "tests/faults/test_state.h"
#include "tools/launcher/launcher.h"

namespace distckpt {
namespace {

using testing_util::CheckCheckpoint;
using testing_util::TestState;

constexpr uint64_t kMiB = 4;  // the state: 4 MiB, written in several segments per rank

int OpenDescriptors() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

std::vector<std::string> Names(const std::string& dir) {
  auto names = DefaultStorage()->ListDir(dir);
  return names.ok() ? *names : std::vector<std::string>{"<" + names.status().ToString() + ">"};
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

Status SaveVariant(const std::string& path, uint64_t variant, Storage* storage, bool overwrite, bool async) {
  TestState s(/*for_save=*/true, 0, 1, variant, kMiB);
  DCKPT_RETURN_IF_ERROR(s.status());
  SaveOptions so;
  so.overwrite = overwrite;
  so.storage = storage;
  so.checksum_block_size = 64 << 10;
  if (!async) return Save(path, s.state(), nullptr, so).status();
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<SaveFuture> future, SaveAsync(path, s.state(), nullptr, so));
  s.DropBuffers();
  return future->Wait(std::chrono::minutes(5)).status();
}

struct SaveFault {
  const char* name;
  const char* rules;
  const char* names;  // what the error must mention
};

// Every storage step a save takes, failing. (Data files are written in 1 MiB segments here.)
const SaveFault kSaveFaults[] = {
    {"EioOnTheFirstDataWrite", "write:data-00000.bin:nth=1:EIO", "data-00000.bin"},
    {"EioOnALaterDataWrite", "write:data-00000.bin:nth=3:EIO", "data-00000.bin"},
    {"NoSpacePartWay", "write:data-00000.bin:after=2500K:ENOSPC", "data-00000.bin"},
    {"ShortWrite", "write:data-:nth=2:short", "data-00000.bin"},
    {"QuotaExceeded", "write:data-:nth=1:EDQUOT", "data-00000.bin"},
    {"PreallocateNoSpace", "preallocate:*:nth=1:ENOSPC", "data-00000.bin"},
    {"CreateReadOnlyFilesystem", "create:data-:nth=1:EROFS", "data-00000.bin"},
    {"DataFsyncFails", "sync:data-00000.bin:nth=1:EIO", "data-00000.bin"},
    {"DataCloseFails", "close:data-00000.bin:nth=1:EIO", "data-00000.bin"},
    {"TruncateFails", "truncate:*:nth=1:EIO", "data-00000.bin"},
    {"MetadataWriteNoSpace", "writefile:metadata.dckpt:nth=1:ENOSPC", "metadata.dckpt"},
    {"StagingMarkerWriteFails", "writefile:STAGING:nth=1:EIO", "STAGING"},
    {"StagingDirectoryFails", "mkdir:*:nth=1:EACCES", ".dckpt-staging-"},
    {"DirectoryFsyncFails", "syncdir:*:nth=2:EIO", ".dckpt-staging-"},
    {"MarkerRemovalFails", "remove:STAGING:nth=1:EIO", "STAGING"},
    {"CommitLockFails", "lock:*:nth=1:EIO", "locking directory"},
    {"RenameIntoPlaceFails", "rename:*:nth=1:EIO", ".dckpt-staging-"},
    {"ParentFsyncFails", "syncdir:*:nth=3:EIO", "syncing directory"},
};

class SaveFaultTest : public ::testing::TestWithParam<std::tuple<SaveFault, bool, bool>> {};  // fault, overwrite, async

TEST_P(SaveFaultTest, ClearErrorNothingCommittedPreviousIntactNoLeak) {
  const auto& [fault, overwrite, async] = GetParam();
  const std::string dir = testing_util::MakeTempDir("save-fault-");
  const std::string earlier = dir + "/step-1", path = overwrite ? earlier : dir + "/step-2";
  ASSERT_TRUE(SaveVariant(earlier, 1, nullptr, false, false).ok());
  const int fds = OpenDescriptors();
  {
    auto rules = ParseFaultRules(fault.rules);
    ASSERT_TRUE(rules.ok()) << rules.status().ToString();
    FaultStorage faulty(DefaultStorage(), *rules);
    Status st = SaveVariant(path, 2, &faulty, overwrite, async);
    ASSERT_EQ(faulty.faults(), 1u) << "the fault never fired: " << fault.rules;
    ASSERT_FALSE(st.ok()) << fault.rules;
    EXPECT_NE(st.message().find(fault.names), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(dir), std::string::npos) << "the error names the path: " << st.ToString();
  }
  EXPECT_EQ(OpenDescriptors(), fds) << "descriptors leaked";
  // The previous checkpoint is intact, at its own path or at the one being overwritten.
  EXPECT_EQ(CheckCheckpoint(earlier, 1, kMiB), "");
  // Nothing was committed (not even after a move into place whose parent fsync failed: it is undone), and the
  // failed save cleaned up after itself.
  EXPECT_EQ(Joined(Names(dir)), "step-1") << "left behind";
}

std::string SaveFaultName(const ::testing::TestParamInfo<std::tuple<SaveFault, bool, bool>>& i) {
  return std::string(std::get<0>(i.param).name) + (std::get<1>(i.param) ? "Overwrite" : "") +
         (std::get<2>(i.param) ? "Async" : "");
}

INSTANTIATE_TEST_SUITE_P(Faults, SaveFaultTest,
                         ::testing::Combine(::testing::ValuesIn(kSaveFaults), ::testing::Bool(), ::testing::Bool()),
                         SaveFaultName);

// An overwrite whose atomic swap fails: the old checkpoint stays in place.
TEST(SaveFaultTest, AFailedSwapLeavesTheOldCheckpointInPlace) {
  const std::string dir = testing_util::MakeTempDir("swap-fault-");
  ASSERT_TRUE(SaveVariant(dir + "/ckpt", 1, nullptr, false, false).ok());
  FaultStorage faulty(DefaultStorage(), *ParseFaultRules("exchange:*:nth=1:EIO"));
  Status st = SaveVariant(dir + "/ckpt", 2, &faulty, /*overwrite=*/true, false);
  EXPECT_EQ(st.code(), StatusCode::kIo) << st.ToString();
  EXPECT_NE(st.message().find("exchanging"), std::string::npos) << st.ToString();
  EXPECT_EQ(CheckCheckpoint(dir + "/ckpt", 1, kMiB), "");
  EXPECT_EQ(Joined(Names(dir)), "ckpt");
}

struct LoadFault {
  const char* name;
  const char* rules;
  const char* names;
};

const LoadFault kLoadFaults[] = {
    {"EioOnRead", "read:data-00000.bin:nth=1:EIO", "data-00000.bin"},
    {"EioOnALaterRead", "read:data-00000.bin:nth=3:EIO", "data-00000.bin"},
    {"DataFileCannotBeOpened", "open:data-00000.bin:nth=1:EACCES", "data-00000.bin"},
    {"MetadataCannotBeOpened", "open:metadata.dckpt:nth=1:EIO", "metadata.dckpt"},
    {"DirectoryCannotBeOpened", "opendir:*:nth=1:EACCES", "step-1"},
};

class LoadFaultTest : public ::testing::TestWithParam<LoadFault> {};

TEST_P(LoadFaultTest, ClearErrorAndNoLeak) {
  const LoadFault& fault = GetParam();
  const std::string dir = testing_util::MakeTempDir("load-fault-");
  ASSERT_TRUE(SaveVariant(dir + "/step-1", 1, nullptr, false, false).ok());
  const int fds = OpenDescriptors();
  {
    FaultStorage faulty(DefaultStorage(), *ParseFaultRules(fault.rules));
    TestState loaded(/*for_save=*/false, 0, 1, 1, kMiB);
    ReadOptions ro;
    ro.storage = &faulty;
    auto r = Load(dir + "/step-1", loaded.state(), nullptr, ro);
    ASSERT_EQ(faulty.faults(), 1u) << fault.rules;
    ASSERT_FALSE(r.ok()) << "a load whose read failed reported success";
    EXPECT_NE(r.status().message().find(fault.names), std::string::npos) << r.status().ToString();
  }
  EXPECT_EQ(OpenDescriptors(), fds) << "descriptors leaked";
  EXPECT_EQ(CheckCheckpoint(dir + "/step-1", 1, kMiB), "") << "a failed load changed the checkpoint";
}

INSTANTIATE_TEST_SUITE_P(Faults, LoadFaultTest, ::testing::ValuesIn(kLoadFaults),
                         [](const ::testing::TestParamInfo<LoadFault>& i) { return std::string(i.param.name); });

// ---- One rank of several ----------------------------------------------------------------------------------------

std::string Worker() { return launcher::Runfile("tests/faults/fault_worker"); }

std::vector<launcher::RankResult> RunRanks(int world, const std::vector<std::string>& args,
                                           std::chrono::milliseconds timeout) {
  launcher::LaunchSpec spec;
  spec.program = Worker();
  spec.world_size = world;
  spec.args = args;
  spec.log_dir = testing_util::MakeTempDir("logs-");
  spec.timeout = timeout;
  return launcher::Launch(spec);
}

struct RankFault {
  const char* name;
  const char* mode;
  const char* rules;
  int rank;
  const char* names;  // in the faulty rank's error
  bool stall;         // the faulty rank stalls past the collective timeout
};

const RankFault kRankFaults[] = {
    {"SaveEioOnRank1", "save", "write:data-00001.bin:nth=2:EIO", 1, "data-00001.bin", false},
    {"SaveNoSpaceOnRank2", "save", "write:data-00002.bin:after=300K:ENOSPC", 2, "data-00002.bin", false},
    {"SaveShortWriteOnRank1", "save", "write:data-:nth=1:short", 1, "data-00001.bin", false},
    {"SaveFsyncFailsOnRank2", "save", "sync:data-00002.bin:nth=1:EIO", 2, "data-00002.bin", false},
    {"SaveMetadataFailsOnCoordinator", "save", "writefile:metadata.dckpt:nth=1:ENOSPC", 0, "metadata.dckpt", false},
    {"SaveRenameFailsOnCoordinator", "save", "rename:*:nth=1:EIO", 0, "renaming", false},
    {"SaveStalledDiskOnRank1", "save", "write:data-00001.bin:nth=1:stall=60s", 1, "", true},
    {"LoadEioOnRank2", "load", "read:data-:nth=1:EIO", 2, "data-0000", false},
    {"LoadOpenFailsOnRank1", "load", "open:data-:nth=1:EACCES", 1, "data-0000", false},
    {"LoadStalledDiskOnRank1", "load", "read:data-:nth=1:stall=60s", 1, "", true},
};

class RankFaultTest : public ::testing::TestWithParam<RankFault> {};

TEST_P(RankFaultTest, EveryRankFailsClearlyAndNobodyHangs) {
  const RankFault& f = GetParam();
  const int world = 3;
  const std::string dir = testing_util::MakeTempDir("rank-fault-");
  const std::string earlier = dir + "/step-1";
  for (const auto& r : RunRanks(world, {"--mode", "save", "--path", earlier, "--variant", "1", "--mb",
                                        std::to_string(kMiB)},
                                std::chrono::seconds(60))) {
    ASSERT_EQ(r.exit_code, 0) << r.log;
  }
  const std::string path = std::string(f.mode) == "save" ? dir + "/step-2" : earlier;
  const auto results = RunRanks(world,
                                {"--mode", f.mode, "--path", path, "--variant", std::string(f.mode) == "save" ? "2" : "1",
                                 "--mb", std::to_string(kMiB), "--faults", f.rules, "--fault-rank",
                                 std::to_string(f.rank), "--timeout-ms", "4000"},
                                std::chrono::seconds(f.stall ? 12 : 60));
  ASSERT_EQ(results.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const auto& res = results[r];
    if (f.stall && r == f.rank) continue;  // still asleep in its disk; the launcher kills it
    EXPECT_FALSE(res.timed_out) << "rank " << r << " hung:\n" << res.log;
    EXPECT_EQ(res.exit_code, 3) << "rank " << r << ":\n" << res.log;
    EXPECT_LT(res.seconds, 15.0) << "rank " << r << " took too long to fail";
    if (r == f.rank) {
      EXPECT_NE(res.log.find(f.names), std::string::npos) << res.log;
      EXPECT_NE(res.log.find(dir), std::string::npos) << "the error names the path:\n" << res.log;
    } else {
      // The others name the failed rank, or carry its own error (the coordinator's commit error reaches every rank).
      const bool names_rank = res.log.find("rank " + std::to_string(f.rank)) != std::string::npos;
      const bool carries_error = *f.names != '\0' && res.log.find(f.names) != std::string::npos;
      EXPECT_TRUE(names_rank || carries_error) << "rank " << r << " does not say what failed:\n" << res.log;
    }
  }
  if (std::string(f.mode) == "save") {
    // Nothing committed; the coordinator removed the staging directory (unless the coordinator itself failed in a
    // way that leaves it recognisable: then only staging names may remain).
    for (const std::string& name : Names(dir)) {
      std::string final_name;
      EXPECT_TRUE(name == "step-1" || ParseStagingName(name, &final_name)) << "left behind: " << name;
    }
    EXPECT_FALSE(*DefaultStorage()->Exists(path)) << "a failed save committed " << path;
  }
  EXPECT_EQ(CheckCheckpoint(earlier, 1, kMiB), "");
}

INSTANTIATE_TEST_SUITE_P(Faults, RankFaultTest, ::testing::ValuesIn(kRankFaults),
                         [](const ::testing::TestParamInfo<RankFault>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace distckpt
