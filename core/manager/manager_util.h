// What the checkpoint manager's translation units share: the names of the local tier, a ranged read and the phase
// trace. Internal to core/manager.
#ifndef DISTCKPT_CORE_MANAGER_MANAGER_UTIL_H_
#define DISTCKPT_CORE_MANAGER_MANAGER_UTIL_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {
namespace manager_internal {

// "step-<10 digits>", "part-<5 digits>", "complete-<5 digits>" (manager.h's layout).
std::string StepName(uint64_t step);
std::string PartName(uint32_t rank);
std::string CompleteName(uint32_t rank);
// Parses "<prefix><digits>" (exactly `digits` digits).
bool ParseNumbered(const std::string& name, const char* prefix, size_t digits, uint64_t* out);
Status CopyRange(const ReadableFile& from, uint64_t offset, uint64_t size, std::string* out);
/// Commits a part received under `staging_dir` (its STAGING marker inside) as `final_dir` in `step_dir`: the marker
/// goes, the directory is made durable, a copy already at `final_dir` (an earlier run's, or a damaged one) is replaced
/// by the rename, and the step directory is made durable.
Status CommitReceivedPart(Storage* storage, const std::string& staging_dir, const std::string& final_dir,
                          const std::string& step_dir);

/// DCKPT_MANAGER_TRACE=1: the phases of a step's background work or of a restore, timed, as one line on stderr when
/// the trace goes ("dckpt manager trace: <what>: <phase> <ms> ms ...").
/// Test only: DCKPT_TEST_MANAGER_KILL_AT=PHASE[@TEXT] ends the process with SIGKILL at the end of the first phase
/// PHASE of a trace whose <what> contains TEXT (e.g. "fetch@restore": a restore's bytes fetched from peers, not yet
/// loaded), so that tests of real processes can kill a rank at an exact point. Read once.
class PhaseTrace {
 public:
  explicit PhaseTrace(std::string what);
  ~PhaseTrace();
  void Mark(const char* phase);
  /// Adds the time since `since` to the running total of `part` (any thread): parts of a phase, printed after the
  /// phases as "[part <ms> ms xN]".
  void Add(const char* part, std::chrono::steady_clock::time_point since);
  bool on() const { return on_; }

 private:
  bool on_;
  std::string what_, line_;
  std::mutex mu_;
  std::map<std::string, std::pair<double, uint64_t>> parts_;
  std::chrono::steady_clock::time_point at_ = std::chrono::steady_clock::now();
};

}  // namespace manager_internal
}  // namespace distckpt

#endif  // DISTCKPT_CORE_MANAGER_MANAGER_UTIL_H_
