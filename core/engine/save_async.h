// Asynchronous save: the call returns as soon as the state is copied into buffers distckpt owns, so the caller may
// change its tensors at once; planning, writing, hashing and the commit go on in a background thread.
#ifndef DISTCKPT_CORE_ENGINE_SAVE_ASYNC_H_
#define DISTCKPT_CORE_ENGINE_SAVE_ASYNC_H_

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda/copy_engine.h"
#include "core/engine/save.h"

namespace distckpt {

/// The outcome of an asynchronous save. Thread-safe.
class SaveFuture {
 public:
  ~SaveFuture();  ///< Waits for the background save to finish (it cannot be cancelled halfway through a collective).

  /// Waits up to `timeout` for the save; returns its result, or kTimeout if it is still running.
  Result<SaveSummary> Wait(std::chrono::milliseconds timeout);
  /// True once the save has finished (successfully or not).
  bool done() const;
  /// Seconds the caller was blocked: the time to copy the state into owned buffers.
  double staging_seconds() const { return staging_seconds_; }
  /// Bytes copied into owned host buffers.
  uint64_t staged_bytes() const { return staged_bytes_; }
  /// Bytes of device pieces snapshotted into device memory (SaveOptions::device_snapshot).
  uint64_t snapshot_bytes() const { return snapshot_bytes_; }
  /// Bytes of device pieces that device_snapshot asked for but that were staged in host memory instead: their device
  /// had not that much free beyond the headroom left for training (1/16 of it, at least 512 MiB), or ran out.
  uint64_t snapshot_fallback_bytes() const { return snapshot_fallback_bytes_; }

 private:
  friend Result<std::unique_ptr<SaveFuture>> SaveAsync(const std::string&, const State&, Communicator*,
                                                       const SaveOptions&);
  SaveFuture() = default;
  /// Copies `state` into buffers this future owns (owned_; host data in buffer_, device pieces in pinned_, or through
  /// the staging pipeline into buffer_ where no pinned memory could be had).
  Status Stage(const std::string& path, const State& state, const SaveOptions& options);
  /// For device_snapshot: one arena per device for its pieces (arenas_, snapshots_); a device without room for its
  /// arena (kNoMemory) keeps its pieces for host staging, any other allocation failure is an error. Returns the
  /// engine, or nullptr when nothing is snapshotted.
  Result<CopyEngine*> AllocateSnapshots(const State& state, const SaveOptions& options);
  void FreeSnapshots();
  struct Snapshot {
    const TensorPiece* piece;  // the caller's: valid during Stage only
    void* data;
    uint64_t size;
    int device;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Result<SaveSummary>> result_;
  std::thread thread_;
  State owned_;
  std::shared_ptr<char> buffer_;  // host data's staging (pageable, kept for the next save: save_async.cc)
  std::shared_ptr<char> pinned_;  // device pieces' staging: page-locked memory of the copy engine
  uint64_t reserved_ = 0;         // bytes of the process-wide async staging budget this save holds until it finishes
  double staging_seconds_ = 0;
  uint64_t staged_bytes_ = 0;
  uint64_t snapshot_bytes_ = 0;
  uint64_t snapshot_fallback_bytes_ = 0;
  CopyEngine* snapshot_engine_ = nullptr;
  struct Arena {
    void* data;
    int device;
  };
  std::vector<Arena> arenas_;        // device memory this future owns (one block per device), freed when the save
                                     // finishes
  std::vector<Snapshot> snapshots_;  // each device piece's place in its device's arena
  bool snapshots_stuck_ = false;     // a copy that timed out may still use the arenas: quarantined, not freed
};

/// Copies every piece and bytes entry of `state` into owned buffers (host data in parallel on the CPUs; device pieces
/// with one device-to-host copy each into page-locked memory of the copy engine, kept for the next save, or through
/// the bounded pinned staging pool, save_staging.h, where that memory cannot be had), then runs Save on a background
/// thread. With
/// options.max_async_staging_bytes set, the call first waits (up to options.timeout, then kTimeout) while the staging
/// of unfinished async saves would go past that cap; a save frees its staging as soon as it finishes. Collective like
/// Save: every rank calls it. `comm` belongs to the save until it finishes: do not run other collectives on it
/// meanwhile. A communicator whose collectives cannot run on a background thread beside the caller's own work
/// (Communicator::CheckBackgroundUse: NCCL's) is refused at once with its status (kUnsupported, saying what to pass
/// instead), before anything is staged. `state`'s buffers may be reused as soon as this returns.
Result<std::unique_ptr<SaveFuture>> SaveAsync(const std::string& path, const State& state, Communicator* comm,
                                              const SaveOptions& options);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_SAVE_ASYNC_H_
