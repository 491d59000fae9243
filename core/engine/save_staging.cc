#include "core/engine/save_staging.h"

#include <algorithm>
#include <utility>

namespace distckpt {
namespace {

// A pool buffer holding one segment: waits for its copy (if still in flight, up to the deadline) and goes back to
// the pool when the last reference drops, whether the consumer ran or was skipped after a failure; a buffer whose copy
// did not finish by the deadline is quarantined, since the DMA may still write into it.
class StagedSegment {
 public:
  StagedSegment(std::shared_ptr<PinnedPool> pool, char* buffer, Deadline deadline)
      : pool_(std::move(pool)), buffer_(buffer), deadline_(deadline) {}
  ~StagedSegment() {
    if (fence_ && fence_->WaitUntil(deadline_).code() == StatusCode::kTimeout) {
      pool_->Quarantine(buffer_);
    } else {
      pool_->Release(buffer_);
    }
  }
  StagedSegment(const StagedSegment&) = delete;
  StagedSegment& operator=(const StagedSegment&) = delete;
  char* buffer() const { return buffer_; }
  void set_fence(std::unique_ptr<CopyFence> fence) { fence_ = std::move(fence); }
  Status Wait() { return fence_ ? fence_->WaitUntil(deadline_) : OkStatus(); }

 private:
  std::shared_ptr<PinnedPool> pool_;
  char* buffer_;
  const Deadline deadline_;
  std::unique_ptr<CopyFence> fence_;
};

}  // namespace

Result<StagingResources> GetStagingResources(const SaveOptions& options, uint64_t granule) {
  StagingResources res;
  if (options.copy_engine != nullptr) {
    res.engine = options.copy_engine;
  } else {
    DCKPT_ASSIGN_OR_RETURN(res.engine, DefaultCopyEngine(MemoryKind::kCuda));
  }
  granule = std::max<uint64_t>(granule, 1);
  const uint64_t bytes = std::max<uint64_t>(granule, options.staging_buffer_bytes / granule * granule);
  DCKPT_ASSIGN_OR_RETURN(res.pool, res.engine->StagingPool(bytes, std::max<size_t>(2, options.staging_buffers)));
  res.deadline = DeadlineAfter(options.timeout);
  return res;
}

Status RunStagingPipeline(const StagingResources& res, const std::vector<DeviceCopy>& copies, TaskGroup* group,
                          const StagedConsumer& consume) {
  // The data is ordered on the callers' streams: every copy waits for the work queued there up to now.
  std::vector<MemoryLocation> locations;
  for (const DeviceCopy& c : copies) {
    if (c.size != 0) locations.push_back(c.memory);
  }
  DCKPT_RETURN_IF_ERROR(res.engine->OrderAfterEach(locations));
  PinnedPool* pool = res.pool.get();
  // Tasks may outlive this call (until group->Wait()): they hold their own copies of what they use.
  auto consumer = std::make_shared<StagedConsumer>(consume);
  const uint64_t segment = pool->buffer_bytes();
  auto cancelled = [group] { return group->cancelled() ? Status(StatusCode::kUnknown, "cancelled") : OkStatus(); };
  for (size_t i = 0; i < copies.size(); ++i) {
    const DeviceCopy& c = copies[i];
    for (uint64_t off = 0; off < c.size; off += segment) {
      if (group->cancelled()) return OkStatus();  // the group already holds the error that stopped it
      const uint64_t n = std::min(segment, c.size - off);
      auto buffer = pool->Acquire(cancelled);
      if (!buffer.ok()) {
        if (group->cancelled()) return OkStatus();
        return buffer.status().WithContext(c.what);
      }
      auto staged = std::make_shared<StagedSegment>(res.pool, *buffer, res.deadline);
      auto fence = res.engine->CopyToHostAsync(staged->buffer(), static_cast<const char*>(c.src) + off, n, c.memory);
      if (!fence.ok()) return fence.status().WithContext(c.what + " (" + c.memory.ToString() + ")");
      staged->set_fence(std::move(fence).value());
      group->Run([staged, i, off, n, consumer, what = c.what, where = c.memory.ToString()]() -> Status {
        Status st = staged->Wait();
        if (!st.ok()) {
          return Status(st.code(), what + ": copying bytes " + std::to_string(off) + ".." + std::to_string(off + n) +
                                       " from " + where + " to host failed: " + st.message());
        }
        return (*consumer)(i, off, staged->buffer(), n);
      });
    }
  }
  return OkStatus();
}

}  // namespace distckpt
