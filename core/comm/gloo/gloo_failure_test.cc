// Failure behaviour of the Gloo backend with real processes over loopback TCP: ranks that exit, stop (SIGSTOP) or
// sleep before or during collectives must make the others fail within the timeout with an error naming them;
// rendezvous problems must say what is wrong. Every rank is a forked child bounded by alarm(). Built twice
// (BUILD.bazel): over the Gloo code linked in, and through the Gloo plugin (gloo_plugin_failure_test), whose errors
// must be the same.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>

#include "core/base/testing/temp_dir.h"
#include "core/comm/comm_conformance.h"
#include "core/comm/gloo/gloo_test_util.h"
#include "core/comm/gloo/gloo_under_test.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;
using comm_testing::AllExitedZero;
using comm_testing::Describe;
using comm_testing::RunRanks;
using gloo_testing::Loopback;
using gloo_testing::NewGlooForTest;

constexpr Millis kTimeout(2000);
// The brief for a dead or stalled peer: every other rank returns an error naming it within ~2x the timeout.
constexpr Millis kWithin(4000);

// True if `msg` names `rank`: "rank 3" or a list "ranks 0, 3".
bool NamesRank(const std::string& msg, int rank) {
  const std::string r = std::to_string(rank);
  return std::regex_search(msg, std::regex("ranks? ([0-9]+, )*" + r + "\\b"));
}

// In a child: checks a failed call and prints the verdict with the time it took. Returns the exit code.
int ExpectFailure(int rank, const Status& st, std::vector<StatusCode> codes, int culprit, Clock::time_point start,
                  Millis min_took = Millis(0)) {
  const auto took = std::chrono::duration_cast<Millis>(Clock::now() - start);
  bool code_ok = false;
  for (StatusCode c : codes) code_ok |= st.code() == c;
  const bool ok =
      !st.ok() && code_ok && (culprit < 0 || NamesRank(st.message(), culprit)) && took <= kWithin && took >= min_took;
  std::fprintf(stderr, "[rank %d] %s after %lld ms: %s\n", rank, ok ? "failed as expected" : "UNEXPECTED",
               static_cast<long long>(took.count()), st.ToString().c_str());
  return ok ? 0 : 1;
}

std::string FreshStore() { return "file://" + testing_util::MakeTempDir("gloo-fail-"); }

// ---------------------------------------------------------------------------------------------------------------
// Dead and stalled ranks.

TEST(GlooFailure, RankThatExitsBeforeABarrierIsNamedAtOnce) {
  const int n = 4;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30), [&](int rank) {
    auto comm = NewGlooForTest(Loopback(rank, n, store));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    if (rank == 3) _exit(0);  // Dies with its sockets: the kernel closes them.
    const auto start = Clock::now();
    Status st = (*comm)->Barrier(kTimeout);
    return ExpectFailure(rank, st, {StatusCode::kPeer}, 3, start);
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(GlooFailure, RankThatAbortsIsNamedAtOnceAndStaysUsableForNothing) {
  const int n = 3;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30), [&](int rank) {
    auto comm = NewGlooForTest(Loopback(rank, n, store));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    if (rank == 2) {
      // A local failure before the collective: tell the others instead of letting them wait out the timeout.
      (*comm)->Abort("could not build its state");
      Status later = (*comm)->Barrier(kTimeout);
      return later.code() == StatusCode::kState ? 0 : comm_testing::ReportInChild(rank, later);
    }
    const auto start = Clock::now();
    Status st = (*comm)->Barrier(kTimeout);
    return ExpectFailure(rank, st, {StatusCode::kPeer}, 2, start);
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(GlooFailure, StoppedRankTimesOutAnAllGatherNamingIt) {
  const int n = 4;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30),
                           [&](int rank) {
                             auto comm = NewGlooForTest(Loopback(rank, n, store));
                             if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
                             if (rank == 3) raise(SIGSTOP);  // Alive, sockets open, never answers.
                             const auto start = Clock::now();
                             std::vector<std::string> all;
                             Status st = (*comm)->AllGather(std::string(1000, 'x'), &all, kTimeout);
                             return ExpectFailure(rank, st, {StatusCode::kTimeout}, 3, start, kTimeout - Millis(50));
                           },
                           /*may_linger=*/{3});
  for (int r = 0; r < 3; ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << Describe(outcomes);
}

TEST(GlooFailure, SleepingRankTimesOutTheGatherRootAndTheNextBarrierElsewhere) {
  const int n = 4;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30), [&](int rank) {
    auto comm = NewGlooForTest(Loopback(rank, n, store));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    if (rank == 3) {
      std::this_thread::sleep_for(Millis(6000));
      return 0;
    }
    auto start = Clock::now();
    std::vector<std::string> all;
    Status st = (*comm)->Gather("mine", 0, &all, kTimeout);
    if (rank == 0) return ExpectFailure(rank, st, {StatusCode::kTimeout}, 3, start, kTimeout - Millis(50));
    // A non-root's part of a gather is done once the root has its bytes; it learns of the failure in the next call.
    if (!st.ok()) return comm_testing::ReportInChild(rank, st);
    start = Clock::now();
    st = (*comm)->Barrier(kTimeout);
    return ExpectFailure(rank, st, {StatusCode::kTimeout, StatusCode::kPeer}, 3, start);
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(GlooFailure, DeadBroadcastRootIsNamedThroughoutTheTree) {
  const int n = 4;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30), [&](int rank) {
    auto comm = NewGlooForTest(Loopback(rank, n, store));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    if (rank == 3) _exit(0);
    const auto start = Clock::now();
    std::string data;
    // Rank 2's parent in the tree rooted at 3 is rank 1: it learns the cause from rank 1's forwarded error.
    Status st = (*comm)->Broadcast(&data, 3, kTimeout);
    return ExpectFailure(rank, st, {StatusCode::kPeer}, 3, start);
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(GlooFailure, StoppedBroadcastRootIsNamedThroughoutTheTree) {
  const int n = 4;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(
      n, std::chrono::seconds(30),
      [&](int rank) {
        auto comm = NewGlooForTest(Loopback(rank, n, store));
        if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
        if (rank == 3) raise(SIGSTOP);
        const auto start = Clock::now();
        std::string data;
        Status st = (*comm)->Broadcast(&data, 3, kTimeout);
        // The relay (rank 1) gives up a little early and forwards; its child reports that as kPeer.
        return ExpectFailure(rank, st, {StatusCode::kTimeout, StatusCode::kPeer}, 3, start, kTimeout - Millis(600));
      },
      /*may_linger=*/{3});
  for (int r = 0; r < 3; ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << Describe(outcomes);
}

// A rank dies after some collectives, with 256 KiB messages in flight around it.
TEST(GlooFailure, RankThatDiesMidStreamIsNamed) {
  const int n = 3;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30), [&](int rank) {
    auto comm = NewGlooForTest(Loopback(rank, n, store));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    const std::string mine(256 << 10, static_cast<char>('a' + rank));
    for (int i = 0; i < 40; ++i) {
      if (rank == 2 && i == 20) _exit(0);
      std::vector<std::string> all;
      const auto start = Clock::now();
      Status st = (*comm)->AllGather(mine, &all, kTimeout);
      if (i < 20) {
        if (!st.ok()) return comm_testing::ReportInChild(rank, st);
        continue;
      }
      return ExpectFailure(rank, st, {StatusCode::kPeer}, 2, start);
    }
    std::fprintf(stderr, "[rank %d] UNEXPECTED: 40 allgathers succeeded without rank 2\n", rank);
    return 1;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// A rank dies while 8 MiB messages are on the wire: the others' writes hit a closed socket (EPIPE, not SIGPIPE)
// and their reads stop short; both must surface as an error naming the dead rank.
TEST(GlooFailure, RankThatDiesDuringALargeTransferIsNamed) {
  const int n = 3;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30), [&](int rank) {
    auto comm = NewGlooForTest(Loopback(rank, n, store));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    const std::string mine(8 << 20, static_cast<char>('a' + rank));
    if (rank == 2) {
      std::thread([] {
        std::this_thread::sleep_for(Millis(40));
        _exit(0);
      }).detach();
    }
    for (int i = 0; i < 1000; ++i) {
      std::vector<std::string> all;
      const auto start = Clock::now();
      Status st = (*comm)->AllGather(mine, &all, kTimeout);
      if (!st.ok()) return ExpectFailure(rank, st, {StatusCode::kPeer}, 2, start);
    }
    std::fprintf(stderr, "[rank %d] UNEXPECTED: 1000 allgathers succeeded\n", rank);
    return 1;
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << Describe(outcomes);
}

TEST(GlooFailure, RankThatStopsMidStreamIsNamed) {
  const int n = 3;
  const std::string store = FreshStore();
  auto outcomes =
      RunRanks(n, std::chrono::seconds(30),
               [&](int rank) {
                 auto comm = NewGlooForTest(Loopback(rank, n, store));
                 if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
                 for (int i = 0; i < 40; ++i) {
                   if (rank == 2 && i == 10) raise(SIGSTOP);
                   std::string data = rank == 0 ? std::string(64 << 10, 'b') : std::string();
                   const auto start = Clock::now();
                   Status st = (*comm)->Broadcast(&data, 0, kTimeout);
                   if (i < 10) {
                     if (!st.ok()) return comm_testing::ReportInChild(rank, st);
                     continue;
                   }
                   // With n = 3 the root sends to ranks 2 and 1 directly, so the root waits on the stopped rank. Rank 1
                   // has its data; it fails in the next broadcast, whose root (rank 0) never comes, and names that
                   // rank.
                   if (rank == 1 && st.ok()) continue;
                   return ExpectFailure(rank, st, {StatusCode::kTimeout, StatusCode::kPeer}, rank == 0 ? 2 : 0, start);
                 }
                 return 1;
               },
               /*may_linger=*/{2});
  for (int r = 0; r < 2; ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << Describe(outcomes);
}

TEST(GlooFailure, RanksInDifferentCollectivesAreToldSo) {
  const int n = 2;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30), [&](int rank) {
    auto comm = NewGlooForTest(Loopback(rank, n, store));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    const auto start = Clock::now();
    if (rank == 0) {
      std::string data = "hello";
      Status st = (*comm)->Broadcast(&data, 0, kTimeout);
      return ExpectFailure(rank, st, {StatusCode::kPeer, StatusCode::kTimeout}, 1, start);
    }
    std::vector<std::string> all;
    Status st = (*comm)->AllGather("x", &all, kTimeout);
    int code = ExpectFailure(rank, st, {StatusCode::kInvalidArgument}, 0, start);
    if (st.message().find("collective mismatch") == std::string::npos) code = 1;
    // Broken from now on, at once.
    Status later = (*comm)->Barrier(kTimeout);
    if (later.code() != StatusCode::kState || later.message().find("collective mismatch") == std::string::npos) {
      std::fprintf(stderr, "[rank 1] UNEXPECTED later call: %s\n", later.ToString().c_str());
      code = 1;
    }
    return code;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// A message of another size than SendRecvInto expects is refused naming the peer and both sizes, nothing is written
// past the caller's span, and the sender's call succeeds (its bytes were taken).
TEST(GlooFailure, SendRecvIntoRefusesAMessageOfTheWrongSize) {
  const int n = 2;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30), [&](int rank) {
    auto comm = NewGlooForTest(Loopback(rank, n, store));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    const std::string message(rank == 0 ? 1000 : 10, 'm');
    std::string target(rank == 0 ? 8 : 2000, '#');  // rank 0 expects 5 of rank 1's 10 bytes, rank 1 all 1000
    const size_t expect = rank == 0 ? 5 : 1000;
    Status st = (*comm)->SendRecvInto({{1 - rank, message}}, {{1 - rank, target.data(), expect}}, kTimeout);
    if (rank == 1) return comm_testing::ReportInChild(rank, st);
    const bool ok = st.code() == StatusCode::kInternal &&
                    st.message().find("rank 1 sent 10 bytes where 5") != std::string::npos && target.substr(5) == "###";
    std::fprintf(stderr, "[rank 0] %s: %s\n", ok ? "refused as expected" : "UNEXPECTED", st.ToString().c_str());
    return ok ? 0 : 1;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// Several messages to one peer: a later one of the wrong size is refused as the first would be, naming the peer and
// both sizes, and nothing is written past the place it was expected in.
TEST(GlooFailure, SendRecvIntoRefusesALaterMessageOfTheWrongSize) {
  const int n = 2;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30), [&](int rank) {
    auto comm = NewGlooForTest(Loopback(rank, n, store));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    if (rank == 1) {
      const std::string a(10, 'a'), b(20, 'b'), c(30, 'c');
      return comm_testing::ReportInChild(rank, (*comm)->SendRecvInto({{0, a}, {0, b}, {0, c}}, {}, kTimeout));
    }
    std::string first(10, '#'), second(25 + 40, '#'), third(30, '#');  // the second expects 25 of rank 1's 20 bytes
    Status st =
        (*comm)->SendRecvInto({}, {{1, first.data(), 10}, {1, second.data(), 25}, {1, third.data(), 30}}, kTimeout);
    const bool ok = st.code() == StatusCode::kInternal &&
                    st.message().find("rank 1 sent 20 bytes where 25") != std::string::npos &&
                    first == std::string(10, 'a') && second.substr(25) == std::string(40, '#');
    std::fprintf(stderr, "[rank 0] %s: %s\n", ok ? "refused as expected" : "UNEXPECTED", st.ToString().c_str());
    return ok ? 0 : 1;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// A rank that expects more messages from a peer than the peer sends waits at most its timeout, and names the peer;
// the peer, whose messages were all received, is done. (A peer that exits instead is named at once: its connection
// closes.)
TEST(GlooFailure, SendRecvIntoExpectingMoreMessagesThanSentTimesOutNamingThePeer) {
  const int n = 2;
  const std::string store = FreshStore();
  auto outcomes = RunRanks(n, std::chrono::seconds(30), [&](int rank) {
    auto comm = NewGlooForTest(Loopback(rank, n, store));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    const std::string m(1000, 'm');
    if (rank == 1) {
      Status st = (*comm)->SendRecvInto({{0, m}, {0, m}}, {}, kTimeout);
      std::this_thread::sleep_for(kTimeout + Millis(500));  // alive: rank 0 waits for a message, not a closed socket
      return comm_testing::ReportInChild(rank, st);
    }
    std::string got(3000, '#');
    const auto start = Clock::now();
    Status st = (*comm)->SendRecvInto(
        {}, {{1, got.data(), 1000}, {1, got.data() + 1000, 1000}, {1, got.data() + 2000, 1000}}, kTimeout);
    if (got.substr(0, 2000) != std::string(2000, 'm')) return 1;
    return ExpectFailure(rank, st, {StatusCode::kTimeout}, 1, start, kTimeout - Millis(50));
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// ---------------------------------------------------------------------------------------------------------------
// Rendezvous.

TEST(GlooRendezvous, RejectsMalformedUris) {
  // These fail before any thread or socket exists, so they run in the test process.
  struct Case {
    const char* uri;
    const char* says;
  } cases[] = {
      {"ftp://host/dir", "expected file:///shared/dir or redis://host:port"},
      {"/just/a/path", "expected file:///shared/dir or redis://host:port"},
      {"file://relative/dir", "absolute directory"},
      {"redis://", "names no host"},
      {"redis://host:0", "not in 1..65535"},
      {"redis://host:http", "not in 1..65535"},
  };
  for (const Case& c : cases) {
    auto comm = NewGlooForTest(Loopback(0, 1, c.uri));
    ASSERT_FALSE(comm.ok()) << c.uri;
    EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument) << comm.status().ToString();
    EXPECT_NE(comm.status().message().find(c.says), std::string::npos) << comm.status().ToString();
    EXPECT_NE(comm.status().message().find(c.uri), std::string::npos) << comm.status().ToString();
  }
  GlooOptions bad = Loopback(2, 2, "file:///tmp");
  EXPECT_EQ(NewGlooForTest(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(GlooRendezvous, UnreachableRedisNamesTheAddress) {
  const int port = gloo_testing::FreeLoopbackPort();
  auto outcomes = RunRanks(1, std::chrono::seconds(20), [&](int rank) {
    const auto start = Clock::now();
    auto comm = NewGlooForTest(Loopback(0, 1, "redis://127.0.0.1:" + std::to_string(port)));
    const Status st = comm.ok() ? OkStatus() : comm.status();
    int code = ExpectFailure(rank, st, {StatusCode::kIo}, -1, start);
    if (st.message().find("127.0.0.1:" + std::to_string(port)) == std::string::npos) code = 1;
    return code;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(GlooRendezvous, NamesTheRanksThatNeverArrive) {
  const std::string store = FreshStore();
  // A group of 4 where only ranks 0 and 1 start.
  auto outcomes = RunRanks(2, std::chrono::seconds(20), [&](int rank) {
    const auto start = Clock::now();
    auto comm = NewGlooForTest(Loopback(rank, 4, store, Millis(1000)));
    const Status st = comm.ok() ? OkStatus() : comm.status();
    int code = ExpectFailure(rank, st, {StatusCode::kTimeout}, -1, start, Millis(950));
    if (st.message().find("ranks 2, 3 never published") == std::string::npos) code = 1;
    return code;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(GlooRendezvous, APrefixInUseIsRefusedAndAFinishedOneIsReusable) {
  const std::string dir = testing_util::MakeTempDir("gloo-prefix-");
  const std::string store = "file://" + dir;
  // Two groups in a row with the same prefix: the first removes its keys once connected.
  for (int round = 0; round < 2; ++round) {
    auto outcomes = RunRanks(2, std::chrono::seconds(20), [&](int rank) {
      auto comm = NewGlooForTest(Loopback(rank, 2, store, Millis(10000), "job-7"));
      if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
      std::vector<std::string> all;
      return comm_testing::ReportInChild(rank, (*comm)->AllGather("r" + std::to_string(rank), &all, kTimeout));
    });
    ASSERT_TRUE(AllExitedZero(outcomes)) << "round " << round << "\n" << Describe(outcomes);
  }
  // The store directory is empty again.
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  std::vector<std::string> left;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") left.push_back(e->d_name);
  }
  closedir(d);
  EXPECT_TRUE(left.empty()) << left.size() << " files left, first " << left[0];

  // A second rank 0 with the prefix while the first one waits for its peer: kExists.
  auto outcomes = RunRanks(2, std::chrono::seconds(20), [&](int rank) {
    if (rank == 1) std::this_thread::sleep_for(Millis(300));
    const auto start = Clock::now();
    auto comm = NewGlooForTest(Loopback(0, 2, store, Millis(1500), "job-8"));
    const Status st = comm.ok() ? OkStatus() : comm.status();
    if (rank == 0) return ExpectFailure(rank, st, {StatusCode::kTimeout}, -1, start);
    int code = ExpectFailure(rank, st, {StatusCode::kExists}, -1, start);
    if (st.message().find("job-8") == std::string::npos) code = 1;
    return code;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(GlooRendezvous, UnknownInterfaceIsNamed) {
  const std::string store = FreshStore();
  auto outcomes = RunRanks(1, std::chrono::seconds(20), [&](int rank) {
    GlooOptions o = Loopback(0, 1, store);
    o.iface = "nosuchif0";
    const auto start = Clock::now();
    auto comm = NewGlooForTest(o);
    const Status st = comm.ok() ? OkStatus() : comm.status();
    int code = ExpectFailure(rank, st, {StatusCode::kInvalidArgument}, -1, start);
    if (st.message().find("nosuchif0") == std::string::npos) code = 1;
    return code;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// A host name that does not resolve crashed inside Gloo (it reads getaddrinfo's result after a failure): it is a
// clear error naming the name and the variables that choose another. ".invalid" never resolves (RFC 2606).
TEST(GlooRendezvous, UnresolvableHostNameIsNamed) {
  const std::string store = FreshStore();
  auto outcomes = RunRanks(1, std::chrono::seconds(20), [&](int rank) {
    GlooOptions o = Loopback(0, 1, store);
    o.hostname = "no-such-host.invalid";
    const auto start = Clock::now();
    auto comm = NewGlooForTest(o);
    const Status st = comm.ok() ? OkStatus() : comm.status();
    int code = ExpectFailure(rank, st, {StatusCode::kInvalidArgument}, -1, start);
    for (const char* want : {"no-such-host.invalid", "does not resolve", "DCKPT_GLOO_HOSTNAME"}) {
      if (st.message().find(want) == std::string::npos) code = 1;
    }
    return code;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// ---------------------------------------------------------------------------------------------------------------
// Options from the environment.

class ScopedEnv {
 public:
  ScopedEnv() {
    for (const char* v : kVars) unsetenv(v);
  }
  ~ScopedEnv() {
    for (const char* v : kVars) unsetenv(v);
  }
  void Set(const char* var, const char* value) { setenv(var, value, 1); }

 private:
  static constexpr const char* kVars[] = {"DCKPT_RANK",          "RANK",
                                          "DCKPT_WORLD_SIZE",    "WORLD_SIZE",
                                          "DCKPT_RENDEZVOUS",    "DCKPT_GLOO_IFACE",
                                          "DCKPT_GLOO_HOSTNAME", "DCKPT_TIMEOUT_MS"};
};
constexpr const char* ScopedEnv::kVars[];

TEST(GlooOptionsFromEnv, ReadsEveryVariable) {
  ScopedEnv env;
  env.Set("DCKPT_RANK", "2");
  env.Set("DCKPT_WORLD_SIZE", "8");
  env.Set("DCKPT_RENDEZVOUS", "redis://10.0.0.1:7000");
  env.Set("DCKPT_GLOO_IFACE", "eth1");
  env.Set("DCKPT_GLOO_HOSTNAME", "node-3");
  env.Set("DCKPT_TIMEOUT_MS", "1234");
  auto o = GlooOptionsFromEnv(GlooOptions());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->world_size, 8);
  EXPECT_EQ(o->rendezvous, "redis://10.0.0.1:7000");
  EXPECT_EQ(o->iface, "eth1");
  EXPECT_EQ(o->hostname, "node-3");
  EXPECT_EQ(o->timeout, Millis(1234));
}

TEST(GlooOptionsFromEnv, FallsBackToTorchrunNamesAndKeepsExplicitValues) {
  ScopedEnv env;
  env.Set("RANK", "1");
  env.Set("WORLD_SIZE", "3");
  env.Set("DCKPT_RENDEZVOUS", "file:///from/env");
  env.Set("DCKPT_TIMEOUT_MS", "99");
  GlooOptions base;
  base.rendezvous = "file:///explicit";
  base.timeout = Millis(5000);
  auto o = GlooOptionsFromEnv(base);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->world_size, 3);
  EXPECT_EQ(o->rendezvous, "file:///explicit");
  EXPECT_EQ(o->timeout, Millis(5000));
  env.Set("DCKPT_RANK", "0");  // DCKPT_* wins over the torchrun name.
  EXPECT_EQ(GlooOptionsFromEnv(GlooOptions())->rank, 0);
}

TEST(GlooOptionsFromEnv, SaysWhichVariableIsMissingOrMalformed) {
  ScopedEnv env;
  auto o = GlooOptionsFromEnv(GlooOptions());
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("DCKPT_RANK"), std::string::npos) << o.status().ToString();

  env.Set("DCKPT_RANK", "0");
  o = GlooOptionsFromEnv(GlooOptions());
  EXPECT_NE(o.status().message().find("DCKPT_WORLD_SIZE"), std::string::npos) << o.status().ToString();

  env.Set("DCKPT_WORLD_SIZE", "2");
  o = GlooOptionsFromEnv(GlooOptions());
  EXPECT_NE(o.status().message().find("DCKPT_RENDEZVOUS"), std::string::npos) << o.status().ToString();

  env.Set("DCKPT_RENDEZVOUS", "file:///x");
  env.Set("DCKPT_RANK", "two");
  o = GlooOptionsFromEnv(GlooOptions());
  EXPECT_NE(o.status().message().find("DCKPT_RANK='two'"), std::string::npos) << o.status().ToString();

  env.Set("DCKPT_RANK", "0");
  env.Set("DCKPT_TIMEOUT_MS", "-5");
  o = GlooOptionsFromEnv(GlooOptions());
  EXPECT_NE(o.status().message().find("DCKPT_TIMEOUT_MS='-5'"), std::string::npos) << o.status().ToString();
}

}  // namespace
}  // namespace distckpt
