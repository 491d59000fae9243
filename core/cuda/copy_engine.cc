#include "core/cuda/copy_engine.h"

#include <algorithm>
#include <cstdlib>

#include "core/cuda/cuda_copy_engine.h"
#include "core/cuda/host_copy_engine.h"
#include "core/cuda/pinned_pool.h"

namespace distckpt {

CopyEngine::~CopyEngine() = default;

Deadline DeadlineAfter(std::chrono::milliseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  // Past ~100 years the sum could overflow the clock's representation: no deadline.
  if (timeout >= std::chrono::hours(24 * 365 * 100)) return Deadline::max();
  return now + std::max(timeout, std::chrono::milliseconds(0));
}

void CopyEngine::Quarantine(void* p, int device) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(quarantine_mu_);
  quarantined_.emplace_back(p, device);
}

size_t CopyEngine::quarantined() const {
  std::lock_guard<std::mutex> lock(quarantine_mu_);
  return quarantined_.size();
}

void CopyEngine::FreeQuarantined() {
  std::vector<std::pair<void*, int>> held;
  {
    std::lock_guard<std::mutex> lock(quarantine_mu_);
    held.swap(quarantined_);
  }
  for (const auto& [p, device] : held) {
    if (device < 0) {
      FreeHost(p);
    } else {
      FreeDevice(p, device);
    }
  }
}

void CopyEngine::DropStagingPool() {
  std::lock_guard<std::mutex> lock(pool_mu_);
  pool_.reset();
}

Status CopyEngine::OrderAfterEach(const std::vector<MemoryLocation>& locations) {
  std::vector<std::pair<int, void*>> done;
  for (const MemoryLocation& loc : locations) {
    const std::pair<int, void*> key(loc.device, loc.stream);
    if (loc.is_host() || loc.ready || std::find(done.begin(), done.end(), key) != done.end()) continue;
    done.push_back(key);
    Status st = OrderAfter(loc);
    if (!st.ok()) return st.WithContext("ordering copies of " + loc.ToString() + " after its stream");
  }
  return OkStatus();
}

Result<std::shared_ptr<PinnedPool>> CopyEngine::StagingPool(size_t buffer_bytes, size_t count) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (!pool_ || pool_->buffer_bytes() != buffer_bytes || pool_->count() != count) {
    pool_ = std::make_shared<PinnedPool>(this, buffer_bytes, count);
  }
  return pool_;
}

bool CudaEmulatedOnHost() {
  static const bool on = [] {
    const char* env = std::getenv("DCKPT_TEST_CUDA_ON_HOST");
    return env != nullptr && std::string(env) == "1";
  }();
  return on;
}

Result<CopyEngine*> DefaultCopyEngine(MemoryKind kind) {
  if (kind == MemoryKind::kCuda && CudaEmulatedOnHost()) kind = MemoryKind::kHost;
  switch (kind) {
    case MemoryKind::kHost: {
      static HostCopyEngine* const host = new HostCopyEngine();
      return static_cast<CopyEngine*>(host);
    }
    case MemoryKind::kCuda: {
      DCKPT_ASSIGN_OR_RETURN(CudaCopyEngine * engine, CudaCopyEngine::Get());
      return static_cast<CopyEngine*>(engine);
    }
  }
  return InvalidArgument("unknown memory kind " + std::to_string(static_cast<int>(kind)));
}

Status CheckDeviceBuffer(const MemoryLocation& loc, const void* data, uint64_t bytes) {
  if (loc.is_host()) return OkStatus();
  if (loc.kind != MemoryKind::kCuda) {
    return InvalidArgument("unknown memory kind " + std::to_string(static_cast<int>(loc.kind)));
  }
  if (CudaEmulatedOnHost()) return OkStatus();
  DCKPT_ASSIGN_OR_RETURN(CudaCopyEngine * engine, CudaCopyEngine::Get());
  return engine->CheckDeviceBuffer(loc, data, bytes);
}

Status ResolveDeviceBuffer(MemoryLocation* loc, const void* data, uint64_t bytes) {
  if (loc->kind == MemoryKind::kCuda && loc->device == kDeviceOfPointer) {
    if (CudaEmulatedOnHost()) {
      loc->device = 0;
    } else {
      DCKPT_ASSIGN_OR_RETURN(CudaCopyEngine * engine, CudaCopyEngine::Get());
      DCKPT_ASSIGN_OR_RETURN(loc->device, engine->DeviceOf(data));
    }
  }
  return CheckDeviceBuffer(*loc, data, bytes);
}

}  // namespace distckpt
