// Fan-out load over real processes (Gloo on loopback, fanout_worker.cc): replicated bytes are read from storage once
// across the ranks and exchanged, every value still exact; a corrupt replicated chunk fails every rank naming the
// entry and the file; a rank killed mid-exchange makes the others fail promptly, naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>
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

std::vector<RankResult> RunRanks(int world, const std::vector<std::string>& args,
                                 std::chrono::milliseconds timeout = std::chrono::milliseconds(120000)) {
  LaunchSpec spec;
  spec.program = launcher::Runfile("tests/multiprocess/fanout_worker");
  spec.world_size = world;
  spec.args = args;
  spec.log_dir = MakeTempDir("fanout-logs-");
  spec.timeout = timeout;
  return Launch(spec);
}

void ExpectAllOk(const std::vector<RankResult>& results, const std::string& what) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << what << ": rank " << r << " (signal " << results[r].signal << "):\n"
                                       << results[r].log;
  }
}

// The FANOUT_STATS counters of one rank's log.
std::map<std::string, double> Stats(const std::string& log) {
  std::map<std::string, double> out;
  const size_t at = log.find("FANOUT_STATS");
  if (at == std::string::npos) return out;
  std::istringstream line(log.substr(at, log.find('\n', at) - at));
  std::string kv;
  while (line >> kv) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) out[kv.substr(0, eq)] = std::atof(kv.c_str() + eq + 1);
  }
  return out;
}

double Sum(const std::vector<RankResult>& results, const std::string& key) {
  double s = 0;
  for (const RankResult& r : results) s += Stats(r.log)[key];
  return s;
}

class FanoutLoadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(MakeTempDir("fanout-") + "/ckpt");
    ExpectAllOk(RunRanks(4, {"--mode", "save", "--path", *path_, "--mib", "8"}), "save");
  }
  static void TearDownTestSuite() { delete path_; }
  static std::string* path_;
};
std::string* FanoutLoadTest::path_ = nullptr;

TEST_F(FanoutLoadTest, StorageBytesDropByTheReplicaFactor) {
  auto on = RunRanks(4, {"--mode", "load", "--path", *path_, "--mib", "8", "--fanout", "1"});
  auto off = RunRanks(4, {"--mode", "load", "--path", *path_, "--mib", "8", "--fanout", "0"});
  ExpectAllOk(on, "fanout on");
  ExpectAllOk(off, "fanout off");
  const double read_on = Sum(on, "bytes_read"), read_off = Sum(off, "bytes_read");
  ASSERT_GT(read_on, 0);
  // ~8 MiB replicated on 4 ranks, 1 MiB sharded, 0.5 MiB that every rank needs a slice of every block of: ~3.7x.
  EXPECT_GT(read_off / read_on, 3.3) << "off " << read_off << " on " << read_on;
  EXPECT_EQ(Sum(off, "received"), 0);
  EXPECT_EQ(Sum(off, "sent"), 0);
  EXPECT_GT(Sum(on, "received"), 3 * Sum(on, "sent") * 0.9) << "each byte sent goes to the three other ranks";
  // The same bytes reach every rank's buffers either way.
  EXPECT_EQ(Sum(on, "delivered"), Sum(off, "delivered"));
  // Balanced: no rank reads much more than its share.
  for (size_t r = 0; r < on.size(); ++r) EXPECT_LT(Stats(on[r].log)["bytes_read"], read_on / 4 * 1.25) << r;
  // Every byte a rank read was verified by it (verification is on): nothing reached a buffer unhashed.
  for (size_t r = 0; r < on.size(); ++r) {
    auto s = Stats(on[r].log);
    EXPECT_GE(s["verified"], s["bytes_read"]) << r;
  }
}

TEST_F(FanoutLoadTest, AutoDoesNotFanOutThroughOnePageCache) {
  // Every rank here reads the same inodes through one page cache: kAuto reads as a plain load (and keeps shared
  // verification), since the exchange would only add copies.
  auto autos = RunRanks(4, {"--mode", "load", "--path", *path_, "--mib", "8", "--fanout", "2"});
  ExpectAllOk(autos, "fanout auto");
  EXPECT_EQ(Sum(autos, "received"), 0);
  EXPECT_EQ(Sum(autos, "sent"), 0);
  EXPECT_LT(Sum(autos, "verified"), Sum(autos, "bytes_read")) << "shared verification still splits the hashing";
}

TEST_F(FanoutLoadTest, ARankWithTheFanoutOffReadsItselfAndStillJoinsTheRounds) {
  const int off = 1;
  auto results = RunRanks(4, {"--mode", "load", "--path", *path_, "--mib", "8", "--round-kib", "512",
                              "--fanout-off-rank", std::to_string(off)});
  ExpectAllOk(results, "rank 1 off");
  for (int r = 0; r < 4; ++r) {
    auto s = Stats(results[r].log);
    if (r == off) {
      EXPECT_EQ(s["received"], 0);
      EXPECT_EQ(s["sent"], 0);
      EXPECT_GE(s["bytes_read"], s["delivered"]) << "it reads everything it needs itself";
    } else {
      EXPECT_GT(s["received"], 0) << r;
      EXPECT_GT(s["sent"], 0) << r;
    }
  }
}

TEST_F(FanoutLoadTest, SmallRoundsAndNoVerification) {
  // 256 KiB per rank and round: dozens of rounds; and the same without checksums (cuts need not fall on blocks).
  ExpectAllOk(RunRanks(4, {"--mode", "load", "--path", *path_, "--mib", "8", "--round-kib", "256"}), "small rounds");
  ExpectAllOk(RunRanks(4, {"--mode", "load", "--path", *path_, "--mib", "8", "--verify", "0", "--map", "1"}),
              "no verification, mapped");
  // Fewer ranks than saved them, and a rank alone: the fan-out follows the loading group.
  ExpectAllOk(RunRanks(3, {"--mode", "load", "--path", *path_, "--mib", "8"}), "3 ranks");
  ExpectAllOk(RunRanks(1, {"--mode", "load", "--path", *path_, "--mib", "8"}), "1 rank");
}

// Device destinations (the host copy engine standing in for CUDA): what a rank reads goes through its pinned
// staging buffers, what it receives from peers is copied from the exchange buffer; every value is still exact.
TEST_F(FanoutLoadTest, IntoDeviceMemory) {
  auto on = RunRanks(4, {"--mode", "load", "--path", *path_, "--mib", "8", "--device", "1", "--round-kib", "1024"});
  ExpectAllOk(on, "fanout into device memory");
  for (size_t r = 0; r < on.size(); ++r) {
    auto s = Stats(on[r].log);
    EXPECT_GT(s["received"], 0) << r;
    EXPECT_GT(s["device_copies"], 0) << r;
  }
}

TEST(FanoutFailureTest, CorruptReplicatedChunkFailsEveryRank) {
  const std::string path = MakeTempDir("fanout-corrupt-") + "/ckpt";
  ExpectAllOk(RunRanks(4, {"--mode", "save", "--path", path, "--mib", "2"}), "save");
  ExpectAllOk(RunRanks(1, {"--mode", "corrupt", "--path", path, "--entry", "layer1.w"}), "corrupt");
  const auto results = RunRanks(4, {"--mode", "load", "--path", path, "--mib", "2"});
  ASSERT_EQ(results.size(), 4u);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 3) << "rank " << r << ":\n" << results[r].log;
    EXPECT_EQ(results[r].log.find("FANOUT_STATS"), std::string::npos) << "rank " << r << " returned data";
    EXPECT_NE(results[r].log.find("checksum mismatch"), std::string::npos) << results[r].log;
    EXPECT_NE(results[r].log.find("'layer1.w'"), std::string::npos) << results[r].log;
    EXPECT_NE(results[r].log.find("data-"), std::string::npos) << results[r].log;
    EXPECT_NE(results[r].log.find(path), std::string::npos) << results[r].log;
  }
}

TEST(FanoutFailureTest, RankKilledMidExchangeFailsTheOthersNamingIt) {
  const std::string path = MakeTempDir("fanout-kill-") + "/ckpt";
  ExpectAllOk(RunRanks(4, {"--mode", "save", "--path", path, "--mib", "16"}), "save");
  const int victim = 2;
  // Small rounds, so that the kill lands between two exchange rounds.
  const auto results = RunRanks(4,
                                {"--mode", "load", "--path", path, "--mib", "16", "--round-kib", "512", "--timeout-ms",
                                 "5000", "--die-rank", std::to_string(victim), "--die-at", "50"},
                                std::chrono::milliseconds(30000));
  for (int r = 0; r < 4; ++r) {
    if (r == victim) {
      EXPECT_NE(results[r].exit_code, 0);
      continue;
    }
    EXPECT_EQ(results[r].exit_code, 3) << "rank " << r << ":\n" << results[r].log;
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung";
    EXPECT_LT(results[r].seconds, 20.0) << "rank " << r;
    EXPECT_EQ(results[r].log.find("FANOUT_STATS"), std::string::npos) << "rank " << r << " returned data";
    EXPECT_NE(results[r].log.find("rank " + std::to_string(victim)), std::string::npos) << results[r].log;
    EXPECT_NE(results[r].log.find(path), std::string::npos) << results[r].log;
  }
}

}  // namespace
}  // namespace distckpt
