#include "core/engine/load_staging.h"

#include <algorithm>


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

Result<std::unique_ptr<LoadStaging>> LoadStaging::Create(CopyEngine* engine, uint64_t buffer_bytes, size_t count) {
  if (engine == nullptr) {
    DCKPT_ASSIGN_OR_RETURN(engine, DefaultCopyEngine(MemoryKind::kCuda));
  }
  // With the defaults, the pool a save uses (same shape, so loads and saves share it instead of replacing each
  // other's).
  DCKPT_ASSIGN_OR_RETURN(std::shared_ptr<PinnedPool> pool,
                         engine->StagingPool(std::max<uint64_t>(buffer_bytes, 1), std::max<size_t>(count, 2)));
  return std::unique_ptr<LoadStaging>(new LoadStaging(engine, std::move(pool)));
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
    auto fence = engine_->CopyToDeviceAsync(c.dst, c.dst_pitch, base + c.src, c.src_pitch, c.width, c.rows, loc);
    if (!fence.ok()) {
      for (auto& f : *fences) (void)f->Wait();  // the source must outlive the copies already issued
      return fence.status();
    }
    fences->push_back(std::move(fence).value());
  }
  return OkStatus();
}

Status LoadStaging::Submit(char* buffer, const std::vector<DeviceRuns>& groups,
                           std::function<Status(const Status&)> context) {
  std::vector<std::unique_ptr<CopyFence>> fences;
  for (const DeviceRuns& g : groups) {
    if (Status st = Issue(buffer, g.runs, g.loc, &fences); !st.ok()) {
      pool_->Release(buffer);
      st = context(st);
      Fail(st);
      return st;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(InFlight{buffer, std::move(fences), std::move(context)});
    if (!retirer_.joinable()) retirer_ = std::thread([this] { Retire(); });
  }
  cv_.notify_all();
  return OkStatus();
}

Status LoadStaging::CopyNow(const char* src, const std::vector<DeviceRun>& runs, const MemoryLocation& loc) {
  std::vector<std::unique_ptr<CopyFence>> fences;
  DCKPT_RETURN_IF_ERROR(Issue(src, runs, loc, &fences));
  Status st;
  for (auto& f : fences) {
    Status one = f->Wait();
    if (st.ok()) st = one;
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
    Status st;
    for (auto& f : item.fences) {
      Status one = f->Wait();
      if (st.ok() && !one.ok()) st = item.context(one);
    }
    item.fences.clear();
    pool_->Release(item.buffer);
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
