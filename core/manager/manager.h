// The checkpoint manager: a checkpoint every step, kept in tiers (DESIGN.md "Tiers").
//
// Layout of the node-local tier (local_dir, shared by the ranks of one node):
//   step-<10 digits>/part-<rank, 5 digits>/   rank R's part of the step (part.h): its own, or a replica of another
//                                            node's rank, committed like any checkpoint (staging name, rename)
//   step-<10 digits>/complete-<rank>          written by each rank once every rank's part and its replicas are
//                                            durable (the step is complete); holds the run id
//   restore-r<rank>.<nonce>/                 left by earlier versions' restores (removed at creation); a restore now
//                                            writes nothing to the tier (restore_source.h)
// Every part records the run that wrote it (a nonce the ranks agree on when the manager is created), so a restore
// never mixes parts of a step saved twice by two runs of the job.
#ifndef DISTCKPT_CORE_MANAGER_MANAGER_H_
#define DISTCKPT_CORE_MANAGER_MANAGER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/base/status.h"
#include "core/base/thread_priority.h"
#include "core/comm/communicator.h"
#include "core/cuda/copy_engine.h"
#include "core/engine/save_async.h"
#include "core/engine/state.h"
#include "core/format/metadata.h"
#include "core/manager/part.h"
#include "core/storage/storage.h"

namespace distckpt {

/// ManagerOptions::replicas chosen from the job's nodes (the default).
constexpr int kAutoReplicas = -1;

struct ManagerOptions {
  std::string local_dir;         ///< required (the C ABI supplies the default)
  std::string node_id;           ///< required (the C ABI supplies the host name)
  int replicas = kAutoReplicas;  ///< 0, 1 or 2; kAutoReplicas: 1 where the job has other nodes, 0 on one node
  std::string persistent_path;   ///< "" = no persistent tier
  /// Where persistent_path is (nullptr: the POSIX file system). Shared: kept alive by the manager.
  std::shared_ptr<Storage> persistent_storage;
  uint64_t persist_every = 0;
  int keep_local = 2;
  int keep_persistent = 0;  ///< 0 = all
  uint64_t local_budget_bytes = 0;
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  bool device_snapshot = false;
  uint64_t exchange_round_bytes = 64ull << 20;
  CopyEngine* copy_engine = nullptr;  ///< tests: a HostCopyEngine for device pieces
  /// The node-local tier's storage: nullptr is the POSIX file system (the default and what the C ABI passes); tests
  /// pass a FaultStorage over it. Must reach the same files as the POSIX paths (a restore hard-links them).
  Storage* local_storage = nullptr;
  /// Writer threads of a step's background work (the part's write and checksums; replicating and persisting run on
  /// the manager's one background thread); 0: DefaultManagerThreads().
  size_t threads = 0;
  /// The CPU and I/O priority of the background work (the manager's thread, the part's writer threads); restores,
  /// which the caller waits for, keep the caller's. kNormal by default: lowering it made a loop with checkpoints
  /// slower where the host is busy, never faster (docs/manager.md, "Background work").
  ThreadPriority background_priority = ThreadPriority::kNormal;
  /// Persisted steps are compressed (Codec::kZstdGrouped at persist_compression_level, as SaveOptions::compression)
  /// while they are copied from the node-local tier, which stays raw: it is written every step and read at restore.
  Codec persist_compression = Codec::kRaw;
  int persist_compression_level = 0;
  /// A persisted step refers to the previous persisted step for every chunk that holds the same bytes there (same
  /// box and XXH3-128: an incremental checkpoint, FORMAT.md 4.1); the parts of the steps to persist record the
  /// chunk hashes for it. Retention (keep_persistent) keeps every step a kept one refers to.
  bool persist_incremental = false;
  /// With persist_incremental: every persist_full_every-th persisted step of a chain is written whole (0: no bound).
  uint32_t persist_full_every = 0;
};

/// Writer threads when ManagerOptions::threads is 0: a quarter of the cores, at least 1 and at most 4, so that the
/// background work never takes more than a small share of a training host's CPUs.
size_t DefaultManagerThreads();

/// Counters of one manager since it was created (CheckpointManager::stats).
struct ManagerStats {
  uint64_t steps_saved = 0;      ///< steps Save accepted (each then runs in the background, completed or failed)
  uint64_t steps_completed = 0;  ///< steps made complete by this run (part and replicas durable on every rank)
  uint64_t steps_failed = 0;     ///< steps whose background work ended without the step complete
  /// Saves that waited before staging: for the steps in flight (at most two) or for the local budget to free up.
  uint64_t saves_waited = 0;
  uint64_t saves_waited_for_budget = 0;  ///< of saves_waited: the ones that waited for local_budget_bytes
  double wait_seconds = 0;               ///< total time Save spent waiting
  double max_wait_seconds = 0;           ///< the longest wait of one Save
  uint64_t bytes_written = 0;         ///< bytes of this rank's own parts of completed steps written to the local tier
  uint64_t bytes_replicated = 0;      ///< bytes of other ranks' parts this rank received and kept (completed steps)
  uint64_t bytes_persisted = 0;       ///< bytes this rank wrote to persistent storage (as stored: compressed) for steps
                                      ///< persisted; a box several ranks hold is written by one
  uint64_t bytes_persist_reused = 0;  ///< rank 0: data bytes persisted steps refer to in the previous one
  double persist_seconds = 0;         ///< time the background thread spent persisting steps (succeeded or not)
};

enum class Tier { kNone = 0, kLocal = 1, kPeer = 2, kPersistent = 3 };

struct RestoreOptions {
  bool fallback = true;
  bool use_persistent = true;
};

struct RestoreSummary {
  bool found = false;
  uint64_t step = 0;
  Tier tier = Tier::kNone;
  uint32_t copies_made = 0;  ///< parts of the restored step being copied to other nodes again (Restore)
  uint64_t bytes_local = 0;
  uint64_t bytes_from_peers = 0;
  uint64_t bytes_from_persistent = 0;
  double seconds = 0;
};

/// One per rank. Not thread-safe (one call at a time); its background thread owns the communicator's collectives
/// between calls.
class CheckpointManager {
 public:
  /// Collective: the ranks exchange their node ids and agree on a run id.
  static Result<std::unique_ptr<CheckpointManager>> Create(Communicator* comm, const ManagerOptions& options);
  ~CheckpointManager();  ///< Waits for the background work.

  /// Stages `state` and returns; the step's part is written, replicated and persisted in the background.
  Status Save(uint64_t step, const State& state, bool persist);
  /// Waits for every step saved so far; returns the first background error since the last Wait (kTimeout if still
  /// busy after `timeout`).
  Status Wait(std::chrono::milliseconds timeout);
  /// The newest step completed by this run, or by an earlier run as found on disk at creation.
  std::optional<uint64_t> latest_step() const;
  /// Collective: see dckpt_manager_restore. When a part of the restored step is on fewer nodes than the manager keeps
  /// (a node was lost, or the job has other nodes now), it is copied at once, in the background, from the tiers that
  /// hold it to the nodes that should (PlanCopies), file to file: losing another node right after the restore is
  /// survived. Wait waits for it.
  Result<RestoreSummary> Restore(State& state, const RestoreOptions& options);
  /// What the last restore did (one line per fact).
  const std::string& restore_report() const { return report_; }
  /// The counters so far. Thread-safe: may be called while another thread is in Save or Wait (a monitor).
  ManagerStats stats() const;

 private:
  struct Job;
  struct Inventory;
  CheckpointManager(Communicator* comm, const ManagerOptions& options);
  // A copy of part `part` of a restored step, from the tier of rank `from`'s node to that of rank `to`'s.
  struct PartCopy {
    int from, to;
    uint32_t part;
  };
  // The copies a restored step needs so that each part is on as many nodes as the manager keeps (1 + replicas, at
  // most the nodes there are), given the ranks whose nodes hold a good copy of each part.
  std::vector<PartCopy> PlanCopies(uint32_t ranks, const std::vector<std::vector<int>>& good) const;
  struct Again {
    uint64_t step = 0;
    std::string run;                    // the run that saved the step
    std::vector<std::string> metadata;  // per part, as verified
    std::vector<PartCopy> copies;
  };
  // Background work (copies.cc): the copies made, then the step marked complete on every node; as Replicate.
  Status CopyParts(const Again& again, Status* outcome);
  void ProcessAgain(const Again& again);
  void QueueCopies(std::unique_ptr<Again> again);
  void Run();
  void Process(Job& job);
  // Returns the status of the collectives (an error: the communicator is gone); *outcome: this rank's part of the
  // replication (its own part sent, the replicas it keeps committed).
  // *held: the bytes of this rank's part and of the replicas it keeps.
  Status Replicate(const Job& job, const Status& local, Status* outcome, uint64_t* held);
  Status Persist(uint64_t step, Status* outcome);  // persisting.cc
  void PrunePersistent(uint64_t step);             // rank 0, after persisting `step`
  // Checks that the ranks' pieces of the job's state tile every tensor (as Replicate: collectives, and *outcome).
  Status CheckLayout(const Job& job, Status* outcome);  // as Replicate
  void Prune(uint64_t step);
  std::string StepDir(uint64_t step) const;
  std::string PartDir(uint64_t step, uint32_t rank) const;
  // The parts of `step` from their metadata files' bytes (indexed by rank), each checked (ParsePart).
  Result<std::vector<Part>> ParseParts(uint64_t step, const std::vector<std::string>& metadata) const;
  Result<Inventory> TakeInventory(bool use_persistent);
  Status RestoreFromParts(State& state, uint64_t step, const std::vector<std::string>& part_metadata,
                          const std::vector<std::vector<int>>& good_holders, RestoreSummary* summary,
                          bool* corrupt);  // *corrupt: some rank's load found a corrupt byte
  void Fail(const Status& st);             // mu_ held

  Communicator* comm_;
  std::unique_ptr<Communicator> single_;  // when created without a communicator
  ManagerOptions options_;
  Storage* local_;  // the POSIX file system
  Storage* persistent_ = nullptr;
  std::string run_;
  std::vector<std::string> node_of_;          // node id per rank
  std::vector<std::vector<int>> nodes_;       // ranks per node, nodes sorted by id
  std::vector<int> node_index_;               // node per rank
  std::vector<int> targets_;                  // ranks that keep replicas of this rank's parts
  std::vector<int> sources_;                  // ranks whose parts this rank keeps
  std::vector<std::vector<int>> targets_of_;  // per rank

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  Status error_;   // first background error since the last Wait
  Status broken_;  // a collective failed: nothing more can run
  std::optional<uint64_t> last_saved_;
  std::optional<uint64_t> latest_;
  std::vector<uint64_t> completed_;       // this run's complete steps still kept, oldest first
  std::map<uint64_t, uint64_t> charged_;  // bytes of the budget each step holds
  uint64_t charged_total_ = 0;
  uint64_t last_part_bytes_ = 0;
  uint64_t keep_ = 1;                         // complete steps kept, agreed with every step (Prune)
  std::vector<std::string> checked_layouts_;  // the ranks' layout hashes last found to tile (background thread)
  // Replication's receive buffers (two per source rank: one round arriving, the one before being written), kept from
  // step to step on the background thread: allocated and faulted in once, not zeroed and given back at every step.
  struct ReceiveBuffer {
    std::unique_ptr<char[]> data;
    size_t size = 0;
  };
  std::map<int, ReceiveBuffer> replica_buffers_[2];
  std::string report_;
  std::string setup_note_;                      // what Create chose by default, at the head of every restore report
  ManagerStats stats_;                          // under mu_
  std::unique_ptr<Storage> local_faults_;       // DCKPT_TEST_MANAGER_FAULTS (test only): over the local tier
  std::shared_ptr<Storage> persistent_faults_;  // and over the persistent storage
  std::thread thread_;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_MANAGER_MANAGER_H_
