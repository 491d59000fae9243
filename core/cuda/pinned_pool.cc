#include "core/cuda/pinned_pool.h"

#include <algorithm>
#include <cassert>
#include <chrono>

#include "core/cuda/copy_engine.h"

namespace distckpt {

PinnedPool::PinnedPool(CopyEngine* engine, size_t buffer_bytes, size_t count)
    : engine_(engine), buffer_bytes_(std::max<size_t>(buffer_bytes, 1)), count_(std::max<size_t>(count, 1)) {}

PinnedPool::~PinnedPool() {
  assert(in_use_ == 0 && "a staging buffer outlived its pool");
  for (char* b : all_) engine_->FreeHost(b);
}

Result<char*> PinnedPool::Acquire(const std::function<Status()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  bool waited = false;
  while (free_.empty() && all_.size() >= count_) {
    if (!waited) ++waits_, waited = true;
    if (cancelled) {
      Status st = cancelled();
      if (!st.ok()) return st;
    }
    cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
  char* b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    // Reserve the slot, then allocate outside the lock (pinned allocations take milliseconds).
    all_.push_back(nullptr);
    lock.unlock();
    auto p = engine_->AllocateHost(buffer_bytes_);
    lock.lock();
    auto slot = std::find(all_.begin(), all_.end(), nullptr);
    if (!p.ok()) {
      all_.erase(slot);
      cv_.notify_one();
      return p.status();
    }
    b = static_cast<char*>(*p);
    *slot = b;
  }
  max_in_use_ = std::max(max_in_use_, ++in_use_);
  return b;
}

void PinnedPool::Release(char* buffer) {
  if (buffer == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(buffer);
    --in_use_;
  }
  cv_.notify_one();
}

void PinnedPool::Quarantine(char* buffer) {
  if (buffer == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(all_.begin(), all_.end(), buffer);
    if (it != all_.end()) all_.erase(it);  // not freed with the pool: a DMA may still land in it
    --in_use_;
    ++quarantined_;
  }
  engine_->Quarantine(buffer, -1);
  cv_.notify_one();
}

size_t PinnedPool::quarantined() const {
  std::lock_guard<std::mutex> lock(mu_);
  return quarantined_;
}

size_t PinnedPool::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<size_t>(std::count_if(all_.begin(), all_.end(), [](char* b) { return b != nullptr; }));
}
size_t PinnedPool::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}
size_t PinnedPool::max_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_in_use_;
}
uint64_t PinnedPool::waits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waits_;
}

}  // namespace distckpt
