// Real processes over loopback: N ranks save, M ranks load with a different sharding, values checked by every rank
// (reshard_worker.cc). Also: a rank killed or stalled mid-save / mid-load makes every other rank fail, within the
// timeout, with an error naming the missing rank.
#include <signal.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "tools/launcher/launcher.h"

namespace distckpt {
namespace {

using launcher::Launch;
using launcher::LaunchSpec;
using launcher::RankResult;
using testing_util::MakeTempDir;

std::string Worker() { return launcher::Runfile("tests/multiprocess/reshard_worker"); }

std::vector<RankResult> RunRanks(int world, const std::vector<std::string>& args, const std::string& log_dir = "",
                            std::chrono::milliseconds timeout = std::chrono::milliseconds(120000)) {
  LaunchSpec spec;
  spec.program = Worker();
  spec.world_size = world;
  spec.args = args;
  spec.log_dir = log_dir.empty() ? MakeTempDir("logs-") : log_dir;
  spec.timeout = timeout;
  return Launch(spec);
}

void ExpectAllOk(const std::vector<RankResult>& results, const std::string& what) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << what << ": rank " << r << " (signal " << results[r].signal
                                       << ", timed out " << results[r].timed_out << "):\n"
                                       << results[r].log;
  }
}

// N ranks save; then every M in 1..8 loads it with another sharding.
class ReshardMatrixTest : public ::testing::TestWithParam<int> {};

TEST_P(ReshardMatrixTest, SaveOnNLoadOnEveryM) {
  const int n = GetParam();
  const std::string path = MakeTempDir("matrix-") + "/ckpt";
  ExpectAllOk(RunRanks(n, {"--mode", "save", "--path", path}), "save on " + std::to_string(n));
  struct stat st;
  ASSERT_EQ(::stat((path + "/metadata.dckpt").c_str(), &st), 0) << "no committed checkpoint at " << path;
  for (int m = 1; m <= 8; ++m) {
    ExpectAllOk(RunRanks(m, {"--mode", "load", "--path", path}), std::to_string(n) + " -> " + std::to_string(m));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ReshardMatrixTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& i) { return "N" + std::to_string(i.param); });

// A flipped byte in a block that every loading rank needs ('big' is saved by rows and loaded by columns): the ranks on
// this host split the hashing of shared blocks, so only one of them finds the mismatch; every rank must still fail,
// and every rank's error must name the tensor and the data file.
TEST(SharedVerificationTest, CorruptSharedBlockFailsEveryRank) {
  const std::string path = MakeTempDir("shared-verify-") + "/ckpt";
  ExpectAllOk(RunRanks(2, {"--mode", "save", "--path", path}), "save");
  ExpectAllOk(RunRanks(1, {"--mode", "corrupt", "--path", path, "--entry", "big"}), "corrupt");
  const std::vector<RankResult> results = RunRanks(3, {"--mode", "load", "--path", path});
  ASSERT_EQ(results.size(), 3u);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 3) << "rank " << r << ":\n" << results[r].log;
    EXPECT_NE(results[r].log.find("checksum mismatch"), std::string::npos) << results[r].log;
    EXPECT_NE(results[r].log.find("'big'"), std::string::npos) << results[r].log;
    EXPECT_NE(results[r].log.find("data-0000"), std::string::npos) << results[r].log;
  }
}

// The fan-out through the C ABI (dckpt_read_options v5, dckpt_io_stats v3): 4 ranks load what 2 saved with
// DCKPT_FANOUT_ALWAYS, every value checked by the worker; bytes move between the ranks (none with the fan-out off). (The engine's own fan-out tests are in fanout_test.cc.)
uint64_t StatFromLog(const std::string& log, const std::string& what) {
  size_t at = log.find(" " + what);
  if (at == std::string::npos) return UINT64_MAX;
  size_t start = log.rfind(' ', at - 1) + 1;
  return std::strtoull(log.c_str() + start, nullptr, 10);
}

TEST(FanoutThroughCApiTest, ReplicasExchangeBytesAndLoadExactly) {
  const std::string path = MakeTempDir("fanout-capi-") + "/ckpt";
  ExpectAllOk(RunRanks(2, {"--mode", "save", "--path", path}), "save");
  uint64_t received = 0, sent = 0;
  for (const char* mode : {"always", "off"}) {
    const std::vector<RankResult> results = RunRanks(4, {"--mode", "load", "--path", path, "--fanout", mode});
    ExpectAllOk(results, std::string("load with --fanout ") + mode);
    uint64_t r_sum = 0, s_sum = 0;
    for (const RankResult& r : results) {
      const uint64_t got = StatFromLog(r.log, "received from peers"), gave = StatFromLog(r.log, "sent to peers");
      ASSERT_NE(got, UINT64_MAX) << r.log;
      ASSERT_NE(gave, UINT64_MAX) << r.log;
      r_sum += got;
      s_sum += gave;
    }
    if (std::string(mode) == "always") {
      received = r_sum;
      sent = s_sum;
    } else {
      EXPECT_EQ(r_sum, 0u) << "no exchange with the fan-out off";
      EXPECT_EQ(s_sum, 0u);
    }
  }
  EXPECT_GT(sent, 0u) << "4 ranks loading a checkpoint with replicated parts exchanged nothing";
  // A byte read for others counts once as sent, and as received by each rank that needs it.
  EXPECT_GE(received, sent);
}

// A rank that dies (SIGKILL) or stalls (SIGSTOP) halfway through its part of the operation.
struct FailureCase {
  const char* name;
  const char* mode;
  const char* how;  // "die" or "stall"
};

class RankFailureTest : public ::testing::TestWithParam<FailureCase> {};

TEST_P(RankFailureTest, OthersFailFastNamingTheMissingRank) {
  const FailureCase& c = GetParam();
  const int world = 4, victim = 1;
  const std::string dir = MakeTempDir("failure-");
  const std::string path = dir + "/ckpt";
  if (std::string(c.mode) == "load") {
    ExpectAllOk(RunRanks(world, {"--mode", "save", "--path", path}), "setup save");
  }
  std::vector<std::string> args{"--mode", c.mode, "--path", path, "--timeout-ms", "5000",
                                std::string("--") + c.how + "-rank", std::to_string(victim),
                                std::string("--") + c.how + "-at", "50"};
  // The stalled rank never exits by itself: the launcher kills it at its timeout (14 s), well after the others.
  auto results = RunRanks(world, args, "", std::chrono::milliseconds(14000));
  for (int r = 0; r < world; ++r) {
    if (r == victim) {
      EXPECT_NE(results[r].exit_code, 0);
      continue;
    }
    EXPECT_EQ(results[r].exit_code, 3) << "rank " << r << ":\n" << results[r].log;
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung";
    EXPECT_LT(results[r].seconds, 12.0) << "rank " << r << " took too long to notice";
    EXPECT_NE(results[r].log.find("rank " + std::to_string(victim)), std::string::npos)
        << "rank " << r << " does not name the missing rank:\n" << results[r].log;
  }
  if (std::string(c.mode) == "save") {
    struct stat st;
    EXPECT_NE(::stat(path.c_str(), &st), 0) << "a failed save left something at " << path;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, RankFailureTest,
                         ::testing::Values(FailureCase{"KilledMidSave", "save", "die"},
                                           FailureCase{"KilledMidLoad", "load", "die"},
                                           FailureCase{"StalledMidSave", "save", "stall"},
                                           FailureCase{"StalledMidLoad", "load", "stall"}),
                         [](const ::testing::TestParamInfo<FailureCase>& i) { return i.param.name; });

}  // namespace
}  // namespace distckpt
