#include "core/comm/external/external.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/comm/comm_conformance.h"
#include "core/comm/gloo/gloo.h"
#include "core/comm/gloo/gloo_test_util.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace {

using Millis = std::chrono::milliseconds;
using comm_testing::AllExitedZero;
using comm_testing::Describe;
using comm_testing::RunRanks;

// ---------------------------------------------------------------------------------------------------------------
// A host "process group": the callbacks forward to a Gloo communicator of the same process, as a host framework's
// own collectives would. A failure returns the negated status code, like a C host returning its own error number.

struct Host {
  Communicator* group = nullptr;
  uint64_t last_timeout_ms = 0;
};

int HostAllGather(const void* send, size_t n, void* recv, uint64_t timeout_ms, void* user_data) {
  Host* host = static_cast<Host*>(user_data);
  host->last_timeout_ms = timeout_ms;
  std::vector<std::string> all;
  Status st = host->group->AllGather(std::string(static_cast<const char*>(send), n), &all, Millis(timeout_ms));
  if (!st.ok()) return static_cast<int>(st.code());
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != n) return -100;  // The contract: the same size on every rank.
    if (n > 0) std::memcpy(static_cast<char*>(recv) + r * n, all[r].data(), n);
  }
  return 0;
}

int HostBroadcast(void* buf, size_t n, int root, uint64_t timeout_ms, void* user_data) {
  Host* host = static_cast<Host*>(user_data);
  host->last_timeout_ms = timeout_ms;
  std::string data(static_cast<const char*>(buf), n);
  Status st = host->group->Broadcast(&data, root, Millis(timeout_ms));
  if (!st.ok()) return static_cast<int>(st.code());
  if (data.size() != n) return -100;
  if (n > 0) std::memcpy(buf, data.data(), n);
  return 0;
}

int HostBarrier(uint64_t timeout_ms, void* user_data) {
  Host* host = static_cast<Host*>(user_data);
  host->last_timeout_ms = timeout_ms;
  return static_cast<int>(host->group->Barrier(Millis(timeout_ms)).code());
}

ExternalCallbacks HostCallbacks(Host* host, bool with_barrier) {
  ExternalCallbacks cb;
  cb.rank = host->group->rank();
  cb.size = host->group->size();
  cb.allgather = HostAllGather;
  cb.broadcast = HostBroadcast;
  cb.barrier = with_barrier ? HostBarrier : nullptr;
  cb.user_data = host;
  return cb;
}

// Runs `body` on `n` ranks, each with an external communicator over its own Gloo group.
std::vector<comm_testing::RankOutcome> RunExternal(int n, bool with_barrier,
                                                   const std::function<Status(Communicator*, Host*)>& body) {
  const std::string store = "file://" + testing_util::MakeTempDir("external-");
  return RunRanks(n, std::chrono::seconds(60), [&](int rank) {
    auto group = NewGlooCommunicator(gloo_testing::Loopback(rank, n, store));
    if (!group.ok()) return comm_testing::ReportInChild(rank, group.status());
    Host host;
    host.group = group->get();
    auto comm = NewExternalCommunicator(HostCallbacks(&host, with_barrier));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    return comm_testing::ReportInChild(rank, body(comm->get(), &host));
  });
}

class ExternalConformance : public ::testing::TestWithParam<int> {};

TEST_P(ExternalConformance, PassesOverAHostGroup) {
  auto outcomes = RunExternal(GetParam(), /*with_barrier=*/true,
                              [](Communicator* comm, Host*) { return comm_testing::RunConformance(comm); });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ExternalConformance, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "n" + std::to_string(info.param); });

TEST(External, PassesConformanceWithoutABarrierCallback) {
  auto outcomes = RunExternal(3, /*with_barrier=*/false, [](Communicator* comm, Host*) {
    comm_testing::ConformanceOptions o;
    o.repetitions = 20;
    return comm_testing::RunConformance(comm, o);
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(External, DetectsRanksInDifferentCollectives) {
  auto outcomes = RunExternal(2, true, [](Communicator* comm, Host*) -> Status {
    std::vector<std::string> all;
    // Both layer on the allgather callback, so the host sees matching calls; distckpt's header tells them apart.
    Status st = comm->rank() == 0 ? comm->AllGather("a", &all, Millis(5000)) : comm->Gather("b", 0, &all, Millis(5000));
    if (st.code() != StatusCode::kInvalidArgument || st.message().find("collective mismatch") == std::string::npos) {
      return Internal("want a collective mismatch, got " + st.ToString());
    }
    Status later = comm->Barrier(Millis(5000));
    if (later.code() != StatusCode::kState) return Internal("want kState after the mismatch, got " + later.ToString());
    return OkStatus();
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(External, PassesWhatIsLeftOfTheTimeout) {
  auto outcomes = RunExternal(2, true, [](Communicator* comm, Host* host) -> Status {
    std::vector<std::string> all;
    DCKPT_RETURN_IF_ERROR(comm->AllGather("x", &all, Millis(7000)));
    if (host->last_timeout_ms < 1 || host->last_timeout_ms > 7000) {
      return Internal("callback got timeout_ms " + std::to_string(host->last_timeout_ms));
    }
    // A zero timeout is still at least 1 ms to the host, where 0 often means "wait forever".
    std::string data = "y";
    comm->Broadcast(&data, 0, Millis(0)).ok();
    if (host->last_timeout_ms != 1) return Internal("callback got timeout_ms " + std::to_string(host->last_timeout_ms));
    return OkStatus();
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// ---------------------------------------------------------------------------------------------------------------
// Single-rank hosts: validation and callback errors.

int CopyAllGather(const void* send, size_t n, void* recv, uint64_t, void*) {
  if (n > 0) std::memcpy(recv, send, n);
  return 0;
}
int NoopBroadcast(void*, size_t, int, uint64_t, void*) { return 0; }
int FailingAllGather(const void*, size_t, void*, uint64_t, void*) { return 3; }
int ThrowingBroadcast(void*, size_t, int, uint64_t, void*) { throw std::runtime_error("host bug"); }

ExternalCallbacks SingleRank() {
  ExternalCallbacks cb;
  cb.allgather = CopyAllGather;
  cb.broadcast = NoopBroadcast;
  return cb;
}

TEST(External, ValidatesTheCallbacks) {
  struct Case {
    ExternalCallbacks cb;
    const char* says;
  };
  auto with = [](auto edit, const char* says) {
    ExternalCallbacks cb = SingleRank();
    edit(cb);
    return Case{cb, says};
  };
  const std::vector<Case> cases = {
      with([](ExternalCallbacks& cb) { cb.size = 0; }, "size 0 is not positive"),
      with([](ExternalCallbacks& cb) { cb.rank = 1; }, "rank 1 is not in [0, 1)"),
      with([](ExternalCallbacks& cb) { cb.rank = -1; }, "rank -1 is not in [0, 1)"),
      with([](ExternalCallbacks& cb) { cb.allgather = nullptr; }, "the allgather callback is required"),
      with([](ExternalCallbacks& cb) { cb.broadcast = nullptr; }, "the broadcast callback is required"),
  };
  for (const Case& c : cases) {
    auto comm = NewExternalCommunicator(c.cb);
    ASSERT_FALSE(comm.ok()) << c.says;
    EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(comm.status().message().find(c.says), std::string::npos) << comm.status().ToString();
  }
  EXPECT_TRUE(NewExternalCommunicator(SingleRank()).ok());
}

TEST(External, SingleRankPassesConformance) {
  auto comm = NewExternalCommunicator(SingleRank());
  ASSERT_TRUE(comm.ok());
  Status st = comm_testing::RunConformance(comm->get());
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(External, ANonZeroCallbackReturnAbortsWithKUserAndBreaksTheGroup) {
  ExternalCallbacks cb = SingleRank();
  cb.allgather = FailingAllGather;
  auto comm = NewExternalCommunicator(cb);
  ASSERT_TRUE(comm.ok());
  std::vector<std::string> all;
  Status st = (*comm)->AllGather("x", &all, Millis(1000));
  EXPECT_EQ(st.code(), StatusCode::kUser);
  EXPECT_NE(st.message().find("external allgather callback returned 3"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("rank 0 of 1"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("timeout 1000 ms"), std::string::npos) << st.ToString();
  Status later = (*comm)->Barrier(Millis(1000));
  EXPECT_EQ(later.code(), StatusCode::kState);
  EXPECT_NE(later.message().find("returned 3"), std::string::npos) << later.ToString();
}

TEST(External, AThrowingCallbackIsContained) {
  ExternalCallbacks cb = SingleRank();
  cb.broadcast = ThrowingBroadcast;
  auto comm = NewExternalCommunicator(cb);
  ASSERT_TRUE(comm.ok());
  std::string data = "x";
  Status st = (*comm)->Broadcast(&data, 0, Millis(1000));
  EXPECT_EQ(st.code(), StatusCode::kUser);
  EXPECT_NE(st.message().find("external broadcast callback threw"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace distckpt
