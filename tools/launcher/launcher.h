// Spawns N real processes of one program on this machine, wired for a Gloo group over loopback: each gets
// DCKPT_RANK, DCKPT_WORLD_SIZE and a fresh DCKPT_RENDEZVOUS (file:// store) in its environment. Used by the
// multi-process tests and by `launch` (launch_main.cc).
#ifndef DISTCKPT_TOOLS_LAUNCHER_LAUNCHER_H_
#define DISTCKPT_TOOLS_LAUNCHER_LAUNCHER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace distckpt {
namespace launcher {

struct LaunchSpec {
  std::string program;
  /// Processes to start here; they get ranks rank_offset .. rank_offset + world_size - 1.
  int world_size = 1;
  /// For groups spread over several launchers (hosts): the first rank started here, and the whole group's size
  /// (0: world_size).
  int rank_offset = 0;
  int group_size = 0;
  /// Arguments for every rank; `rank_args(r)` (optional) appends rank-specific ones.
  std::vector<std::string> args;
  std::function<std::vector<std::string>(int rank)> rank_args;
  /// Extra environment for every rank (on top of the parent's).
  std::map<std::string, std::string> env;
  /// Where the file store lives; empty: a fresh directory under $TEST_TMPDIR (or /tmp).
  std::string rendezvous_dir;
  /// Rank r's stdout+stderr go to "<log_dir>/rank-<r>.log"; empty: inherit the parent's.
  std::string log_dir;
  /// Every process still running after this is killed (SIGKILL) and reported as timed out.
  std::chrono::milliseconds timeout{120000};
};

struct RankResult {
  int exit_code = -1;     ///< exit status, or -1 if killed by a signal
  int signal = 0;         ///< the signal that ended it, if any
  bool timed_out = false; ///< killed by the launcher at the timeout
  double seconds = 0;     ///< from launch to exit
  std::string log;        ///< its output, when log_dir was set
};

/// Launches every local rank, waits for all of them (or the timeout) and returns one result per local rank.
std::vector<RankResult> Launch(const LaunchSpec& spec);

/// The path of a Bazel runfile of this workspace, e.g. Runfile("tests/faults/fault_worker").
std::string Runfile(const std::string& rel);

/// The unsigned integer in environment variable `name`, or `fallback` where it is unset or empty.
uint64_t EnvOr(const char* name, uint64_t fallback);

}  // namespace launcher
}  // namespace distckpt

#endif  // DISTCKPT_TOOLS_LAUNCHER_LAUNCHER_H_
