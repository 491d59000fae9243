// The checkpoint manager end to end: every rank a forked process, Gloo over loopback, several nodes simulated by
// giving the ranks of each "node" their own local directory and node id.
#include "core/manager/manager.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/comm/comm_conformance.h"
#include "core/comm/gloo/gloo.h"
#include "core/comm/gloo/gloo_test_util.h"
#include "core/engine/load.h"
#include "core/manager/part.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace {

using comm_testing::RunRanks;

constexpr uint64_t kRows = 12, kCols = 8;

float Value(uint64_t step, uint64_t row, uint64_t col) { return static_cast<float>(step * 1000 + row * 10 + col); }

// Rank r of n holds rows [r*kRows/n, (r+1)*kRows/n) of "w", a replicated "b" of 4 values, and a bytes entry.
struct RankState {
  std::vector<float> w, b;
  std::string note;
  State state;
  RankState(int rank, int n, uint64_t step, bool fill) {
    const uint64_t lo = rank * kRows / n, hi = (rank + 1) * kRows / n;
    w.resize((hi - lo) * kCols);
    b.resize(4);
    note = fill ? "step=" + std::to_string(step) : std::string(32, '\0');
    for (uint64_t r = lo; r < hi && fill; ++r) {
      for (uint64_t c = 0; c < kCols; ++c) w[(r - lo) * kCols + c] = Value(step, r, c);
    }
    for (uint64_t i = 0; i < 4 && fill; ++i) b[i] = Value(step, 0, i) + 0.5f;
    (void)state.AddTensor("w", DType::kF32, {kRows, kCols});
    (void)state.AddPiece("w", {lo, 0}, {hi - lo, kCols}, w.data());
    (void)state.AddTensor("b", DType::kF32, {4});
    (void)state.AddPiece("b", {0}, {4}, b.data());
    (void)state.AddBytes("note", note.data(), note.size());
  }
  Status Check(int rank, int n, uint64_t step) const {
    const uint64_t lo = rank * kRows / n;
    for (size_t i = 0; i < w.size(); ++i) {
      const float want = Value(step, lo + i / kCols, i % kCols);
      if (w[i] != want) {
        return Internal("w[" + std::to_string(lo + i / kCols) + "," + std::to_string(i % kCols) +
                        "] = " + std::to_string(w[i]) + ", want " + std::to_string(want));
      }
    }
    for (uint64_t i = 0; i < 4; ++i) {
      if (b[i] != Value(step, 0, i) + 0.5f) return Internal("b[" + std::to_string(i) + "] wrong");
    }
    const std::string want = "step=" + std::to_string(step);
    if (state.bytes()[0].loaded_size != want.size() || note.compare(0, want.size(), want) != 0) {
      return Internal("note wrong: " + note.substr(0, state.bytes()[0].loaded_size));
    }
    return OkStatus();
  }
};

struct Job {
  std::string base;  // node directories below it
  std::string persistent;
  int replicas = 1;
  uint64_t persist_every = 0;
  std::function<std::string(int rank, int n)> node = [](int rank, int n) {
    return std::string(1, static_cast<char>('a' + rank / 2));
  };
};

// Runs `body` on n forked ranks with a Gloo group and a manager each; every rank must succeed.
void RunJob(const Job& job, int n, const std::function<Status(CheckpointManager*, int rank)>& body) {
  const std::string rendezvous = "file://" + testing_util::MakeTempDir("manager-rdv-");
  auto outcomes = RunRanks(n, std::chrono::seconds(120), [&](int rank) {
    auto comm = NewGlooCommunicator(gloo_testing::Loopback(rank, n, rendezvous, std::chrono::seconds(30)));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    ManagerOptions o;
    o.node_id = job.node(rank, n);
    o.local_dir = job.base + "/node-" + o.node_id;
    o.replicas = job.replicas;
    o.persistent_path = job.persistent;
    o.persist_every = job.persist_every;
    o.timeout = std::chrono::seconds(30);
    o.exchange_round_bytes = 100;  // many rounds even for a small state
    auto m = CheckpointManager::Create(comm.value().get(), o);
    if (!m.ok()) return comm_testing::ReportInChild(rank, m.status());
    return comm_testing::ReportInChild(rank, body(m.value().get(), rank));
  });
  ASSERT_TRUE(comm_testing::AllExitedZero(outcomes)) << comm_testing::Describe(outcomes);
}

Status SaveSteps(CheckpointManager* m, int rank, int n, uint64_t first, uint64_t last) {
  for (uint64_t s = first; s <= last; ++s) {
    RankState st(rank, n, s, true);
    DCKPT_RETURN_IF_ERROR(m->Save(s, st.state, false));
  }
  return m->Wait(std::chrono::seconds(60));
}

Status Expect(bool ok, const std::string& what) { return ok ? OkStatus() : Internal(what); }

// Restores on n ranks and checks the values of `step`; `check` looks at the summary.
std::function<Status(CheckpointManager*, int)> RestoreAndCheck(
    int n, uint64_t step, const std::function<Status(const RestoreSummary&, const std::string&, int)>& check) {
  return [=](CheckpointManager* m, int rank) -> Status {
    RankState st(rank, n, step, false);
    DCKPT_ASSIGN_OR_RETURN(RestoreSummary s, m->Restore(st.state, RestoreOptions()));
    DCKPT_RETURN_IF_ERROR(
        Expect(s.found && s.step == step, "restored step " + std::to_string(s.step) + ":\n" + m->restore_report()));
    DCKPT_RETURN_IF_ERROR(st.Check(rank, n, step).WithContext(m->restore_report()));
    return check(s, m->restore_report(), rank);
  };
}

void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(Manager, LosingANodeRestoresFromPeersWithNothingFromPersistentStorage) {
  Job job;
  job.base = testing_util::MakeTempDir("manager-");
  job.persistent = job.base + "/persistent";
  ::mkdir(job.persistent.c_str(), 0755);
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

}  // namespace
}  // namespace distckpt
