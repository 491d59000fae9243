#include "core/cuda/host_copy_engine.h"

#include <cstdlib>
#include <cstring>

namespace distckpt {

struct HostCopyEngine::Job {
  char* dst;
  uint64_t dst_pitch;
  const char* src;
  uint64_t src_pitch;
  uint64_t width;
  uint64_t height;
  uint64_t index;
  MemoryLocation loc;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
};

namespace {

class HostFence final : public CopyFence {
 public:
  explicit HostFence(std::shared_ptr<void> job, std::function<Status(Deadline)> wait)
      : job_(std::move(job)), wait_(std::move(wait)) {}
  Status WaitUntil(Deadline deadline) override { return wait_(deadline); }

 private:
  std::shared_ptr<void> job_;
  std::function<Status(Deadline)> wait_;
};

}  // namespace

HostCopyEngine::HostCopyEngine() : worker_([this] { Loop(); }) {}

HostCopyEngine::~HostCopyEngine() {
  DropStagingPool();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  FreeQuarantined();  // no copy runs any more
}

Result<void*> HostCopyEngine::AllocateHost(size_t bytes) {
  if (host_limit_ != 0 && bytes > host_limit_) {
    return Status(StatusCode::kNoMemory, "cannot page-lock " + std::to_string(bytes) + " bytes (test limit " +
                  std::to_string(host_limit_) + ")");
  }
  const size_t size = (bytes + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, size == 0 ? 4096 : size);
  if (p == nullptr) return Status(StatusCode::kNoMemory, "cannot allocate a staging buffer of " +
                                                         std::to_string(bytes) + " bytes");
  std::lock_guard<std::mutex> lock(mu_);
  ++live_;
  return p;
}

void HostCopyEngine::FreeHost(void* p) {
  if (p == nullptr) return;
  std::free(p);
  std::lock_guard<std::mutex> lock(mu_);
  --live_;
}

Status HostCopyEngine::OrderAfter(const MemoryLocation&) {
  std::lock_guard<std::mutex> lock(mu_);
  ++order_after_;
  return OkStatus();
}

Result<std::unique_ptr<CopyFence>> HostCopyEngine::CopyToHostAsync(void* dst, const void* src, uint64_t n,
                                                                   const MemoryLocation& loc) {
  auto job = std::make_shared<Job>();
  job->dst = static_cast<char*>(dst), job->src = static_cast<const char*>(src);
  job->dst_pitch = job->src_pitch = job->width = n;
  job->height = 1;
  job->loc = loc;
  return Enqueue(std::move(job));
}

Result<std::unique_ptr<CopyFence>> HostCopyEngine::CopyToDeviceAsync(void* dst, uint64_t dst_pitch, const void* src,
                                                                     uint64_t src_pitch, uint64_t width,
                                                                     uint64_t height, const MemoryLocation& loc) {
  if (height > 1 && (dst_pitch < width || src_pitch < width || dst_pitch > kMaxCopyPitch ||
                     src_pitch > kMaxCopyPitch)) {
    return InvalidArgument("strided copy with pitches " + std::to_string(src_pitch) + "/" +
                           std::to_string(dst_pitch) + " for rows of " + std::to_string(width) + " bytes");
  }
  auto job = std::make_shared<Job>();
  job->dst = static_cast<char*>(dst), job->src = static_cast<const char*>(src);
  job->dst_pitch = dst_pitch, job->src_pitch = src_pitch, job->width = width, job->height = height;
  job->loc = loc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++device_copies_;
    device_rows_ += height;
  }
  return Enqueue(std::move(job));
}

Result<void*> HostCopyEngine::AllocateDevice(size_t bytes, int) {
  if (!device_error_.ok()) return device_error_;
  const size_t size = (bytes + 4095) / 4096 * 4096 + 4096;  // the size travels in front of the block
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (device_limit_ != 0 && device_bytes_ + size > device_limit_) {
      return Status(StatusCode::kNoMemory, "out of device memory (test limit of " + std::to_string(device_limit_) +
                                               " bytes)");
    }
    device_bytes_ += size;
    ++live_device_;
  }
  char* p = static_cast<char*>(std::aligned_alloc(4096, size));
  if (p == nullptr) return Status(StatusCode::kNoMemory, "cannot allocate " + std::to_string(bytes) + " bytes");
  std::memcpy(p, &size, sizeof size);
  return static_cast<void*>(p + 4096);
}

Result<CopyEngine::DeviceMemory> HostCopyEngine::DeviceMemoryInfo(int) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reported_) return *reported_;
  const uint64_t total = 80ull << 30;
  return DeviceMemory{device_bytes_ < total ? total - device_bytes_ : 0, total};
}

void HostCopyEngine::FreeDevice(void* p, int) {
  if (p == nullptr) return;
  char* block = static_cast<char*>(p) - 4096;
  size_t size = 0;
  std::memcpy(&size, block, sizeof size);
  std::free(block);
  std::lock_guard<std::mutex> lock(mu_);
  device_bytes_ -= size;
  --live_device_;
}

Result<std::unique_ptr<CopyFence>> HostCopyEngine::CopyOnDeviceAsync(void* dst, const void* src, uint64_t n,
                                                                     const MemoryLocation& loc) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++on_device_copies_;
  }
  return CopyToHostAsync(dst, src, n, loc);
}

Result<std::unique_ptr<CopyFence>> HostCopyEngine::Enqueue(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Internal("copy engine is shutting down");
    job->index = issued_++;
    queue_.push_back(job);
  }
  cv_.notify_all();
  Job* j = job.get();
  return std::unique_ptr<CopyFence>(new HostFence(job, [j](Deadline deadline) {
    std::unique_lock<std::mutex> lock(j->mu);
    const auto start = std::chrono::steady_clock::now();
    if (deadline == Deadline::max()) {
      j->cv.wait(lock, [j] { return j->done; });
    } else if (!j->cv.wait_until(lock, deadline, [j] { return j->done; })) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      return TimeoutError("copy #" + std::to_string(j->index) + " (" + j->loc.ToString() + ") of the host copy engine " +
                          "not finished after waiting " + std::to_string(waited.count()) + " ms");
    }
    return j->status;
  }));
}

void HostCopyEngine::Loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
    }
    Status st = before_copy_ ? before_copy_(job->index) : OkStatus();
    if (st.ok() && job->width != 0) {
      for (uint64_t row = 0; row < job->height; ++row) {
        std::memcpy(job->dst + row * job->dst_pitch, job->src + row * job->src_pitch, job->width);
      }
    }
    {
      std::lock_guard<std::mutex> lock(job->mu);
      job->status = st;
      job->done = true;
    }
    job->cv.notify_all();
  }
}

uint64_t HostCopyEngine::copies_issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return issued_;
}
uint64_t HostCopyEngine::order_after_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_after_;
}
uint64_t HostCopyEngine::device_copies_issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_copies_;
}
uint64_t HostCopyEngine::device_rows_copied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_rows_;
}
int64_t HostCopyEngine::live_device_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_device_;
}
uint64_t HostCopyEngine::on_device_copies_issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return on_device_copies_;
}
int64_t HostCopyEngine::live_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

}  // namespace distckpt
