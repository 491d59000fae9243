// The checkpoint manager end to end: every rank a forked process, Gloo over loopback, several nodes simulated by
// giving the ranks of each "node" their own local directory and node id.
#include "core/manager/manager.h"

#include <sys/stat.h>

#include <csignal>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/comm/comm_conformance.h"
#include "core/comm/gloo/gloo.h"
#include "core/comm/gloo/gloo_test_util.h"
#include "core/cuda/host_copy_engine.h"
#include "core/engine/load.h"
#include "core/manager/manager_test_util.h"
#include "core/manager/part.h"
#include "core/storage/fault/fault_storage.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace {

using namespace manager_testing;  // NOLINT: the package's test helpers

TEST(Manager, LosingANodeRestoresFromPeersWithNothingFromPersistentStorage) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  job.persistent = job.base + "/persistent/job";  // made by the manager
  job.persist_every = 4;
  RunJob(job, 4, [](CheckpointManager* m, int rank) { return SaveSteps(m, rank, 4, 1, 6); });
  // Node b is lost with its memory; a replacement starts empty.
  ASSERT_EQ(std::system(("rm -rf '" + job.base + "/node-b'").c_str()), 0);
  RunJob(job, 4, RestoreAndCheck(4, 6, [](const RestoreSummary& s, const std::string& report, int rank) {
           DCKPT_RETURN_IF_ERROR(Expect(s.bytes_from_persistent == 0, "read from persistent storage"));
           if (rank >= 2) {
             return Expect(s.tier == Tier::kPeer && s.bytes_from_peers > 0, "node b did not fetch from peers");
           }
           return Expect(s.tier == Tier::kLocal && s.bytes_from_peers == 0, "node a fetched:\n" + report);
         }));
}

// A replacement node restores from its peers; the steps saved after that replicate to it again, so losing the other
// node next is survived too.
TEST(Manager, AReplacementNodeGetsReplicasAgainAndTheOtherNodeCanBeLostNext) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  RunJob(job, 4, [](CheckpointManager* m, int rank) { return SaveSteps(m, rank, 4, 1, 3); });
  ASSERT_EQ(std::system(("rm -rf '" + job.base + "/node-b'").c_str()), 0);
  RunJob(job, 4, [](CheckpointManager* m, int rank) -> Status {
    RankState st(rank, 4, 3, false);
    DCKPT_ASSIGN_OR_RETURN(RestoreSummary s, m->Restore(st.state, RestoreOptions()));
    DCKPT_RETURN_IF_ERROR(Expect(s.found && s.step == 3, "restored step " + std::to_string(s.step)));
    DCKPT_RETURN_IF_ERROR(st.Check(rank, 4, 3));
    return SaveSteps(m, rank, 4, 4, 5);
  });
  ASSERT_EQ(std::system(("rm -rf '" + job.base + "/node-a'").c_str()), 0);
  RunJob(job, 4, RestoreAndCheck(4, 5, [](const RestoreSummary& s, const std::string&, int rank) {
           DCKPT_RETURN_IF_ERROR(Expect(s.bytes_from_persistent == 0, "read from persistent storage"));
           return Expect(rank >= 2 || s.bytes_from_peers > 0, "node a did not fetch from node b");
         }));
}

// The restore on a replacement node copies the parts node b lost back to it at once (from node a's tier), so losing
// the other node right after, before any new step, is survived too: every value exact, nothing from
// persistent storage.
TEST(Manager, AStepRestoredOnAReplacementIsReplicatedAgainAtOnce) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  job.persistent = job.base + "/persistent/job";
  job.persist_every = 1;  // every step is persisted too: the restores below must not need it
  RunJob(job, 4, [](CheckpointManager* m, int rank) { return SaveSteps(m, rank, 4, 1, 3); });
  ASSERT_EQ(std::system(("rm -rf '" + job.base + "/node-b'").c_str()), 0);
  RunJob(job, 4, [](CheckpointManager* m, int rank) -> Status {
    RankState st(rank, 4, 3, false);
    DCKPT_ASSIGN_OR_RETURN(RestoreSummary s, m->Restore(st.state, RestoreOptions()));
    DCKPT_RETURN_IF_ERROR(Expect(s.found && s.step == 3 && s.copies_made > 0 && s.bytes_from_persistent == 0,
                                 "restored step " + std::to_string(s.step) + ", copies made " +
                                     std::to_string(s.copies_made) + ":\n" + m->restore_report()));
    DCKPT_RETURN_IF_ERROR(st.Check(rank, 4, 3));
    return m->Wait(std::chrono::seconds(60));
  });
  ASSERT_EQ(std::system(("rm -rf '" + job.base + "/node-a'").c_str()), 0);
  RunJob(job, 4, RestoreAndCheck(4, 3, [](const RestoreSummary& s, const std::string& report, int rank) {
           DCKPT_RETURN_IF_ERROR(Expect(s.bytes_from_persistent == 0 && s.tier != Tier::kPersistent,
                                        "read from persistent storage:\n" + report));
           return Expect(rank >= 2 || s.bytes_from_peers > 0, "node a did not fetch from node b:\n" + report);
         }));
}

// The newest step's only part has damaged metadata: the restore falls back to the step before, and its report names
// the part, the node and why.
TEST(Manager, ADamagedNewestPartIsNamedInTheReport) {
  const std::string base = testing_util::MakeTempDir("manager-");
  ManagerOptions o = OneNode(base);
  {
    auto m = CheckpointManager::Create(nullptr, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_TRUE(SaveSteps(m.value().get(), 0, 1, 1, 2).ok());
  }
  FlipByte(o.local_dir + "/step-0000000002/part-00000/metadata.dckpt", 40);
  auto m = CheckpointManager::Create(nullptr, o);
  ASSERT_TRUE(m.ok());
  RankState st(0, 1, 0, false);
  auto r = m.value()->Restore(st.state, RestoreOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step, 1u);
  const std::string& report = m.value()->restore_report();
  EXPECT_NE(report.find("step 2: not restorable from the local tiers: no readable part of this run is on any live "
                        "node; the copy of rank 0's part on node 'a' is unreadable: "),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("step-0000000002/part-00000"), std::string::npos) << report;
  EXPECT_EQ(report.find("(of 0)"), std::string::npos) << report;
}

TEST(Manager, RestoresOnThreeRanksFromAFourRankJob) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  RunJob(job, 4, [](CheckpointManager* m, int rank) { return SaveSteps(m, rank, 4, 1, 3); });
  Job three = job;
  three.node = [](int rank, int) { return std::string(rank < 2 ? "a" : "b"); };
  RunJob(three, 3, RestoreAndCheck(3, 3, [](const RestoreSummary& s, const std::string&, int) {
           return Expect(s.bytes_from_persistent == 0, "read from persistent storage");
         }));
}

TEST(Manager, ACorruptLocalPartIsSkippedForItsReplica) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  RunJob(job, 4, [](CheckpointManager* m, int rank) { return SaveSteps(m, rank, 4, 1, 2); });
  // Rank 0's own part on node a, in its data file's first byte (the values of "b#0"/"w#0").
  const std::string dir = job.base + "/node-a/step-0000000002/part-00000";
  FlipByte(dir + "/data-00000.bin", 0);
  RunJob(
      job, 4, RestoreAndCheck(4, 2, [](const RestoreSummary& s, const std::string& report, int rank) {
        DCKPT_RETURN_IF_ERROR(Expect(report.find("skipped the copy of rank 0's part on node 'a'") != std::string::npos,
                                     "report:\n" + report));
        return Expect(s.bytes_from_persistent == 0, "read from persistent storage");
      }));
}

TEST(Manager, PersistedStepsAreOrdinaryCheckpointsAndServeWhenEveryNodeIsLost) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  job.persistent = job.base + "/persistent";
  ::mkdir(job.persistent.c_str(), 0755);
  job.persist_every = 2;
  RunJob(job, 4, [](CheckpointManager* m, int rank) { return SaveSteps(m, rank, 4, 1, 5); });
  // Step 4 loads as any checkpoint, on one process.
  RankState one(0, 1, 4, false);
  auto loaded = Load(job.persistent + "/step-0000000004", one.state, nullptr, ReadOptions());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ASSERT_TRUE(one.Check(0, 1, 4).ok()) << one.Check(0, 1, 4).ToString();
  ASSERT_EQ(std::system(("rm -rf '" + job.base + "/node-a' '" + job.base + "/node-b'").c_str()), 0);
  job.node = [](int rank, int) { return std::string(1, static_cast<char>('a' + rank)); };
  RunJob(job, 2, RestoreAndCheck(2, 4, [](const RestoreSummary& s, const std::string&, int) {
           return Expect(s.tier == Tier::kPersistent && s.bytes_from_persistent > 0, "not from persistent storage");
         }));
}

TEST(Manager, TwoNodesLostWithOneReplicaIsAnErrorNamingTheParts) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  job.node = [](int rank, int) { return std::string(1, static_cast<char>('a' + rank)); };  // 3 nodes
  RunJob(job, 3, [](CheckpointManager* m, int rank) { return SaveSteps(m, rank, 3, 1, 2); });
  ASSERT_EQ(std::system(("rm -rf '" + job.base + "/node-a' '" + job.base + "/node-b'").c_str()), 0);
  RunJob(job, 3, [](CheckpointManager* m, int rank) -> Status {
    RankState st(rank, 3, 2, false);
    RestoreOptions ro;
    ro.fallback = false;
    auto r = m->Restore(st.state, ro);
    DCKPT_RETURN_IF_ERROR(Expect(!r.ok() && r.status().code() == StatusCode::kNotFound,
                                 "restore did not fail: " + (r.ok() ? m->restore_report() : r.status().ToString())));
    return Expect(r.status().message().find("parts of rank(s) 0") != std::string::npos,
                  "message: " + r.status().message());
  });
}

// Saves steps 1..5 while a fault kills `killed`; the survivors' saves fail (never hang), and a new job restores the
// newest complete step, `want`.
void KillAndRestore(Job job, int killed, uint64_t want) {
  RunJob(
      job, 4,
      [](CheckpointManager* m, int rank) -> Status {
        Status st = SaveSteps(m, rank, 4, 1, 5);
        return Expect(!st.ok(), "every step was saved although a rank died");
      },
      killed);
  job.local_faults = job.persistent_faults = [](int) { return std::string(); };
  RunJob(job, 4, RestoreAndCheck(4, want, [](const RestoreSummary&, const std::string&, int) { return OkStatus(); }));
}

TEST(Manager, AKillDuringReplicationLeavesTheStepIncomplete) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  // Rank 2 keeps rank 0's replicas; it dies creating the replica's staging directory of step 3.
  job.local_faults = [](int rank) {
    return rank == 2 ? "mkdir:step-0000000003/part-00000.dckpt-staging:nth=1:kill" : "";
  };
  KillAndRestore(job, 2, 2);
}

TEST(Manager, AKillWhileWritingAReplicaLeavesTheStepIncomplete) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  job.local_faults = [](int rank) {
    return rank == 3 ? "write:step-0000000003/part-00001.dckpt-staging:nth=3:kill" : "";
  };
  KillAndRestore(job, 3, 2);
}

TEST(Manager, AKillWhilePersistingNeverShowsAPartialPersistedStep) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  job.persistent = job.base + "/persistent";
  ::mkdir(job.persistent.c_str(), 0755);
  job.persist_every = 2;
  // Rank 1 dies copying its part of step 4 (its second persisted step).
  job.persistent_faults = [](int rank) { return rank == 1 ? "create:/data-00001.bin:nth=2:kill" : ""; };
  KillAndRestore(job, 1, 4);  // step 4 is complete in the local tier; its persisting failed
  // Step 2 is persisted; step 4's staging is no checkpoint.
  RankState one(0, 1, 2, false);
  ASSERT_TRUE(Load(job.persistent + "/step-0000000002", one.state, nullptr, ReadOptions()).ok());
  RankState four(0, 1, 4, false);
  auto r = Load(job.persistent + "/step-0000000004", four.state, nullptr, ReadOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
}

// Rank 2 dies at its K-th storage operation, for K across the whole run: whatever the moment, the restore gives a
// step whose every value is right (or finds nothing when no step had completed).
class KillAnywhere : public ::testing::TestWithParam<int> {};

TEST_P(KillAnywhere, RestoresACompleteStepWithRightValues) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  const int k = GetParam();
  job.local_faults = [k](int rank) { return rank == 2 ? "any:*:nth=" + std::to_string(k) + ":kill" : ""; };
  RunJob(
      job, 4, [](CheckpointManager* m, int rank) { return SaveSteps(m, rank, 4, 1, 5).ok() ? OkStatus() : OkStatus(); },
      -2);
  job.local_faults = [](int) { return std::string(); };
  RunJob(job, 4, [](CheckpointManager* m, int rank) -> Status {
    RankState probe(rank, 4, 0, false);
    DCKPT_ASSIGN_OR_RETURN(RestoreSummary s, m->Restore(probe.state, RestoreOptions()));
    if (rank == 0) std::printf("restored: %s step %llu\n", s.found ? "found" : "nothing", (unsigned long long)s.step);
    if (!s.found) return OkStatus();
    return probe.Check(rank, 4, s.step).WithContext("restored step " + std::to_string(s.step));
  });
}

INSTANTIATE_TEST_SUITE_P(Operations, KillAnywhere, ::testing::Values(5, 60, 180, 330, 450, 600, 800, 1000, 1200));

// One process, no replicas: a flipped bit anywhere in the newest step's part makes the restore take the step before
// (or the same step, when the byte is padding no reader looks at), never wrong values.
TEST(Manager, AFlippedByteAnywhereInAPartNeverGivesWrongValues) {
  const std::string base = testing_util::MakeTempDir("manager-");
  ManagerOptions o = OneNode(base);
  {
    auto m = CheckpointManager::Create(nullptr, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_TRUE(SaveSteps(m.value().get(), 0, 1, 1, 2).ok());
  }
  const std::string dir = o.local_dir + "/step-0000000002/part-00000";
  int newer = 0, older = 0;
  for (const char* name : {"metadata.dckpt", "data-00000.bin"}) {
    const std::string path = dir + "/" + name;
    struct stat sb;
    ASSERT_EQ(::stat(path.c_str(), &sb), 0) << path;
    const uint64_t stride = std::string(name) == "metadata.dckpt" ? 1 : 13;
    for (uint64_t at = 0; at < static_cast<uint64_t>(sb.st_size); at += stride) {
      FlipByte(path, at);
      auto m = CheckpointManager::Create(nullptr, o);
      ASSERT_TRUE(m.ok());
      RankState st(0, 1, 0, false);
      auto r = m.value()->Restore(st.state, RestoreOptions());
      ASSERT_TRUE(r.ok()) << name << " byte " << at << ": " << r.status().ToString();
      ASSERT_TRUE(r->found) << name << " byte " << at;
      ASSERT_TRUE(st.Check(0, 1, r->step).ok()) << name << " byte " << at << ": step " << r->step;
      (r->step == 2 ? newer : older)++;
      FlipByte(path, at);
    }
  }
  EXPECT_GT(older, 0);
  std::printf("flipped bytes: %d restored step 2 (padding), %d fell back to step 1\n", newer, older);
}

uint64_t TreeBytes(const std::string& dir) {
  uint64_t total = 0;
  std::string cmd = "find '" + dir + "' -type f -printf '%s\\n' 2>/dev/null | awk '{s+=$1} END {print s+0}'";
  FILE* p = popen(cmd.c_str(), "r");
  if (p) {
    unsigned long long v = 0;
    if (std::fscanf(p, "%llu", &v) == 1) total = v;
    pclose(p);
  }
  return total;
}

// A step larger than the budget can hold is refused up front; under a budget that holds it, the files of the local
// tier never grow past the budget however many steps are saved.
TEST(Manager, TheLocalTierStaysWithinItsBudget) {
  const std::string base = testing_util::MakeTempDir("manager-");
  ManagerOptions o = OneNode(base);
  o.local_budget_bytes = 1000;  // less than one part
  {
    auto m = CheckpointManager::Create(nullptr, o);
    ASSERT_TRUE(m.ok());
    // The first part's size is learnt from the state; a second save knows the real size of a part.
    RankState st(0, 1, 1, true);
    Status first = m.value()->Save(1, st.state, false);
    ASSERT_FALSE(first.ok());
    EXPECT_EQ(first.code(), StatusCode::kInvalidArgument) << first.ToString();
    EXPECT_NE(first.message().find("local_budget_bytes"), std::string::npos) << first.ToString();
  }
  // One part (metadata and data file) is about 14 KiB: a budget of 40 KiB holds one kept step and one in flight, so
  // the node keeps one step although keep_local asks for 4.
  // Saved back to back onto a slow disk (every sync takes 50 ms), steps wait for the ones in flight (at most two,
  // budget or not) and for the budget.
  FaultStorage slow(DefaultStorage(), ParseFaultRules("sync:*:every:stall=50ms").value());
  o.local_storage = &slow;
  o.keep_local = 4;
  auto most_files = [&](uint64_t budget, const std::string& dir) {
    o.local_budget_bytes = budget;
    o.local_dir = dir;
    auto m = CheckpointManager::Create(nullptr, o);
    EXPECT_TRUE(m.ok());
    uint64_t most = 0;
    for (uint64_t s = 1; s <= 24; ++s) {
      RankState st(0, 1, s, true);
      Status saved = m.value()->Save(s, st.state, false);
      EXPECT_TRUE(saved.ok()) << s << ": " << saved.ToString();
      most = std::max(most, TreeBytes(o.local_dir));
    }
    EXPECT_TRUE(m.value()->Wait(std::chrono::seconds(30)).ok());
    return std::max(most, TreeBytes(o.local_dir));
  };
  const uint64_t unbounded = most_files(0, base + "/unbounded");
  const uint64_t bounded = most_files(40 << 10, base + "/node-a");
  std::printf("local tier files at most: %llu bytes without a budget, %llu with a budget of %u\n",
              static_cast<unsigned long long>(unbounded), static_cast<unsigned long long>(bounded), 40u << 10);
  EXPECT_LE(bounded, 40u << 10);
  EXPECT_GT(bounded, 0u);
  auto m = CheckpointManager::Create(nullptr, o);
  ASSERT_TRUE(m.ok());
  RankState back(0, 1, 0, false);
  auto r = m.value()->Restore(back.state, RestoreOptions());
  ASSERT_TRUE(r.ok() && r->found && r->step == 24);
  ASSERT_TRUE(back.Check(0, 1, 24).ok());
}

// Pieces that do not tile a tensor (a hole: rank 1 declares too few rows) fail the step on every rank, as a collective
// save would; nothing of it is offered for restore.
TEST(Manager, PiecesThatDoNotTileATensorFailTheStepOnEveryRank) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  job.node = [](int rank, int) { return std::string(1, static_cast<char>('a' + rank)); };
  RunJob(job, 2, [](CheckpointManager* m, int rank) -> Status {
    std::vector<float> w(6 * kCols, 1.0f);
    State st;
    DCKPT_RETURN_IF_ERROR(st.AddTensor("w", DType::kF32, {kRows, kCols}));
    DCKPT_RETURN_IF_ERROR(st.AddPiece("w", {rank * 6ull, 0}, {rank == 0 ? 6ull : 4ull, kCols}, w.data()));
    DCKPT_RETURN_IF_ERROR(m->Save(1, st, false));
    Status waited = m->Wait(std::chrono::seconds(30));
    DCKPT_RETURN_IF_ERROR(Expect(
        waited.code() == StatusCode::kInvalidArgument && waited.message().find("tensor 'w'") != std::string::npos,
        "wait: " + waited.ToString()));
    RankState probe(rank, 2, 0, false);
    DCKPT_ASSIGN_OR_RETURN(RestoreSummary s, m->Restore(probe.state, RestoreOptions()));
    return Expect(!s.found, "a step that did not tile was restored");
  });
}

// A communicator whose collectives cannot run on a background thread (NCCL's say so) is refused up front.
TEST(Manager, ACommunicatorThatCannotRunInTheBackgroundIsRefused) {
  class DeviceOnly : public Communicator {
   public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string name() const override { return "device-only"; }
    Status AllGather(const std::string& mine, std::vector<std::string>* all, std::chrono::milliseconds) override {
      *all = {mine};
      return OkStatus();
    }
    Status Gather(const std::string& mine, int, std::vector<std::string>* all, std::chrono::milliseconds) override {
      *all = {mine};
      return OkStatus();
    }
    Status Broadcast(std::string*, int, std::chrono::milliseconds) override { return OkStatus(); }
    Status Barrier(std::chrono::milliseconds) override { return OkStatus(); }
    Status CheckBackgroundUse() const override { return Unsupported("device-only: not on a background thread"); }
  } comm;
  ManagerOptions o = OneNode(testing_util::MakeTempDir("manager-"));
  auto m = CheckpointManager::Create(&comm, o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnsupported) << m.status().ToString();
  EXPECT_NE(m.status().message().find("not on a background thread"), std::string::npos);
}

// keep_persistent: older persisted steps go entirely (metadata and data files), nothing else in the directory does.
TEST(Manager, OlderPersistedStepsArePrunedWhole) {
  const std::string base = testing_util::MakeTempDir("manager-");
  ManagerOptions o = OneNode(base);
  o.persistent_path = base + "/persistent";
  o.persist_every = 1;
  o.keep_persistent = 2;
  auto m = CheckpointManager::Create(nullptr, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::ofstream(o.persistent_path + "/notes.txt") << "the user's";
  ASSERT_TRUE(SaveSteps(m.value().get(), 0, 1, 1, 5).ok());
  FILE* p = popen(("cd '" + o.persistent_path + "' && find . | sort").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string listing;
  char line[512];
  while (std::fgets(line, sizeof line, p)) listing += line;
  pclose(p);
  EXPECT_EQ(listing,
            ".\n./notes.txt\n./step-0000000004\n./step-0000000004/data-00000.bin\n./step-0000000004/metadata.dckpt\n"
            "./step-0000000005\n./step-0000000005/data-00000.bin\n./step-0000000005/metadata.dckpt\n");
}

// Device memory as a source (staged by the save, snapshotted on the device or not) and as a restore's destination,
// through the host stand-in of the CUDA engine.
TEST(Manager, DevicePiecesAreSavedAndRestoredThroughTheCopyEngine) {
  for (bool snapshot : {false, true}) {
    const std::string base = testing_util::MakeTempDir("manager-");
    HostCopyEngine engine;
    ManagerOptions o = OneNode(base);
    o.copy_engine = &engine;
    o.device_snapshot = snapshot;
    const MemoryLocation device{MemoryKind::kCuda, 0, reinterpret_cast<void*>(0x51)};
    auto m = CheckpointManager::Create(nullptr, o);
    ASSERT_TRUE(m.ok());
    std::vector<float> w(1000);
    for (uint64_t step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(step * 10000 + i);
      State st;
      ASSERT_TRUE(st.AddTensor("w", DType::kF32, {1000}).ok());
      ASSERT_TRUE(st.AddPieceIn("w", {0}, {1000}, w.data(), device).ok());
      ASSERT_TRUE(m.value()->Save(step, st, false).ok());
      std::fill(w.begin(), w.end(), -1.0f);  // the caller's buffer is free once Save returns
    }
    ASSERT_TRUE(m.value()->Wait(std::chrono::seconds(30)).ok());
    const uint64_t to_device_before = engine.device_copies_issued();
    std::vector<float> back(1000, 0.0f);
    State dst;
    ASSERT_TRUE(dst.AddTensor("w", DType::kF32, {1000}).ok());
    ASSERT_TRUE(dst.AddPieceIn("w", {0}, {1000}, back.data(), device).ok());
    auto r = m.value()->Restore(dst, RestoreOptions());
    ASSERT_TRUE(r.ok() && r->found && r->step == 3) << (r.ok() ? m.value()->restore_report() : r.status().ToString());
    for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], static_cast<float>(30000 + i)) << i;
    EXPECT_GT(engine.device_copies_issued(), to_device_before);
    if (snapshot) EXPECT_GT(engine.on_device_copies_issued(), 0u);
  }
}

}  // namespace
}  // namespace distckpt
