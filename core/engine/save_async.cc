#include "core/engine/save_async.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "core/base/stream_copy.h"
#include "core/base/thread_pool.h"
#include "core/engine/save_staging.h"

namespace distckpt {
namespace {

// Pieces are laid out in the owned buffer on this boundary (cache lines; also keeps O_DIRECT a possibility).
constexpr uint64_t kStagingAlignment = 4096;
// A device snapshot leaves at least this much of the device free for training: 1/16 of it, and at least 512 MiB.
constexpr uint64_t kSnapshotHeadroomFraction = 16;
constexpr uint64_t kSnapshotHeadroomMin = 512ull << 20;
// Copies larger than this are split across threads.
constexpr uint64_t kCopySliceBytes = 16ull << 20;

uint64_t AlignUp(uint64_t x) { return (x + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment; }

// The buffers of the last finished asynchronous save are kept (one per kind of memory, per process) and reused by the
// next save that fits in them. The copy is the only part of an async save the caller waits for, and into fresh memory
// most of it is page faults: on the bench machine (bench/NOTES.md) copying 0.9 GB per rank into fresh memory took
// ~2-4 s against ~0.3 s into memory already faulted in. Reuse is the steady state of a training loop, which saves the
// same state every N steps. A buffer more than twice the size needed is not reused (it is freed instead), so a kept
// buffer is never much more than one state's worth. Two kinds: pageable host memory for host data, and page-locked
// memory of the copy engine for device pieces, which are copied straight into it with one D2H copy each (through the
// bounded staging pool and a host memcpy they ran at 0.62x a pinned cudaMemcpy on an H100,
// bench/results/2026-11-26-gpu-h100.md; page-locking gigabytes costs about as much as faulting them in).
struct KeptBuffer {
  std::mutex mu;
  char* buffer = nullptr;
  uint64_t size = 0;
  CopyEngine* engine = nullptr;  // whose page-locked memory `buffer` is; null: pageable host memory
};
KeptBuffer& KeptHost() {
  static KeptBuffer* const kept = new KeptBuffer();  // never destroyed: futures may outlive static destructors
  return *kept;
}
KeptBuffer& KeptPinned() {
  static KeptBuffer* const kept = new KeptBuffer();
  return *kept;
}

void FreeBuffer(CopyEngine* engine, char* p) {
  if (engine != nullptr) {
    engine->FreeHost(p);
  } else {
    std::free(p);
  }
}

// At least `total` bytes: pageable host memory (engine null) or `engine`'s page-locked memory, from `kept` when its
// buffer fits; null when that much cannot be had. Released, the larger of it and the kept buffer is kept and the other
// freed; a buffer that is not `poolable` (of a caller's own engine, which may not outlive the pool) is just freed, and
// page-locked memory is quarantined in its engine instead once `stuck` is set (a copy into it timed out).
std::shared_ptr<char> AcquireKept(KeptBuffer& kept, CopyEngine* engine, uint64_t total, bool poolable,
                                  std::shared_ptr<std::atomic<bool>> stuck = nullptr) {
  uint64_t size = std::max<uint64_t>(AlignUp(total), kStagingAlignment);
  char* out = nullptr;
  if (poolable) {
    CopyEngine* unfit_engine = nullptr;
    char* unfit = nullptr;
    {
      std::lock_guard<std::mutex> lock(kept.mu);
      if (kept.buffer != nullptr && kept.engine == engine && kept.size >= size && kept.size / 2 <= size) {
        out = kept.buffer;
        size = kept.size;
      } else {
        unfit = kept.buffer;
        unfit_engine = kept.engine;
      }
      kept.buffer = nullptr;
      kept.engine = nullptr;
      kept.size = 0;
    }
    if (unfit != nullptr) FreeBuffer(unfit_engine, unfit);
  }
  if (out == nullptr) {
    if (engine != nullptr) {
      auto mem = engine->AllocateHost(size);
      if (!mem.ok()) return nullptr;
      out = static_cast<char*>(*mem);
    } else {
      out = static_cast<char*>(std::aligned_alloc(kStagingAlignment, size));
      if (out == nullptr) return nullptr;
    }
  }
  return std::shared_ptr<char>(out, [&kept, engine, size, poolable, stuck](char* p) {
    if (stuck != nullptr && *stuck && engine != nullptr) {  // a copy into it timed out and may still land
      engine->Quarantine(p, -1);
      return;
    }
    char* drop = p;
    CopyEngine* drop_engine = engine;
    if (poolable) {
      std::lock_guard<std::mutex> lock(kept.mu);
      if (size > kept.size) {
        std::swap(drop, kept.buffer);
        std::swap(drop_engine, kept.engine);
        kept.size = size;
      }
    }
    if (drop != nullptr) FreeBuffer(drop_engine, drop);
  });
}

// Waits at least this long are waits without a deadline: wait_for converts to nanoseconds past now, which overflows
// past ~292 years (UBSan caught dckpt_save_future_wait(DCKPT_WAIT_FOREVER), capped to 2^53 ms, doing so).
constexpr std::chrono::milliseconds kWaitForever = std::chrono::hours(24 * 365 * 100);

// The host memory held by the staging of unfinished asynchronous saves, for SaveOptions::max_async_staging_bytes.
struct StagingBudget {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t in_use = 0;
};
StagingBudget& Budget() {
  static StagingBudget* const budget = new StagingBudget();  // never destroyed, as the pool
  return *budget;
}

// Takes `bytes` of the budget, waiting while other saves hold some and `bytes` more would go past `cap`.
Status ReserveStaging(uint64_t bytes, uint64_t cap, std::chrono::milliseconds timeout, const std::string& where) {
  StagingBudget& b = Budget();
  std::unique_lock<std::mutex> lock(b.mu);
  auto fits = [&] { return b.in_use == 0 || b.in_use + bytes <= cap; };
  if (cap != 0 && timeout >= kWaitForever) {
    b.cv.wait(lock, fits);
  } else if (cap != 0 && !b.cv.wait_for(lock, timeout, fits)) {
    return TimeoutError(where + ": waited " + std::to_string(timeout.count()) + " ms for earlier asynchronous saves " +
                        "to release their staging (" + std::to_string(b.in_use) + " bytes held, " +
                        std::to_string(bytes) + " more needed, cap " + std::to_string(cap) +
                        "): wait for them, or raise max_async_staging_bytes");
  }
  b.in_use += bytes;
  return OkStatus();
}

void ReleaseBudget(uint64_t bytes) {
  if (bytes == 0) return;
  StagingBudget& b = Budget();
  {
    std::lock_guard<std::mutex> lock(b.mu);
    b.in_use -= bytes;
  }
  b.cv.notify_all();
}

// Copies that must have finished before Stage returns, whatever happens (the caller reuses its memory, and the
// destinations belong to the future): WaitAll() waits for every one up to the deadline and reports the first failure
// with its copy's description; the destructor waits for any left. When one has not finished by the deadline, `stuck`
// runs once (the memory those copies use must be set aside).
class PendingCopies {
 public:
  PendingCopies(Deadline deadline, std::function<void()> stuck) : deadline_(deadline), stuck_(std::move(stuck)) {}
  PendingCopies(const PendingCopies&) = delete;
  PendingCopies& operator=(const PendingCopies&) = delete;
  ~PendingCopies() { (void)WaitAll(); }
  void Add(std::unique_ptr<CopyFence> fence, std::string what) {
    fences_.emplace_back(std::move(fence), std::move(what));
  }
  Status WaitAll() {
    Status st;
    bool stuck = false;
    for (auto& [fence, what] : fences_) {
      Status one = fence->WaitUntil(deadline_);
      stuck = stuck || one.code() == StatusCode::kTimeout;
      if (st.ok() && !one.ok()) st = one.WithContext(what);
    }
    fences_.clear();
    if (stuck && stuck_) std::exchange(stuck_, nullptr)();
    return st;
  }

 private:
  const Deadline deadline_;
  std::function<void()> stuck_;
  std::vector<std::pair<std::unique_ptr<CopyFence>, std::string>> fences_;
};

}  // namespace

SaveFuture::~SaveFuture() {
  if (thread_.joinable()) thread_.join();
  ReleaseBudget(reserved_);  // a save that failed before its thread started
  FreeSnapshots();
}

void SaveFuture::FreeSnapshots() {
  // After a timeout a copy from (or into) the arenas may still run: they are left allocated, never reused.
  for (const Arena& a : arenas_) {
    if (snapshots_stuck_) {
      snapshot_engine_->Quarantine(a.data, a.device);
    } else {
      snapshot_engine_->FreeDevice(a.data, a.device);
    }
  }
  arenas_.clear();
  snapshots_.clear();
}

Result<CopyEngine*> SaveFuture::AllocateSnapshots(const State& state, const SaveOptions& options) {
  if (!options.device_snapshot) return nullptr;
  // One arena per device for all of its pieces (256-byte aligned, as cuMemAlloc's own blocks): one allocation and
  // one free per device and save instead of one per tensor, each of which may synchronize the device behind training.
  constexpr uint64_t kAlign = 256;
  auto align = [](uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; };
  CopyEngine* engine = options.copy_engine;
  std::map<int, uint64_t> need;  // device -> arena bytes
  std::string first;             // the first device piece, for errors
  for (const TensorEntry& t : state.tensors()) {
    for (const TensorPiece& p : t.pieces) {
      const uint64_t n = p.box.volume() * DTypeSize(t.dtype);
      if (p.memory.is_host() || n == 0) continue;
      if (engine == nullptr) {
        auto cuda = DefaultCopyEngine(MemoryKind::kCuda);
        if (!cuda.ok()) return cuda.status().WithContext("tensor '" + t.name + "' piece " + p.box.ToString());
        engine = *cuda;
      }
      if (first.empty()) first = "tensor '" + t.name + "' piece " + p.box.ToString();
      need[p.memory.device] = align(need[p.memory.device]) + n;
    }
  }
  if (need.empty()) return nullptr;
  snapshot_engine_ = engine;
  std::map<int, char*> base;
  for (const auto& [device, bytes] : need) {
    // Only where it leaves training room: the free memory the driver reports (a framework's cached blocks are not
    // free) less kSnapshotHeadroom of the device, so the next step's allocations still fit. Otherwise, or out of
    // device memory, that device's pieces are staged in host memory as without the option, and the future says how
    // many bytes (snapshot_fallback_bytes). Any other failure is an error, not a silent fallback.
    auto info = engine->DeviceMemoryInfo(device);
    if (!info.ok()) return info.status().WithContext("snapshotting cuda:" + std::to_string(device) + " for " + first);
    const uint64_t headroom = std::max<uint64_t>(info->total / kSnapshotHeadroomFraction, kSnapshotHeadroomMin);
    if (info->free < headroom || bytes > info->free - headroom) {
      snapshot_fallback_bytes_ += bytes;
      continue;
    }
    auto mem = engine->AllocateDevice(bytes, device);
    if (!mem.ok()) {
      if (mem.status().code() == StatusCode::kNoMemory) {
        snapshot_fallback_bytes_ += bytes;
        continue;
      }
      return mem.status().WithContext("snapshotting cuda:" + std::to_string(device) + " for " + first);
    }
    arenas_.push_back(Arena{*mem, device});
    base[device] = static_cast<char*>(*mem);
  }
  std::map<int, uint64_t> at;
  for (const TensorEntry& t : state.tensors()) {
    for (const TensorPiece& p : t.pieces) {
      const uint64_t n = p.box.volume() * DTypeSize(t.dtype);
      if (p.memory.is_host() || n == 0 || base.count(p.memory.device) == 0) continue;
      uint64_t& off = at[p.memory.device];
      off = align(off);
      snapshots_.push_back(Snapshot{&p, base[p.memory.device] + off, n, p.memory.device});
      off += n;
      snapshot_bytes_ += n;
    }
  }
  return snapshots_.empty() ? nullptr : engine;
}

bool SaveFuture::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_.has_value();
}

Result<SaveSummary> SaveFuture::Wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto finished = [this] { return result_.has_value(); };
  if (timeout >= kWaitForever) {
    cv_.wait(lock, finished);
  } else if (!cv_.wait_for(lock, timeout, finished)) {
    return TimeoutError("the asynchronous save is still running after " + std::to_string(timeout.count()) + " ms");
  }
  return *result_;
}

Status SaveFuture::Stage(const std::string& path, const State& state, const SaveOptions& options) {
  // Device pieces snapshotted on the device (device_snapshot) need no host staging; the snapshot copies run first,
  // on the copy engine, while the host part is copied below.
  DCKPT_ASSIGN_OR_RETURN(CopyEngine * snapshot_engine, AllocateSnapshots(state, options));
  // Whatever happens below, the snapshot copies finish before this returns (the caller may then reuse its memory), or
  // the deadline passes: then the snapshot memory is set aside, since they may still write it.
  const Deadline deadline = DeadlineAfter(options.timeout);
  PendingCopies snapshot_copies(deadline, [this] { snapshots_stuck_ = true; });
  std::unordered_map<const TensorPiece*, const Snapshot*> snapshot_index;  // thousands of small tensors: no scans
  for (const Snapshot& s : snapshots_) snapshot_index.emplace(s.piece, &s);
  auto snapshot_of = [&snapshot_index](const TensorPiece* p) -> const Snapshot* {
    auto it = snapshot_index.find(p);
    return it == snapshot_index.end() ? nullptr : it->second;
  };
  const std::string snapshotting = "saving '" + path + "' (snapshotting device memory)";
  if (snapshot_engine != nullptr) {
    std::vector<MemoryLocation> locations;
    for (const Snapshot& s : snapshots_) locations.push_back(s.piece->memory);
    DCKPT_RETURN_IF_ERROR(snapshot_engine->OrderAfterEach(locations));
    for (const Snapshot& s : snapshots_) {
      const MemoryLocation& loc = s.piece->memory;
      auto fence = snapshot_engine->CopyOnDeviceAsync(s.data, s.piece->data, s.size, loc);
      if (!fence.ok()) {
        return fence.status().WithContext("saving '" + path + "' (snapshotting " + loc.ToString() + " memory)");
      }
      snapshot_copies.Add(std::move(fence).value(), snapshotting);
    }
  }

  // Host pieces and bytes entries are laid out in one host buffer; device pieces in one pinned buffer (AcquireKept),
  // or, where that cannot be had, after them in the host buffer, reached through the staging pipeline. Each is one
  // allocation, reused by nothing else, freed with the future (back to its pool).
  uint64_t host_total = 0;
  uint64_t device_total = 0;
  const TensorPiece* first_device = nullptr;
  std::string first_device_name;
  for (const TensorEntry& t : state.tensors()) {
    for (const TensorPiece& p : t.pieces) {
      if (snapshot_of(&p) != nullptr) continue;
      const uint64_t n = p.box.volume() * DTypeSize(t.dtype);
      if (!p.memory.is_host() && n != 0) {
        device_total = AlignUp(device_total) + n;
        if (first_device == nullptr) {
          first_device = &p;
          first_device_name = t.name;
        }
      } else {
        host_total = AlignUp(host_total) + n;
      }
    }
  }
  for (const BytesEntry& b : state.bytes()) host_total = AlignUp(host_total) + b.size;
  const uint64_t total = device_total != 0 ? AlignUp(host_total) + device_total : host_total;
  DCKPT_RETURN_IF_ERROR(
      ReserveStaging(total, options.max_async_staging_bytes, options.timeout, "saving '" + path + "' asynchronously"));
  reserved_ = total;
  CopyEngine* engine = nullptr;
  auto pinned_stuck = std::make_shared<std::atomic<bool>>(false);
  if (device_total != 0) {
    if (options.copy_engine != nullptr) {
      engine = options.copy_engine;
    } else {
      auto cuda = DefaultCopyEngine(MemoryKind::kCuda);
      if (!cuda.ok()) {
        return cuda.status().WithContext("tensor '" + first_device_name + "' piece " + first_device->box.ToString());
      }
      engine = *cuda;
    }
    pinned_ =
        AcquireKept(KeptPinned(), engine, device_total, /*poolable=*/options.copy_engine == nullptr, pinned_stuck);
  }
  const uint64_t host_size = pinned_ != nullptr ? host_total : total;
  buffer_ = AcquireKept(KeptHost(), nullptr, host_size, /*poolable=*/true);
  if (buffer_ == nullptr) {
    return Status(StatusCode::kNoMemory,
                  "saving '" + path + "': cannot allocate " + std::to_string(host_size) + " bytes to stage the state");
  }
  char* const buffer = buffer_.get();

  struct Copy {
    char* to;
    const char* from;
    uint64_t n;
  };
  std::vector<Copy> copies;
  // Device pieces into the pinned buffer: one copy each (direct[k] lands at direct_dst[k]). Without one, through the
  // staging pipeline: D2H into the bounded pinned pool, then a memcpy into place (device_dst[k] is where
  // device_copies[k] goes).
  std::vector<DeviceCopy> direct;
  std::vector<char*> direct_dst;
  std::vector<DeviceCopy> device_copies;
  std::vector<char*> device_dst;
  uint64_t at = 0;
  uint64_t device_at = pinned_ != nullptr ? 0 : AlignUp(host_total);
  char* const device_base = pinned_ != nullptr ? pinned_.get() : buffer;
  for (const TensorEntry& t : state.tensors()) {
    DCKPT_RETURN_IF_ERROR(owned_.AddTensor(t.name, t.dtype, t.shape));
    for (const TensorPiece& p : t.pieces) {
      std::vector<uint64_t> off(p.box.offset, p.box.offset + p.box.ndim), len(p.box.length, p.box.length + p.box.ndim);
      if (const Snapshot* s = snapshot_of(&p)) {
        // Complete once Stage returns: the background save's D2H copies need not wait for the caller's stream.
        MemoryLocation snap{p.memory.kind, p.memory.device, nullptr, /*ready=*/true};
        DCKPT_RETURN_IF_ERROR(owned_.AddPieceIn(t.name, off, len, s->data, snap));
        continue;
      }
      const uint64_t n = p.box.volume() * DTypeSize(t.dtype);
      char* dst;
      if (!p.memory.is_host() && n != 0) {
        device_at = AlignUp(device_at);
        dst = device_base + device_at;
        device_at += n;
        DeviceCopy c{p.data, n, p.memory, "tensor '" + t.name + "' piece " + p.box.ToString()};
        if (pinned_ != nullptr) {
          direct.push_back(std::move(c));
          direct_dst.push_back(dst);
        } else {
          device_copies.push_back(std::move(c));
          device_dst.push_back(dst);
        }
      } else {
        at = AlignUp(at);
        dst = buffer + at;
        at += n;
        copies.push_back(Copy{dst, static_cast<const char*>(p.data), n});
      }
      DCKPT_RETURN_IF_ERROR(owned_.AddPiece(t.name, off, len, dst));
    }
  }
  for (const BytesEntry& b : state.bytes()) {
    at = AlignUp(at);
    copies.push_back(Copy{buffer + at, static_cast<const char*>(b.data), b.size});
    DCKPT_RETURN_IF_ERROR(owned_.AddBytes(b.name, buffer + at, b.size));
    at += b.size;
  }
  for (const auto& kv : state.user()) owned_.SetUserMetadata(kv.first, kv.second);
  owned_.SetStructure(state.structure());

  // The direct device copies start first (they run on the copy engine while the host copies below use the CPUs);
  // every one started is waited for before this returns, whatever fails.
  PendingCopies direct_copies(deadline, [pinned_stuck] { *pinned_stuck = true; });
  if (!direct.empty()) {
    std::vector<MemoryLocation> locations;
    for (const DeviceCopy& c : direct) locations.push_back(c.memory);
    DCKPT_RETURN_IF_ERROR(engine->OrderAfterEach(locations));
    for (size_t k = 0; k < direct.size(); ++k) {
      auto fence = engine->CopyToHostAsync(direct_dst[k], direct[k].src, direct[k].size, direct[k].memory);
      if (!fence.ok()) return fence.status().WithContext("saving '" + path + "' (" + direct[k].what + ")");
      direct_copies.Add(std::move(fence).value(), direct[k].what);
    }
  }

  // The copy is the only part the caller waits for: split it across threads so it runs at memory bandwidth.
  {
    const size_t threads = options.staging_threads ? options.staging_threads : options.io_threads;
    ThreadPool pool(threads ? std::min<size_t>(threads, std::thread::hardware_concurrency())
                            : std::thread::hardware_concurrency());
    const StagedConsumer place = [&](size_t k, uint64_t off, const char* bytes, uint64_t n) {
      StreamCopy(device_dst[k] + off, bytes, n);
      return OkStatus();
    };
    TaskGroup group(&pool);
    for (const Copy& c : copies) {
      for (uint64_t off = 0; off < c.n; off += kCopySliceBytes) {
        const uint64_t n = std::min(kCopySliceBytes, c.n - off);
        group.Run([c, off, n] {
          if (n) StreamCopy(c.to + off, c.from + off, n);
          return OkStatus();
        });
      }
    }
    if (!device_copies.empty()) {
      auto res = GetStagingResources(options, kStagingAlignment);
      Status st = res.ok() ? RunStagingPipeline(*res, device_copies, &group, place)
                           : res.status().WithContext(device_copies.front().what);
      if (!st.ok()) group.Run([st] { return st; });
    }
    Status staged = group.Wait();
    if (!staged.ok()) return staged.WithContext("saving '" + path + "' (staging the state)");
  }
  if (Status st = direct_copies.WaitAll(); !st.ok()) return st.WithContext("saving '" + path + "' (staging the state)");
  DCKPT_RETURN_IF_ERROR(snapshot_copies.WaitAll());
  staged_bytes_ = total;
  return OkStatus();
}

Result<std::unique_ptr<SaveFuture>> SaveAsync(const std::string& path, const State& state, Communicator* comm,
                                              const SaveOptions& options) {
  // Before anything is staged or exchanged: the collectives below run on a background thread beside the caller's
  // own work, which not every communicator allows (NCCL). Every rank has the same kind of communicator, so every rank
  // refuses here alike, with no collective to join.
  if (comm != nullptr) {
    if (Status st = comm->CheckBackgroundUse(); !st.ok()) {
      return st.WithContext("asynchronous save of '" + path + "' over the " + comm->name() + " communicator");
    }
  }
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<SaveFuture> f(new SaveFuture());
  if (Status st = f->Stage(path, state, options); !st.ok()) {
    // The other ranks' saves are under way: tell them, so that they fail now with this rank's message rather than
    // wait out the timeout for a rank that never comes.
    if (comm != nullptr && comm->size() > 1) (void)JoinSaveAsFailed(path, comm, options, st);
    return st;
  }
  f->staging_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  SaveFuture* raw = f.get();
  f->thread_ = std::thread([raw, path, comm, options] {
    // Before Save starts its writer threads, which inherit it.
    (void)SetThisThreadPriority(options.background_priority);
    Result<SaveSummary> r = Save(path, raw->owned_, comm, options);
    // A timeout may have left a copy from a snapshot in flight (the drain gave up waiting): keep the arenas.
    if (!r.ok() && r.status().code() == StatusCode::kTimeout) raw->snapshots_stuck_ = true;
    // The staged copy is not needed any more: free it (back to the one-buffer pool) and its share of the budget now,
    // not when the future is freed, so that the next save can stage.
    raw->buffer_.reset();
    raw->pinned_.reset();
    raw->FreeSnapshots();
    ReleaseBudget(std::exchange(raw->reserved_, 0));
    std::lock_guard<std::mutex> lock(raw->mu_);
    raw->result_.emplace(std::move(r));
    raw->cv_.notify_all();
  });
  return f;
}

}  // namespace distckpt
