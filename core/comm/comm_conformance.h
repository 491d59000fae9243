// The conformance suite every communicator backend passes, and a harness that runs one body per rank in forked
// child processes (ranks are real processes: Gloo connects over loopback TCP, nothing is mocked).
//
// Usage (in a gtest):
//   auto outcomes = comm_testing::RunRanks(4, std::chrono::seconds(60), [&](int rank) {
//     auto comm = MakeMyBackend(rank, 4);              // runs in the child, after fork
//     return comm_testing::ReportInChild(rank, comm.ok() ? comm_testing::RunConformance(comm->get()) : comm.status());
//   });
//   EXPECT_TRUE(comm_testing::AllExitedZero(outcomes)) << comm_testing::Describe(outcomes);
#ifndef DISTCKPT_CORE_COMM_COMM_CONFORMANCE_H_
#define DISTCKPT_CORE_COMM_COMM_CONFORMANCE_H_

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/comm/communicator.h"

namespace distckpt {
namespace comm_testing {

struct ConformanceOptions {
  /// Timeout of every collective that is expected to succeed: generous, the test machine may be loaded.
  std::chrono::milliseconds timeout{30000};
  /// Back-to-back small collectives (slot reuse, ordering).
  int repetitions = 100;
  /// The "large" payload of AllGather, Gather and Broadcast.
  size_t large_bytes = size_t{1} << 20;
  /// Last check: the highest rank skips a barrier; the others must fail within `short_timeout` (plus slack), and
  /// later calls must fail fast with kState. It breaks the group, so it runs last. Needs size() > 1.
  bool check_timeout = true;
  std::chrono::milliseconds short_timeout{600};
  /// How late past `short_timeout` a failure may come back (scheduling on a loaded machine).
  std::chrono::milliseconds slack{2500};
};

/// Runs every check on `comm`; collective: every rank of the group calls it with the same options. Returns the first
/// failure, naming the check and the rank.
Status RunConformance(Communicator* comm, const ConformanceOptions& options = ConformanceOptions());

/// How one forked rank ended.
struct RankOutcome {
  int rank = -1;
  int exit_code = -1;  ///< -1 if it did not exit normally.
  int signal = 0;      ///< The signal that ended it, if any.
  bool killed_by_harness = false;
  double seconds = 0;  ///< From fork to exit.
};

/// Forks `n` children and runs `body(rank)` in each; its return value is the child's exit code (an exception is
/// exit code 3). Each child is bounded by alarm(`limit`); the parent SIGKILLs any child alive past `limit` + 5 s,
/// and the ranks in `may_linger` (e.g. one that stopped itself) once every other rank has exited. Call it before the
/// calling process creates any thread.
std::vector<RankOutcome> RunRanks(int n, std::chrono::seconds limit, const std::function<int(int rank)>& body,
                                  const std::vector<int>& may_linger = {});

/// Prints a failed status as "[rank r] ..." to stderr and returns the exit code for it (0 for OK, 1 otherwise).
int ReportInChild(int rank, const Status& status);

bool AllExitedZero(const std::vector<RankOutcome>& outcomes);
std::string Describe(const std::vector<RankOutcome>& outcomes);

}  // namespace comm_testing
}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_COMM_CONFORMANCE_H_
