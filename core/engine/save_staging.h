// The device-to-host staging pipeline of a save: device pieces are copied, segment by segment, into buffers of the
// copy engine's bounded pinned pool, and each segment is handed to a consumer (hash + write for Save, a copy into the
// owned buffer for SaveAsync) on the I/O thread pool once its copy has landed. While the consumer of buffer k runs,
// the copy of buffer k+1 is already under way; buffers go back to the pool after their consumer, and the producer
// blocks when all of them are in use (back-pressure), so staging memory never grows with the state.
#ifndef DISTCKPT_CORE_ENGINE_SAVE_STAGING_H_
#define DISTCKPT_CORE_ENGINE_SAVE_STAGING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/base/thread_pool.h"
#include "core/cuda/copy_engine.h"
#include "core/cuda/pinned_pool.h"
#include "core/engine/save.h"

namespace distckpt {

/// One device buffer to stage.
struct DeviceCopy {
  const void* src = nullptr;
  uint64_t size = 0;
  MemoryLocation memory;
  std::string what;  ///< "tensor 'w' piece [0:4, 0:8]", for errors
};

/// Receives `n` bytes of copy `index` starting at byte `offset` of it, in a pinned buffer valid only during the call.
using StagedConsumer = std::function<Status(size_t index, uint64_t offset, const char* data, uint64_t n)>;

/// The engine and pool a save uses for its device pieces: options.copy_engine, else the CUDA engine (kUnsupported
/// naming libcuda.so.1 without a driver); a pool of max(2, staging_buffers) buffers of staging_buffer_bytes rounded
/// down to a multiple of `granule` (at least one granule, so that segments end on checksum blocks).
struct StagingResources {
  CopyEngine* engine = nullptr;
  std::shared_ptr<PinnedPool> pool;
  /// When waits for copies give up (options.timeout from GetStagingResources): a copy not finished by then is a
  /// kTimeout, and its buffer is quarantined instead of reused.
  Deadline deadline = Deadline::max();
};
Result<StagingResources> GetStagingResources(const SaveOptions& options, uint64_t granule);

/// Runs the pipeline over `copies`, calling (a copy of) `consume` for every segment on `group`; `consume` and
/// everything it refers to must stay valid until group->Wait() returns. First makes the engine's copies
/// wait for each distinct (device, stream)'s queued work. Returns a producer-side error (a copy that could not be
/// started); consumer errors, and copy failures reported by fences (with the copy's `what`), come out of
/// group->Wait(). Stops issuing copies as soon as the group fails. Buffers of segments whose consumer never ran
/// (cancelled) are returned to the pool after their copy has finished; waits end at res.deadline, and a buffer whose
/// copy has not finished by then is quarantined (PinnedPool::Quarantine), never reused.
Status RunStagingPipeline(const StagingResources& res, const std::vector<DeviceCopy>& copies, TaskGroup* group,
                          const StagedConsumer& consume);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_SAVE_STAGING_H_
