// A CopyEngine for host memory: copies run in issue order on one worker thread (as copies on a CUDA copy stream do),
// and each fence completes when its copy has. It stands in for the CUDA engine in tests (pieces marked as device
// memory but held in host memory run through exactly the save pipeline a GPU would), with hooks to delay, observe and
// fail chosen copies.
#ifndef DISTCKPT_CORE_CUDA_HOST_COPY_ENGINE_H_
#define DISTCKPT_CORE_CUDA_HOST_COPY_ENGINE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <thread>

#include "core/cuda/copy_engine.h"

namespace distckpt {

class HostCopyEngine final : public CopyEngine {
 public:
  HostCopyEngine();
  ~HostCopyEngine() override;  ///< Finishes the queued copies, then joins the worker.

  std::string name() const override { return "host"; }
  Result<void*> AllocateHost(size_t bytes) override;
  void FreeHost(void* p) override;
  Status OrderAfter(const MemoryLocation& loc) override;
  Result<std::unique_ptr<CopyFence>> CopyToHostAsync(void* dst, const void* src, uint64_t n,
                                                     const MemoryLocation& loc) override;
  Result<std::unique_ptr<CopyFence>> CopyToDeviceAsync(void* dst, uint64_t dst_pitch, const void* src,
                                                       uint64_t src_pitch, uint64_t width, uint64_t height,
                                                       const MemoryLocation& loc) override;
  Result<void*> AllocateDevice(size_t bytes, int device) override;
  void FreeDevice(void* p, int device) override;
  /// 80 GiB total, less what is allocated, unless set_device_memory_info says otherwise (the limit below is what
  /// AllocateDevice enforces, as a driver's out-of-memory).
  Result<DeviceMemory> DeviceMemoryInfo(int device) override;
  Result<std::unique_ptr<CopyFence>> CopyOnDeviceAsync(void* dst, const void* src, uint64_t n,
                                                       const MemoryLocation& loc) override;

  // ---- Test hooks (set before use) ----
  /// Called on the worker thread before copy number `index` (0-based, in issue order) runs; a non-OK status fails
  /// that copy (its fence reports it) without copying.
  void set_before_copy(std::function<Status(uint64_t index)> hook) { before_copy_ = std::move(hook); }
  /// Copies issued (both directions) and OrderAfter calls so far.
  uint64_t copies_issued() const;
  /// Copies to "device" memory issued so far, and the rows they moved (a strided copy of 8 rows counts 1 and 8).
  uint64_t device_copies_issued() const;
  uint64_t device_rows_copied() const;
  uint64_t order_after_calls() const;
  /// Host allocations currently live (staging buffers).
  int64_t live_allocations() const;
  /// "Device" allocations currently live (snapshots), and copies within a device issued so far.
  int64_t live_device_allocations() const;
  uint64_t on_device_copies_issued() const;
  /// Makes AllocateDevice fail with kNoMemory once this many bytes are live (0: no limit).
  void set_device_memory_limit(uint64_t bytes) { device_limit_ = bytes; }
  /// What DeviceMemoryInfo reports from now on (a device that training has mostly filled).
  void set_device_memory_info(uint64_t free, uint64_t total) {
    std::lock_guard<std::mutex> lock(mu_);
    reported_ = DeviceMemory{free, total};
  }
  /// Makes every AllocateDevice fail with `error` (OK: no failure), as a driver error other than out of memory.
  void set_device_allocation_error(Status error) { device_error_ = std::move(error); }
  /// Makes AllocateHost fail with kNoMemory for a request of more than this many bytes (0: no limit), as
  /// cuMemHostAlloc does when the host cannot page-lock that much.
  void set_host_allocation_limit(uint64_t bytes) { host_limit_ = bytes; }

 private:
  struct Job;
  void Loop();
  Result<std::unique_ptr<CopyFence>> Enqueue(std::shared_ptr<Job> job);
  std::function<Status(uint64_t)> before_copy_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  uint64_t issued_ = 0;
  uint64_t order_after_ = 0;
  uint64_t device_copies_ = 0;
  uint64_t device_rows_ = 0;
  int64_t live_ = 0;
  int64_t live_device_ = 0;
  uint64_t host_limit_ = 0;
  Status device_error_;
  uint64_t device_bytes_ = 0;
  uint64_t device_limit_ = 0;
  std::optional<DeviceMemory> reported_;
  uint64_t on_device_copies_ = 0;
  std::thread worker_;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_CUDA_HOST_COPY_ENGINE_H_
