// What a node's local tier holds (manager.h's layout), for operators: `distckpt tiers DIR` (Go) and
// `python -m distckpt tiers DIR` print it from the JSON document here (C ABI: dckpt_tiers_describe), and the prune of
// abandoned tier steps (dckpt_tiers_prune_abandoned). Reads only; never follows a symbolic link.
#ifndef DISTCKPT_CORE_MANAGER_TIER_REPORT_H_
#define DISTCKPT_CORE_MANAGER_TIER_REPORT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {

struct TierPart {
  std::string name;    ///< the directory's name: "part-00003", or a staging name
  int64_t rank = -1;   ///< whose part (-1: unknown)
  uint32_t ranks = 0;  ///< the world size that saved the step (0: unknown)
  std::string run;     ///< the run that wrote it ("" unknown)
  uint64_t bytes = 0;  ///< the files' sizes
  std::string state;   ///< "complete", "in progress", "abandoned" or "damaged"
  std::string why;     ///< for every state but "complete": the reason
  /// Whether it is a replica of another node's rank: its rank has no completion marker in the step (each rank marks
  /// the steps in its own node's tier). Unknown (nullopt) while the step has no marker.
  std::optional<bool> replica;
  bool directory = true;  ///< false: not a directory reached without a link (reported, never removed)
  /// A staging or other leftover directory (core/tools/rename_leftovers.h), and, if abandoned, the grace period the
  /// prune judges it with again right before removing it (0: its writer, on this host, has exited).
  bool leftover = false;
  std::chrono::seconds prune_grace{0};
};

struct TierStep {
  uint64_t step = 0;
  std::vector<TierPart> parts;
  std::vector<std::pair<uint32_t, std::string>> markers;  ///< complete-<rank>: (rank, run)
  /// A run of which this node holds every rank's part, complete and marked: the step restores from this node alone.
  std::string restorable_run;
  /// No marker, nothing in progress, and every run that wrote a part of it (every run marked here, when no part names
  /// its run) has marked a newer step complete here: that run's manager would have removed it (a prune may).
  bool abandoned = false;
};

struct TierReport {
  std::string dir;
  std::vector<TierStep> steps;     ///< oldest first
  std::vector<std::string> other;  ///< names below `dir` that are not the manager's (never touched)
};

/// Reads the tier at `dir`. kNotFound when it is missing; kInvalidArgument when it is not a manager's tier (no step
/// directory, and nothing of a tier's layout).
Result<TierReport> DescribeTier(Storage* storage, const std::string& dir);
/// The documented JSON document (docs/manager.md, "Looking at a tier").
std::string TierReportJson(const TierReport& report);
/// Removes what the report calls abandoned: staging directories whose writer is gone (judged again right before, and
/// removed as core/tools/rename_leftovers.h removes leftovers), and whole steps marked abandoned; never a step with a
/// completion marker, never anything in progress, never a name the manager does not write, never through a link.
/// `removed` is told each path first (with dry_run, instead of removing it); an error from it stops the prune.
Status PruneAbandonedTier(Storage* storage, const std::string& dir, bool dry_run,
                          const std::function<Status(const std::string&)>& removed);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_MANAGER_TIER_REPORT_H_
