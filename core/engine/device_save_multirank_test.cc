// Device pieces saved by several ranks (forked processes over Gloo on loopback), with the host copy engine standing
// in for CUDA: replicated device boxes are written once, and a copy failing on one rank fails the save on every rank
// with that rank's message, leaving nothing at the path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <numeric>
#include <thread>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/comm/comm_conformance.h"
#include "core/comm/gloo/gloo.h"
#include "core/comm/gloo/gloo_test_util.h"
#include "core/cuda/host_copy_engine.h"
#include "core/engine/load.h"
#include "core/engine/save.h"
#include "core/engine/save_async.h"

namespace distckpt {
namespace {

constexpr int kRanks = 3;
constexpr uint64_t kPerRank = 5000;  // f32 elements of "w" per rank: several 16 KiB staging buffers each

std::vector<float> Values(uint64_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Small staging buffers (several per rank) through the host engine, no fsync.
SaveOptions TestOptions(CopyEngine* engine, std::chrono::seconds timeout) {
  SaveOptions o;
  o.copy_engine = engine;
  o.checksum_block_size = 4096;
  o.staging_buffer_bytes = 16384;
  o.staging_buffers = 2;
  o.sync = false;
  o.timeout = timeout;
  return o;
}

// Each rank saves its slice of "w" and a replica of "r", both as device pieces; `fail_rank` fails its second copy
// (it has at least two: its 20 KB of "w" spans two 16 KiB buffers).
Status SaveOnRank(int rank, const std::string& rendezvous, const std::string& path, int fail_rank) {
  DCKPT_ASSIGN_OR_RETURN(auto comm, NewGlooCommunicator(gloo_testing::Loopback(rank, kRanks, rendezvous)));
  HostCopyEngine engine;
  if (rank == fail_rank) {
    engine.set_before_copy([](uint64_t i) {
      return i == 1 ? Status(StatusCode::kUnknown, "injected: unspecified launch failure") : OkStatus();
    });
  }
  std::vector<float> w = Values(kPerRank, float(rank * kPerRank)), r = Values(3000, 0.5f);
  const MemoryLocation dev{MemoryKind::kCuda, rank, reinterpret_cast<void*>(uintptr_t(0x100 + rank))};
  State s;
  DCKPT_RETURN_IF_ERROR(s.AddTensor("w", DType::kF32, {kRanks * kPerRank}));
  DCKPT_RETURN_IF_ERROR(s.AddPieceIn("w", {rank * kPerRank}, {kPerRank}, w.data(), dev));
  DCKPT_RETURN_IF_ERROR(s.AddTensor("r", DType::kF32, {3000}));
  DCKPT_RETURN_IF_ERROR(s.AddPieceIn("r", {0}, {3000}, r.data(), dev));
  auto saved = Save(path, s, comm.get(), TestOptions(&engine, std::chrono::seconds(30)));
  if (fail_rank < 0) return saved.status();
  // Expected to fail on every rank, naming the failing rank's copy; nothing may appear at the path.
  if (saved.ok()) return Internal("the save succeeded although rank " + std::to_string(fail_rank) + "'s copy failed");
  const std::string& m = saved.status().message();
  std::fprintf(stderr, "[rank %d] the save failed as expected: %s\n", rank, m.c_str());
  for (const char* want : {"unspecified launch failure", "tensor '", " to host failed"}) {
    if (m.find(want) == std::string::npos) return Internal("message lacks '" + std::string(want) + "': " + m);
  }
  if (::access(path.c_str(), F_OK) == 0) return Internal("'" + path + "' exists after a failed save");
  return OkStatus();
}

Status CheckOnRank0(const std::string& path) {
  std::vector<float> w(kRanks * kPerRank), r(3000);
  State s;
  DCKPT_RETURN_IF_ERROR(s.AddTensor("w", DType::kF32, {kRanks * kPerRank}));
  DCKPT_RETURN_IF_ERROR(s.AddPiece("w", {0}, {kRanks * kPerRank}, w.data()));
  DCKPT_RETURN_IF_ERROR(s.AddTensor("r", DType::kF32, {3000}));
  DCKPT_RETURN_IF_ERROR(s.AddPiece("r", {0}, {3000}, r.data()));
  DCKPT_RETURN_IF_ERROR(Load(path, s, nullptr, ReadOptions{}).status());
  if (w != Values(kRanks * kPerRank, 0) || r != Values(3000, 0.5f)) return Internal("loaded values differ");
  return OkStatus();
}

TEST(DeviceSaveMultiRankTest, EveryRankStagesItsDevicePiecesAndReplicasAreWrittenOnce) {
  const std::string dir = testing_util::MakeTempDir("device-save-");
  const std::string path = dir + "/ckpt";
  auto outcomes = comm_testing::RunRanks(kRanks, std::chrono::seconds(60), [&](int rank) {
    Status st = SaveOnRank(rank, "file://" + dir + "/rdv", path, /*fail_rank=*/-1);
    if (st.ok() && rank == 0) st = CheckOnRank0(path);
    return comm_testing::ReportInChild(rank, st);
  });
  EXPECT_TRUE(comm_testing::AllExitedZero(outcomes)) << comm_testing::Describe(outcomes);
}

TEST(DeviceSaveMultiRankTest, ACopyFailingOnOneRankFailsEveryRankAndLeavesNothing) {
  const std::string dir = testing_util::MakeTempDir("device-save-fail-");
  const std::string path = dir + "/ckpt";
  auto outcomes = comm_testing::RunRanks(kRanks, std::chrono::seconds(60), [&](int rank) {
    return comm_testing::ReportInChild(rank, SaveOnRank(rank, "file://" + dir + "/rdv", path, /*fail_rank=*/1));
  });
  EXPECT_TRUE(comm_testing::AllExitedZero(outcomes)) << comm_testing::Describe(outcomes);
}

// An asynchronous save whose staging fails on rank 1 (its device copy): rank 1's SaveAsync returns the error,
// and the other ranks, whose saves already run in the background, fail at once naming rank 1 and the copy instead of
// waiting out the collective timeout for a rank that never joins. Nothing appears at the path.
Status AsyncSaveOnRank(int rank, const std::string& rendezvous, const std::string& path) {
  DCKPT_ASSIGN_OR_RETURN(auto comm, NewGlooCommunicator(gloo_testing::Loopback(rank, kRanks, rendezvous)));
  HostCopyEngine engine;
  if (rank == 1) {
    engine.set_before_copy([](uint64_t i) {
      return i == 0 ? Status(StatusCode::kUnknown, "injected: unspecified launch failure") : OkStatus();
    });
  }
  std::vector<float> w = Values(kPerRank, float(rank * kPerRank));
  const MemoryLocation dev{MemoryKind::kCuda, rank, reinterpret_cast<void*>(uintptr_t(0x100 + rank))};
  State s;
  DCKPT_RETURN_IF_ERROR(s.AddTensor("w", DType::kF32, {kRanks * kPerRank}));
  DCKPT_RETURN_IF_ERROR(s.AddPieceIn("w", {rank * kPerRank}, {kPerRank}, w.data(), dev));
  // The others must fail long before the timeout, and before rank 1 exits.
  const SaveOptions o = TestOptions(&engine, std::chrono::seconds(40));
  const auto start = std::chrono::steady_clock::now();
  auto future = SaveAsync(path, s, comm.get(), o);
  Status outcome;
  if (rank == 1) {
    if (future.ok()) return Internal("rank 1's SaveAsync succeeded although its staging failed");
    outcome = future.status();
    // A training job goes on after a failed save: rank 1 stays alive, its communicator open, while the others must
    // already have failed (they cannot learn it from a closed connection).
    std::this_thread::sleep_for(std::chrono::seconds(4));
  } else {
    if (!future.ok()) return future.status().WithContext("SaveAsync on a rank whose staging works");
    auto result = (*future)->Wait(std::chrono::seconds(60));
    if (result.ok()) return Internal("the save succeeded although rank 1's staging failed");
    outcome = result.status();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "[rank %d] failed after %.2f s as expected: %s\n", rank, seconds, outcome.message().c_str());
  if (rank != 1 && seconds > 2.5) {
    return Internal("rank " + std::to_string(rank) + " took " + std::to_string(seconds) + " s to fail");
  }
  for (const char* want : {"unspecified launch failure", rank == 1 ? "staging the state" : "rank 1 failed"}) {
    if (outcome.message().find(want) == std::string::npos) {
      return Internal("message lacks '" + std::string(want) + "': " + outcome.message());
    }
  }
  if (::access(path.c_str(), F_OK) == 0) return Internal("'" + path + "' exists after a failed save");
  return OkStatus();
}

TEST(DeviceSaveMultiRankTest, AsyncStagingFailingOnOneRankFailsTheOthersAtOnce) {
  const std::string dir = testing_util::MakeTempDir("device-async-fail-");
  const std::string path = dir + "/ckpt";
  auto outcomes = comm_testing::RunRanks(kRanks, std::chrono::seconds(90), [&](int rank) {
    return comm_testing::ReportInChild(rank, AsyncSaveOnRank(rank, "file://" + dir + "/rdv", path));
  });
  EXPECT_TRUE(comm_testing::AllExitedZero(outcomes)) << comm_testing::Describe(outcomes);
}

}  // namespace
}  // namespace distckpt
