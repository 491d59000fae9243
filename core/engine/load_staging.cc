#include "core/engine/load_staging.h"

#include <algorithm>
#include <cstring>

namespace distckpt {

std::vector<StridedCopy> BatchRuns(const std::vector<DeviceRun>& runs) {
  std::vector<StridedCopy> out;
  for (const DeviceRun& r : runs) {
    if (r.n == 0) continue;
    if (!out.empty()) {
      StridedCopy& c = out.back();
      if (c.width == r.n && r.src > c.src && r.dst > c.dst) {
        const uint64_t ds = r.src - c.src;
        const uint64_t dd = static_cast<uint64_t>(r.dst - c.dst);
        if (c.rows == 1 && ds >= r.n && dd >= r.n && ds <= CopyEngine::kMaxCopyPitch &&
            dd <= CopyEngine::kMaxCopyPitch) {
          c.src_pitch = ds, c.dst_pitch = dd, c.rows = 2;
          continue;
        }
        if (c.rows > 1 && ds == c.rows * c.src_pitch && dd == c.rows * c.dst_pitch) {
          ++c.rows;
          continue;
        }
      }
    }
    out.push_back(StridedCopy{r.src, r.dst, r.n, 1, 0, 0});
  }
  return out;
}

Result<std::unique_ptr<LoadStaging>> LoadStaging::Create(CopyEngine* engine, uint64_t buffer_bytes, size_t count,
                                                         Deadline deadline) {
  if (engine == nullptr) {
    DCKPT_ASSIGN_OR_RETURN(engine, DefaultCopyEngine(MemoryKind::kCuda));
  }
  // With the defaults, the pool a save uses (same shape, so loads and saves share it instead of replacing each
  // other's).
  DCKPT_ASSIGN_OR_RETURN(std::shared_ptr<PinnedPool> pool,
                         engine->StagingPool(std::max<uint64_t>(buffer_bytes, 1), std::max<size_t>(count, 2)));
  return std::unique_ptr<LoadStaging>(new LoadStaging(engine, std::move(pool), deadline));
}

LoadStaging::~LoadStaging() { (void)Drain(); }

void LoadStaging::Fail(const Status& st) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.ok()) failure_ = st;
}

Result<char*> LoadStaging::Acquire() {
  return pool_->Acquire([this] {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  });
}

void LoadStaging::Release(char* buffer) { pool_->Release(buffer); }

Status LoadStaging::Issue(const char* base, const std::vector<DeviceRun>& runs, const MemoryLocation& loc,
                          std::vector<std::unique_ptr<CopyFence>>* fences) {
  for (const StridedCopy& c : BatchRuns(runs)) {
    DCKPT_ASSIGN_OR_RETURN(
        std::unique_ptr<CopyFence> fence,
        engine_->CopyToDeviceAsync(c.dst, c.dst_pitch, base + c.src, c.src_pitch, c.width, c.rows, loc));
    fences->push_back(std::move(fence));
  }
  return OkStatus();
}

Status LoadStaging::Submit(char* buffer, const std::vector<DeviceRuns>& groups,
                           std::function<Status(const Status&)> context) {
  std::vector<std::unique_ptr<CopyFence>> fences;
  Status issued;
  for (const DeviceRuns& g : groups) {
    issued = Issue(buffer, g.runs, g.loc, &fences);
    if (!issued.ok()) break;
  }
  if (!issued.ok()) {
    issued = context(issued);
    Fail(issued);
  }
  // Even after a failure: the retiring thread returns the buffer once the copies already issued from it are done.
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(InFlight{buffer, std::move(fences), std::move(context)});
    if (!retirer_.joinable()) retirer_ = std::thread([this] { Retire(); });
  }
  cv_.notify_all();
  return issued;
}

Status LoadStaging::CopyNow(const char* src, const std::vector<DeviceRun>& runs, const MemoryLocation& loc) {
  // Through page-locked buffers: the driver copies pageable memory synchronously after waiting for the stream (a wait
  // with no deadline), and `src` is only lent for this call, while a copy that times out may still run later.
  const uint64_t cap = pool_->buffer_bytes();
  size_t i = 0;
  uint64_t done = 0;  // bytes of runs[i] already placed
  while (i < runs.size()) {
    DCKPT_ASSIGN_OR_RETURN(char* buffer, Acquire());
    std::vector<DeviceRun> batch;
    uint64_t used = 0;
    while (i < runs.size() && used < cap) {
      const DeviceRun& r = runs[i];
      const uint64_t n = std::min(r.n - done, cap - used);
      std::memcpy(buffer + used, src + r.src + done, n);
      batch.push_back(DeviceRun{used, r.dst + done, n});
      used += n;
      done += n;
      if (done == r.n) ++i, done = 0;
    }
    std::vector<std::unique_ptr<CopyFence>> fences;
    const Status issued = Issue(buffer, batch, loc, &fences);
    const Status landed = WaitAndRetire(buffer, &fences, [](const Status& one) { return one; });
    DCKPT_RETURN_IF_ERROR(issued);
    DCKPT_RETURN_IF_ERROR(landed);
  }
  return OkStatus();
}

Status LoadStaging::WaitAndRetire(char* buffer, std::vector<std::unique_ptr<CopyFence>>* fences,
                                  const std::function<Status(const Status&)>& context) {
  Status st;
  bool stuck = false;  // a copy from the buffer may still run: never reuse it
  for (auto& f : *fences) {
    Status one = f->WaitUntil(deadline_);
    stuck = stuck || one.code() == StatusCode::kTimeout;
    if (st.ok() && !one.ok()) st = context(one);
  }
  fences->clear();
  if (stuck) {
    pool_->Quarantine(buffer);
  } else {
    pool_->Release(buffer);
  }
  return st;
}

void LoadStaging::Retire() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    InFlight item = std::move(queue_.front());
    queue_.pop_front();
    retiring_ = true;
    lock.unlock();
    Status st = WaitAndRetire(item.buffer, &item.fences, item.context);
    lock.lock();
    if (!st.ok() && failure_.ok()) failure_ = st;
    retiring_ = false;
    cv_.notify_all();
  }
}

Status LoadStaging::Drain() {
  std::thread retirer;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return queue_.empty() && !retiring_; });
    stop_ = true;
    retirer = std::move(retirer_);
  }
  cv_.notify_all();
  if (retirer.joinable()) retirer.join();
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = false;  // the object may be used again (another pass over the same batch)
  return failure_;
}

}  // namespace distckpt
