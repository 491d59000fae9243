// The checkpoint manager's tests' helpers: a small sharded state with known values per step, and jobs of forked ranks
// (Gloo over loopback) with a manager each, several nodes simulated by local directories and node ids.
#ifndef DISTCKPT_CORE_MANAGER_MANAGER_TEST_UTIL_H_
#define DISTCKPT_CORE_MANAGER_MANAGER_TEST_UTIL_H_

#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/comm/comm_conformance.h"
#include "core/comm/gloo/gloo.h"
#include "core/comm/gloo/gloo_test_util.h"
#include "core/manager/manager.h"
#include "core/storage/fault/fault_storage.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace manager_testing {

using comm_testing::RunRanks;

constexpr uint64_t kRows = 12, kCols = 8;

inline float Value(uint64_t step, uint64_t row, uint64_t col) {
  return static_cast<float>(step * 1000 + row * 10 + col);
}

constexpr uint64_t kFrozenCols = 512;
// "frozen": the same values at every step, few distinct ones (they compress).
inline float FrozenValue(uint64_t row, uint64_t col) { return static_cast<float>((row * 7 + col) % 16) * 0.125f; }

// Rank r of n holds rows [r*kRows/n, (r+1)*kRows/n) of "w", a replicated "b" of 4 values, and a bytes entry; with
// `with_frozen`, the same rows of "frozen" (kRows x kFrozenCols, unchanged from step to step) too.
struct RankState {
  std::vector<float> w, b, frozen;
  std::string note;
  State state;
  RankState(int rank, int n, uint64_t step, bool fill, bool with_frozen = false) {
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
    if (with_frozen) {
      frozen.resize((hi - lo) * kFrozenCols);
      for (uint64_t r = lo; r < hi && fill; ++r) {
        for (uint64_t c = 0; c < kFrozenCols; ++c) frozen[(r - lo) * kFrozenCols + c] = FrozenValue(r, c);
      }
      (void)state.AddTensor("frozen", DType::kF32, {kRows, kFrozenCols});
      (void)state.AddPiece("frozen", {lo, 0}, {hi - lo, kFrozenCols}, frozen.data());
    }
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
    for (size_t i = 0; i < frozen.size(); ++i) {
      if (frozen[i] != FrozenValue(lo + i / kFrozenCols, i % kFrozenCols)) {
        return Internal("frozen[" + std::to_string(lo + i / kFrozenCols) + "," + std::to_string(i % kFrozenCols) +
                        "] wrong");
      }
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
  // Fault rules (fault_storage.h) for a rank's local and persistent storage; "" for none.
  std::function<std::string(int rank)> local_faults = [](int) { return std::string(); };
  std::function<std::string(int rank)> persistent_faults = [](int) { return std::string(); };
  std::function<void(ManagerOptions*)> configure = [](ManagerOptions*) {};  // anything else
};

// Runs `body` on n forked ranks with a Gloo group and a manager each; every rank must succeed, but `killed`, which
// must die by SIGKILL (a fault rule); -2: any outcome (the body checks what it can).
inline void RunJob(const Job& job, int n, const std::function<Status(CheckpointManager*, int rank)>& body,
                   int killed = -1) {
  const std::string rendezvous = "file://" + testing_util::MakeTempDir("manager-rdv-");
  const std::string end_rendezvous = "file://" + testing_util::MakeTempDir("manager-end-rdv-");
  auto outcomes = RunRanks(n, std::chrono::seconds(120), [&](int rank) {
    auto comm = NewGlooCommunicator(gloo_testing::Loopback(rank, n, rendezvous, std::chrono::seconds(30)));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    // The test's own group: no rank exits (closing its connections) while another still reads the manager's last
    // collective from it.
    auto end = NewGlooCommunicator(gloo_testing::Loopback(rank, n, end_rendezvous, std::chrono::seconds(30)));
    if (!end.ok()) return comm_testing::ReportInChild(rank, end.status());
    ManagerOptions o;
    o.node_id = job.node(rank, n);
    o.local_dir = job.base + "/node-" + o.node_id;
    o.replicas = job.replicas;
    o.persistent_path = job.persistent;
    o.persist_every = job.persist_every;
    o.timeout = std::chrono::seconds(30);
    o.exchange_round_bytes = 100;  // many rounds even for a small state
    std::unique_ptr<Storage> local_faults, persistent_base;
    if (!job.local_faults(rank).empty()) {
      local_faults = std::make_unique<FaultStorage>(DefaultStorage(), ParseFaultRules(job.local_faults(rank)).value());
      o.local_storage = local_faults.get();
    }
    if (!job.persistent_faults(rank).empty()) {
      o.persistent_storage =
          std::make_shared<FaultStorage>(DefaultStorage(), ParseFaultRules(job.persistent_faults(rank)).value());
    }
    job.configure(&o);
    auto m = CheckpointManager::Create(comm.value().get(), o);
    if (!m.ok()) return comm_testing::ReportInChild(rank, m.status());
    const Status outcome = body(m.value().get(), rank);
    m.value().reset();                                     // its background work is over
    (void)end.value()->Barrier(std::chrono::seconds(30));  // fails at once where a rank died (a fault rule)
    return comm_testing::ReportInChild(rank, outcome);
  });
  for (const auto& o : outcomes) {
    if (killed == -2) continue;  // any rank may die (a sweep)
    if (o.rank == killed) {
      ASSERT_EQ(o.signal, SIGKILL) << comm_testing::Describe(outcomes);
    } else {
      ASSERT_EQ(o.exit_code, 0) << comm_testing::Describe(outcomes);
    }
  }
}

// A manager of one process on node "a", its local tier in `base`/node-a, no replicas.
inline ManagerOptions OneNode(const std::string& base) {
  ManagerOptions o;
  o.node_id = "a";
  o.local_dir = base + "/node-a";
  o.replicas = 0;
  return o;
}

inline Status SaveSteps(CheckpointManager* m, int rank, int n, uint64_t first, uint64_t last) {
  for (uint64_t s = first; s <= last; ++s) {
    RankState st(rank, n, s, true);
    DCKPT_RETURN_IF_ERROR(m->Save(s, st.state, false));
  }
  return m->Wait(std::chrono::seconds(60));
}

inline Status Expect(bool ok, const std::string& what) { return ok ? OkStatus() : Internal(what); }

// Restores on n ranks and checks the values of `step`; `check` looks at the summary.
inline std::function<Status(CheckpointManager*, int)> RestoreAndCheck(
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

inline void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace manager_testing
}  // namespace distckpt

#endif  // DISTCKPT_CORE_MANAGER_MANAGER_TEST_UTIL_H_
