// The read/verify/scatter executor behind Reader and ReadBatch: turns planned reads into segment tasks on the
// reader's thread pool that read (pread, a mapping, or staged for device memory), verify checksum blocks and scatter
// the bytes into the destinations.
#include "core/engine/read_executor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <tuple>
#include <utility>

#include "core/codec/block_codec.h"
#include "core/engine/load_staging.h"
#include "core/format/checksum.h"

namespace distckpt {
namespace {

// DCKPT_DIRECT_IO=0: no direct reads in this process, whatever ReadOptions::direct_io says (an operator's switch, and
// how bench/gpu compares the two paths). Read once.
bool DirectIoOffByEnvironment() {
  static const bool off = [] {
    const char* v = std::getenv("DCKPT_DIRECT_IO");
    return v != nullptr && std::string(v) == "0";
  }();
  return off;
}

// Reads are issued in segments of at most this many bytes (a multiple of the checksum block size), so that one
// large chunk is read and verified by several threads at once and bounce buffers stay small.
constexpr uint64_t kReadSegmentBytes = 8ull << 20;
// Without verification, runs at least this long are read straight into the destination, one pread each.
constexpr uint64_t kDirectRunBytes = 256ull << 10;
// Without verification, a strided selection is read as one span (then scattered) if the span is at most this many
// times the bytes actually needed; sparser selections are read run by run.
constexpr uint64_t kMaxSpanAmplification = 8;
// Ranges closer than this are merged into one read: a few wasted bytes cost less than another system call.
constexpr uint64_t kMergeGapBytes = 256;

struct Range {
  uint64_t lo, hi;
};

void MergeRanges(std::vector<Range>* ranges, uint64_t gap) {
  std::sort(ranges->begin(), ranges->end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  size_t out = 0;
  for (const Range& r : *ranges) {
    if (out > 0 && r.lo <= (*ranges)[out - 1].hi + gap) {
      (*ranges)[out - 1].hi = std::max((*ranges)[out - 1].hi, r.hi);
    } else {
      (*ranges)[out++] = r;
    }
  }
  ranges->resize(out);
}

// Source offset of run number k of a copy plan (runs are numbered in increasing src order).
uint64_t RunSrc(const CopyPlan& c, uint64_t k) {
  uint64_t src = c.src_base;
  for (int d = static_cast<int>(c.outer_dims) - 1; d >= 0; --d) {
    src += (k % c.count[d]) * c.src_stride[d];
    k /= c.count[d];
  }
  return src;
}
uint64_t RunDst(const CopyPlan& c, uint64_t k) {
  uint64_t dst = c.dst_base;
  for (int d = static_cast<int>(c.outer_dims) - 1; d >= 0; --d) {
    dst += (k % c.count[d]) * c.dst_stride[d];
    k /= c.count[d];
  }
  return dst;
}

// Calls fn(src, dst, len) for the part of every run that falls inside [lo, hi) of the source, using a binary search
// for the first run so that a segment of a huge strided copy costs O(log runs + runs in the segment).
template <typename Fn>
void ForEachRunIn(const CopyPlan& c, uint64_t lo, uint64_t hi, Fn&& fn) {
  const uint64_t n = c.num_runs();
  if (n == 0) return;
  uint64_t first = 0, last = n;  // first run whose end is > lo
  while (first < last) {
    uint64_t mid = first + (last - first) / 2;
    if (RunSrc(c, mid) + c.run_length <= lo) first = mid + 1;
    else last = mid;
  }
  for (uint64_t k = first; k < n; ++k) {
    uint64_t s = RunSrc(c, k);
    if (s >= hi) break;
    uint64_t a = std::max(s, lo), b = std::min(s + c.run_length, hi);
    fn(a, RunDst(c, k) + (a - s), b - a);
  }
}

class BufferPool {
 public:
  explicit BufferPool(size_t keep) : keep_(keep) {}
  ~BufferPool() {
    for (char* b : free_) std::free(b);
  }
  char* Get() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        char* b = free_.back();
        free_.pop_back();
        return b;
      }
    }
    return static_cast<char*>(std::aligned_alloc(4096, kReadSegmentBytes + 4096));
  }
  void Put(char* b) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < keep_) free_.push_back(b);
    else std::free(b);
  }

 private:
  size_t keep_;
  std::mutex mu_;
  std::vector<char*> free_;
};

}  // namespace

// The executor itself (see read_executor.h); a nested class of Reader's friend ReadExecutor, so it reads the
// Reader's state directly.
class ReadExecutor::Impl {
 public:
  explicit Impl(Reader* reader) : r_(reader), pool_(reader->pool_->size()) {}

  Status Add(size_t entry, const std::vector<ReadTarget>& targets) {
    EntryView e = r_->meta_.entry(entry);
    std::vector<Box> boxes;
    std::vector<const ReadTarget*> dsts;
    for (const ReadTarget& t : targets) {
      if (t.box.empty()) continue;
      if (t.data == nullptr) return r_->EntryError(entry, "destination buffer for " + t.box.ToString() + " is NULL");
      if (t.memory.kind != MemoryKind::kHost && t.memory.kind != MemoryKind::kCuda) {
        return r_->EntryError(entry, "destination of " + t.box.ToString() + " has unknown memory kind " +
                                         std::to_string(static_cast<int>(t.memory.kind)));
      }
      if (!t.memory.is_host() && t.memory.device < 0) {
        return r_->EntryError(entry, "destination of " + t.box.ToString() + " has a negative device ordinal (" +
                                         std::to_string(t.memory.device) + ")");
      }
      boxes.push_back(t.box);
      dsts.push_back(&t);
    }
    if (boxes.empty()) return OkStatus();
    auto planned = PlanTensorRead(e, r_->Index(entry), boxes);
    if (!planned.ok()) return r_->EntryError(entry, planned.status());
    plans_.push_back(std::move(planned).value());
    const std::vector<TensorReadOp>& ops = plans_.back();
    for (size_t i = 0; i < ops.size(); ++i) {
      // One job per chunk, however often it is added: its segments then never overlap one another (a fan-out load
      // reads each byte of a chunk once, through the one job that delivers it everywhere).
      auto [at, added] = job_of_.emplace(std::make_pair(entry, ops[i].chunk), jobs_.size());
      if (added) jobs_.push_back(Job{entry, ops[i].chunk, false, false, {}});
      const ReadTarget& to = *dsts[ops[i].dest];
      jobs_[at->second].ops.push_back(Op{&ops[i].copy, static_cast<char*>(to.data), to.memory});
      if (!to.memory.is_host()) {
        jobs_[at->second].device = true;
        device_locations_.push_back(to.memory);
      }
    }
    return OkStatus();
  }

  /// Reads and verifies a whole chunk without delivering it anywhere.
  void AddVerify(size_t entry, uint32_t chunk) { jobs_.push_back(Job{entry, chunk, true, false, {}}); }
  /// Brings a whole chunk into the page cache and into this process's mapping of its file, and verifies it there
  /// (Reader::MapAll): the pages stay mapped for the caller's views.
  void AddMapped(size_t entry, uint32_t chunk) { jobs_.push_back(Job{entry, chunk, false, false, {}, true}); }

  Result<std::vector<FileRange>> VerifiedRanges() {
    DCKPT_RETURN_IF_ERROR(Prepare());
    std::vector<FileRange> out;  // work_ is in (file, offset) order: merging neighbours is enough
    for (const Work& w : work_) {
      // A compressed chunk's blocks are verified by every rank that decodes them: they are never shared.
      if (!verify(*w.job) || r_->meta_.entry(w.job->entry).compressed(w.job->chunk)) continue;
      auto file = r_->File(w.file);  // opened now, so that its CacheIdentity is known
      if (!file.ok()) return r_->EntryError(w.job->entry, file.status());
      const uint64_t lo = w.offset, hi = w.offset + (w.seg.hi - w.seg.lo);
      if (!out.empty() && out.back().file == w.file && lo <= out.back().hi) {
        out.back().hi = std::max(out.back().hi, hi);
      } else {
        out.push_back(FileRange{w.file, lo, hi});
      }
    }
    return out;
  }

  void SetVerifyFilter(VerifyFilter filter) { filter_ = std::move(filter); }

  Status Run(const ProgressFn& progress) {
    progress_ = progress;
    DCKPT_RETURN_IF_ERROR(Prepare());
    return RunWork(work_);
  }

  Result<std::vector<ChunkRange>> NeededRanges() {
    DCKPT_RETURN_IF_ERROR(Prepare());
    std::vector<ChunkRange> out;
    for (const Work& w : work_) {
      out.push_back(ChunkRange{static_cast<uint32_t>(w.job->entry), w.job->chunk, w.seg.lo, w.seg.hi});
    }
    std::sort(out.begin(), out.end(), [](const ChunkRange& a, const ChunkRange& b) {
      return std::tie(a.entry, a.chunk, a.lo) < std::tie(b.entry, b.chunk, b.lo);
    });
    size_t n = 0;
    for (const ChunkRange& r : out) {
      if (n > 0 && out[n - 1].entry == r.entry && out[n - 1].chunk == r.chunk && r.lo <= out[n - 1].hi) {
        out[n - 1].hi = std::max(out[n - 1].hi, r.hi);
      } else {
        out[n++] = r;
      }
    }
    out.resize(n);
    return out;
  }

  Status RunRanges(const std::vector<ChunkRange>& ranges, const ProgressFn& progress, const ReadBatch::ReadSink& sink) {
    progress_ = progress;
    DCKPT_RETURN_IF_ERROR(Prepare());
    std::vector<Work> work;
    for (const ChunkRange& r : ranges) {
      DCKPT_ASSIGN_OR_RETURN(const Job* job, FindJob(r));
      const uint64_t seg = SegmentBytes(*job);
      const ChunkLocation loc = r_->meta_.entry(job->entry).chunk(job->chunk);
      if (r.hi > loc.length || r.lo > r.hi) return Internal("fan-out range beyond its chunk");
      const EntryView e = r_->meta_.entry(job->entry);
      for (uint64_t lo = r.lo; lo < r.hi; lo += seg) {
        work.push_back(Work{job, Range{lo, std::min(r.hi, lo + seg)}, loc.file, FileOffset(e, job->chunk, lo)});
      }
    }
    std::sort(work.begin(), work.end(),
              [](const Work& a, const Work& b) { return a.file != b.file ? a.file < b.file : a.offset < b.offset; });
    sink_ = sink;
    Status st = RunWork(work);
    sink_ = nullptr;
    return st;
  }

  Status DeliverFromPeer(const ChunkRange& r, const char* data, const ProgressFn& progress) {
    progress_ = progress;
    DCKPT_RETURN_IF_ERROR(Prepare());
    DCKPT_ASSIGN_OR_RETURN(const Job* job, FindJob(r));
    uint64_t delivered = 0;
    for (const Op& op : job->ops) {
      std::vector<DeviceRun> runs;
      ForEachRunIn(*op.copy, r.lo, r.hi, [&](uint64_t src, uint64_t dst, uint64_t n) {
        if (op.memory.is_host()) std::memcpy(op.dst + dst, data + (src - r.lo), n);
        else runs.push_back(DeviceRun{src - r.lo, op.dst + dst, n});
        delivered += n;
      });
      if (!runs.empty()) {
        Status st = staging_->CopyNow(data, runs, op.memory);
        if (!st.ok()) return r_->EntryError(job->entry, st.WithContext("chunk #" + std::to_string(job->chunk)));
      }
    }
    r_->stats_.bytes_delivered += delivered;
    r_->stats_.bytes_received_from_peers += r.hi - r.lo;
    return Progress(r.hi - r.lo);
  }

 private:
  struct Op {
    const CopyPlan* copy;
    char* dst;
    MemoryLocation memory;
  };
  struct Job {
    size_t entry;
    uint32_t chunk;
    bool verify_only;
    bool device;  // some destination is device memory: read into pinned staging buffers (load_staging.h)
    std::vector<Op> ops;
    // AddMapped: the whole chunk read (and verified, as the options say) through the file's mapping, which keeps
    // the pages.
    bool mapped = false;
  };

  bool verify(const Job& job) const { return job.verify_only || r_->options_.verify; }
  struct Work {
    const Job* job;
    Range seg;      // within the chunk
    uint32_t file;  // where the segment starts in the data files
    uint64_t offset;
  };

  Result<const Job*> FindJob(const ChunkRange& r) const {
    auto it = job_of_.find(std::make_pair(static_cast<size_t>(r.entry), r.chunk));
    if (it == job_of_.end()) {
      return Internal("fan-out range of entry #" + std::to_string(r.entry) + " chunk #" + std::to_string(r.chunk) +
                      " that this rank did not plan");
    }
    return &jobs_[it->second];
  }

  Status Progress(uint64_t len) {
    if (progress_) {
      // Counted under the lock: the callback sees `done` grow call after call, whichever thread reports.
      std::lock_guard<std::mutex> lock(progress_mu_);
      const uint64_t done = done_.fetch_add(len) + len;
      if (progress_(done, total_) != 0) return Status(StatusCode::kUser, "aborted by the progress callback");
    }
    return OkStatus();
  }

  Status RunWork(const std::vector<Work>& work) {
    uint64_t total = 0;
    for (const Work& w : work) total += w.seg.hi - w.seg.lo;
    // The segments (in file order, see Prepare) are cut into one contiguous stream per I/O thread (equal bytes), each
    // read front to back through the stream's own file handles: every stream looks sequential to the kernel, whose
    // readahead then fills the page cache with large folios (a later mapped read of them costs a fraction of the
    // page faults) and keeps the disk busy with large requests.
    const size_t streams = std::max<size_t>(1, std::min(r_->pool_->size(), work.size()));
    TaskGroup group(r_->pool_.get());
    size_t begin = 0;
    uint64_t bytes = 0;
    for (size_t s = 0; s < streams && begin < work.size(); ++s) {
      const uint64_t until = total / streams * (s + 1);
      size_t end = begin;
      while (end < work.size() && (s + 1 == streams || bytes < until || end == begin)) {
        bytes += work[end].seg.hi - work[end].seg.lo;
        ++end;
      }
      group.Run([this, &work, begin, end] {
        std::vector<std::unique_ptr<ReadableFile>> own(r_->files_.size());
        for (size_t i = begin; i < end; ++i) {
          // A mapped pass asks for the stream's next segment before it takes this one: the disk reads it while
          // this thread waits for, then hashes, the current one.
          if (i + 1 < end && work[i + 1].job->mapped) Prefetch(work[i + 1]);
          DCKPT_RETURN_IF_ERROR(RunSegment(*work[i].job, work[i].seg, &own));
        }
        return OkStatus();
      });
      begin = end;
    }
    Status st = group.Wait();
    if (staging_) {
      // Every copy to a device has landed (or failed) before the pass returns: the destinations are then ready for
      // any stream, and no pinned buffer is still in use.
      Status drained = staging_->Drain();
      if (st.ok()) st = drained;
    }
    return st;
  }

  // Splits every job into segments, once, sorted by their place in the data files: progress then reports a fixed
  // total, VerifiedRanges sees what Run does, and Run can cut the list into sequential streams.
  Status Prepare() {
    if (prepared_) return OkStatus();
    if (!device_locations_.empty()) DCKPT_RETURN_IF_ERROR(PrepareStaging());
    std::vector<Range> segments;
    for (const Job& job : jobs_) {
      segments.clear();
      DCKPT_RETURN_IF_ERROR(Segments(job, &segments));
      const EntryView e = r_->meta_.entry(job.entry);
      const ChunkLocation loc = e.chunk(job.chunk);
      for (const Range& seg : segments) {
        total_ += seg.hi - seg.lo;
        work_.push_back(Work{&job, seg, loc.file, FileOffset(e, job.chunk, seg.lo)});
      }
    }
    std::sort(work_.begin(), work_.end(),
              [](const Work& a, const Work& b) { return a.file != b.file ? a.file < b.file : a.offset < b.offset; });
    prepared_ = true;
    return OkStatus();
  }

  // Segments of a job are at most this long: kReadSegmentBytes, or one staging buffer for device destinations; a
  // multiple of the checksum block size, and at least one block.
  // A device job's chunk that does not start on a page (a safetensors tensor) leaves room in the staging buffer for
  // the pages around a segment, which a direct read fills (ReadDirect).
  uint64_t SegmentBytes(const Job& job) const {
    const uint64_t block = r_->meta_.checksum_block_size();
    uint64_t limit = job.device ? std::min(kReadSegmentBytes, StagingBufferBytes()) : kReadSegmentBytes;
    constexpr uint64_t kAlign = ReadableFile::kDirectIoAlignment;
    if (job.device && r_->options_.direct_io && r_->meta_.entry(job.entry).chunk(job.chunk).offset % kAlign != 0 &&
        limit >= block + 2 * kAlign) {
      limit -= 2 * kAlign;
    }
    return std::max(block, limit / block * block);
  }
  uint64_t StagingBufferBytes() const {
    const uint64_t block = r_->meta_.checksum_block_size();
    return std::max(block, r_->options_.staging_buffer_bytes / block * block);
  }

  // Device destinations: the copy engine (the driver is loaded here, at planning time, so that a machine without one
  // fails before any collective read) and the copies ordered after each destination's stream.
  Status PrepareStaging() {
    auto made = LoadStaging::Create(r_->options_.copy_engine, StagingBufferBytes(), r_->options_.staging_buffers,
                                    DeadlineAfter(r_->options_.timeout));
    if (!made.ok()) {
      return made.status().WithContext("checkpoint '" + r_->path_ + "': loading into " +
                                       device_locations_.front().ToString() + " memory");
    }
    staging_ = std::move(made).value();
    Status st = staging_->engine()->OrderAfterEach(device_locations_);
    return st.ok() ? st : st.WithContext("checkpoint '" + r_->path_ + "'");
  }

  // Chooses the byte ranges of the chunk to read, split into segments.
  Status Segments(const Job& job, std::vector<Range>* out) {
    const ChunkLocation loc = r_->meta_.entry(job.entry).chunk(job.chunk);
    if (loc.length == 0) return OkStatus();
    const uint64_t block = r_->meta_.checksum_block_size();
    const uint64_t nblocks = NumChecksumBlocks(loc.length, block);
    const bool compressed = r_->meta_.entry(job.entry).compressed(job.chunk);
    if (compressed && job.mapped) {
      return r_->EntryError(job.entry, Status(StatusCode::kUnsupported,
                                              "chunk #" + std::to_string(job.chunk) +
                                                  " is compressed: it cannot be mapped in place (load it instead)"));
    }
    std::vector<Range> ranges;
    if (job.verify_only || job.mapped || (verify(job) && nblocks == 1)) {  // whole chunks
      ranges.push_back({0, loc.length});
    } else if (verify(job) || compressed) {
      // Only the checksum blocks that hold needed bytes are read (and verified; a compressed chunk is decoded block
      // by block, so it is read so too, with or without verification).
      for (const Op& op : job.ops) {
        if (op.copy->num_runs() == 0) continue;
        ranges.push_back({op.copy->src_begin() / block * block,
                          std::min(loc.length, (op.copy->src_end() + block - 1) / block * block)});
      }
      MergeRanges(&ranges, 0);
    } else {
      for (const Op& op : job.ops) {
        const CopyPlan& c = *op.copy;
        if (c.num_runs() == 0) continue;
        const uint64_t span = c.src_end() - c.src_begin();
        if (c.run_length >= kDirectRunBytes || span > kMaxSpanAmplification * c.total_bytes()) {
          c.ForEachRun([&](const ByteRun& run) { ranges.push_back({run.src, run.src + run.length}); });
        } else {
          ranges.push_back({c.src_begin(), c.src_end()});
        }
      }
      MergeRanges(&ranges, kMergeGapBytes);
    }
    const uint64_t seg = SegmentBytes(job);
    for (const Range& r : ranges) {
      for (uint64_t lo = r.lo; lo < r.hi; lo += seg) out->push_back({lo, std::min(r.hi, lo + seg)});
    }
    return OkStatus();
  }

  void Prefetch(const Work& w) {
    auto file = r_->File(w.file);
    if (file.ok()) (*file)->WillNeed(w.offset, w.seg.hi - w.seg.lo);
  }

  // A segment of a mapped job: its pages are read into the page cache and mapped (one call, not a fault per page),
  // then hashed in place. Nothing is copied and nothing is released: the caller's views use these pages.
  Status RunMappedSegment(const Job& job, const EntryView& e, const ChunkLocation& loc, Range seg,
                          const ReadableFile* file) {
    const char* map = file->Map();
    if (map == nullptr) {
      return r_->EntryError(job.entry, Status(StatusCode::kUnsupported,
                                              "data file '" + file->path() + "' cannot be mapped by this storage"));
    }
    const uint64_t len = seg.hi - seg.lo;
    Status st = file->Populate(loc.offset + seg.lo, len);
    if (!st.ok()) return r_->EntryError(job.entry, st.WithContext("chunk #" + std::to_string(job.chunk)));
    if (verify(job)) DCKPT_RETURN_IF_ERROR(Verify(job, e, loc, seg, map + loc.offset + seg.lo));
    r_->stats_.bytes_mapped += len;
    return Progress(len);
  }

  // `own`: this stream's handles, by file index (opened on first use; the shared one where the backend has none).
  Status RunSegment(const Job& job, Range seg, std::vector<std::unique_ptr<ReadableFile>>* own) {
    const EntryView e = r_->meta_.entry(job.entry);
    const ChunkLocation loc = e.chunk(job.chunk);
    const uint64_t len = seg.hi - seg.lo;
    auto file = r_->File(loc.file);
    if (!file.ok()) return r_->EntryError(job.entry, file.status());
    if (job.mapped) return RunMappedSegment(job, e, loc, seg, *file);
    if (e.compressed(job.chunk)) return RunCompressedSegment(job, e, loc, seg, Own(*file, loc.file, own));

    // Data already in the page cache is hashed and scattered straight from a mapping of the file: no kernel copy,
    // no bounce buffer, and only the bytes needed (plus the blocks this rank verifies) are touched.
    const char* map = r_->options_.map_files && !job.device ? (*file)->Map() : nullptr;
    if (map != nullptr && (*file)->Resident(loc.offset + seg.lo, len)) {
      Status st = Deliver(job, e, loc, seg, map + loc.offset + seg.lo, /*mapped=*/true);
      // Mapped pages count in the resident set: let them go once used, so a load's RSS stays flat (bench (e)).
      (*file)->ReleaseMapped(loc.offset + seg.lo, len);
      return st;
    }

    const ReadableFile* from = Own(*file, loc.file, own);
    if (job.device) return RunStagedSegment(job, e, loc, seg, from);

    // Read straight into a destination when one run covers the whole segment; otherwise into a bounce buffer.
    char* buf = DirectDestination(job, seg);
    char* bounce = nullptr;
    if (buf == nullptr) {
      bounce = pool_.Get();
      if (bounce == nullptr) return Status(StatusCode::kNoMemory, "cannot allocate a read buffer");
      buf = bounce;
    }
    struct Releaser {
      BufferPool* p;
      char* b;
      ~Releaser() {
        if (b) p->Put(b);
      }
    } release{&pool_, bounce};

    Status st = from->ReadAt(loc.offset + seg.lo, buf, len);
    if (!st.ok()) return r_->EntryError(job.entry, st.WithContext("chunk #" + std::to_string(job.chunk)));
    r_->stats_.bytes_read += len;
    r_->stats_.read_calls += 1;
    return Deliver(job, e, loc, seg, buf, /*mapped=*/false);
  }

  // The stream's own handle of file `index` (opened on first use), or the shared one where the backend has none.
  const ReadableFile* Own(const ReadableFile* shared, uint32_t index, std::vector<std::unique_ptr<ReadableFile>>* own) {
    if (own == nullptr || index >= own->size()) return shared;
    std::unique_ptr<ReadableFile>& mine = (*own)[index];
    if (!mine) mine = shared->Reopen();
    return mine ? mine.get() : shared;
  }

  // A host destination that one run of the job covers for the whole segment (bytes may land there directly), or null.
  char* DirectDestination(const Job& job, Range seg) const {
    for (const Op& op : job.ops) {
      if (!op.memory.is_host()) continue;
      char* found = nullptr;
      ForEachRunIn(*op.copy, seg.lo, seg.hi, [&](uint64_t src, uint64_t dst, uint64_t n) {
        if (found == nullptr && src == seg.lo && n == seg.hi - seg.lo) found = op.dst + dst;
      });
      if (found) return found;
    }
    return nullptr;
  }

  // Where byte `lo` of chunk `chunk` is stored in its data file: the chunk's offset plus, for a compressed chunk,
  // the stored sizes of the blocks before it (lo is then on a block boundary).
  uint64_t FileOffset(const EntryView& e, uint32_t chunk, uint64_t lo) const {
    const ChunkLocation loc = e.chunk(chunk);
    if (!e.compressed(chunk)) return loc.offset + lo;
    const Span<const StoredBlock> stored = e.stored(chunk);
    uint64_t at = loc.offset;
    for (uint64_t b = 0; b < lo / r_->meta_.checksum_block_size(); ++b) at += stored[b].size;
    return at;
  }

  // A segment of a compressed chunk (block-aligned, Segments): its stored blocks are read into a bounce buffer and
  // checked against their stored checksums before the decoder sees them, then decoded into a destination the segment
  // lands in whole, a pinned staging buffer (device destinations) or a second bounce buffer, and delivered as read
  // bytes are (Deliver verifies the decoded bytes against the chunk's checksums).
  Status RunCompressedSegment(const Job& job, const EntryView& e, const ChunkLocation& loc, Range seg,
                              const ReadableFile* from) {
    const uint64_t block = r_->meta_.checksum_block_size();
    const Span<const StoredBlock> stored = e.stored(job.chunk);
    const uint64_t first = seg.lo / block, last = (seg.hi + block - 1) / block;
    const uint64_t at = FileOffset(e, job.chunk, seg.lo);
    uint64_t stored_len = 0;
    for (uint64_t b = first; b < last; ++b) stored_len += stored[b].size;
    // Pooled bounce buffers, or (checksum blocks larger than a pooled buffer) buffers of their own.
    struct Buffers {
      BufferPool* p;
      char* in = nullptr;
      char* out = nullptr;
      std::vector<std::unique_ptr<char[]>> big;
      char* Get(uint64_t n) {
        if (n <= kReadSegmentBytes) return p->Get();
        big.emplace_back(new (std::nothrow) char[n]);
        return big.back().get();
      }
      ~Buffers() {
        if (in && big.empty()) p->Put(in);
        if (out && big.empty()) p->Put(out);
      }
    } bufs{&pool_};
    if (seg.hi - seg.lo > kReadSegmentBytes) bufs.big.reserve(2);
    bufs.in = bufs.Get(seg.hi - seg.lo);
    if (bufs.in == nullptr) return Status(StatusCode::kNoMemory, "cannot allocate a read buffer");
    const std::string chunk = "chunk #" + std::to_string(job.chunk);
    Status st = from->ReadAt(at, bufs.in, stored_len);
    if (!st.ok()) return r_->EntryError(job.entry, st.WithContext(chunk));
    r_->stats_.bytes_read += stored_len;
    r_->stats_.read_calls += 1;

    char* out = nullptr;
    char* staged = nullptr;
    if (job.device) {
      auto acquired = staging_->Acquire();
      if (!acquired.ok()) {
        return acquired.status().code() == StatusCode::kNoMemory ? r_->EntryError(job.entry, acquired.status())
                                                                 : acquired.status();
      }
      out = staged = *acquired;
    } else if ((out = DirectDestination(job, seg)) == nullptr) {
      out = bufs.out = bufs.Get(seg.hi - seg.lo);
      if (out == nullptr) return Status(StatusCode::kNoMemory, "cannot allocate a read buffer");
    }
    uint64_t in = 0;
    for (uint64_t b = first; b < last; ++b) {
      const char* src = bufs.in + in;
      const uint64_t lo = b * block, len = std::min(block, loc.length - lo);
      const std::string where = "checkpoint '" + r_->path_ + "': entry '" + std::string(e.name) + "' " + chunk +
                                " block #" + std::to_string(b) + " in data file '" + FileLabel(loc.file) + "' bytes " +
                                std::to_string(at + in) + ".." + std::to_string(at + in + stored[b].size);
      if (verify(job)) {
        r_->stats_.bytes_verified += stored[b].size;
        const uint64_t h = Xxh3(src, stored[b].size);
        if (h != stored[b].checksum) {
          if (staged != nullptr) staging_->Release(staged);
          return Corrupt(where + ": stored checksum mismatch (" + Hex(stored[b].checksum, h) +
                         "); the data is corrupt: restore the file or re-save");
        }
      }
      st = DecodeBlock(src, stored[b].size, GroupWidth(DTypeSize(e.dtype)), out + (lo - seg.lo), len);
      if (!st.ok()) {
        if (staged != nullptr) staging_->Release(staged);
        return Corrupt(where + ": " + st.message() + "; the data is corrupt: restore the file or re-save");
      }
      in += stored[b].size;
    }
    return Deliver(job, e, loc, seg, out, /*mapped=*/false, staged);
  }

  // A data file as errors name it: its name in this checkpoint, or its path in a base.
  std::string FileLabel(uint32_t file) const {
    return r_->meta_.file_base(file) == 0 ? std::string(r_->meta_.file_name(file)) : r_->FilePath(file);
  }

  static std::string Hex(uint64_t stored, uint64_t computed) {
    char hex[64];
    std::snprintf(hex, sizeof hex, "stored %016llx, computed %016llx", static_cast<unsigned long long>(stored),
                  static_cast<unsigned long long>(computed));
    return hex;
  }

  // A segment of a job with device destinations: read into a pinned staging buffer, verified there, then copied to
  // the devices by the staging's engine while this thread goes on with its next segment.
  Status RunStagedSegment(const Job& job, const EntryView& e, const ChunkLocation& loc, Range seg,
                          const ReadableFile* from) {
    const uint64_t len = seg.hi - seg.lo;
    auto acquired = staging_->Acquire();  // a copy failure of this pass (already named), or out of pinned memory
    if (!acquired.ok()) {
      return acquired.status().code() == StatusCode::kNoMemory ? r_->EntryError(job.entry, acquired.status())
                                                               : acquired.status();
    }
    char* staged = *acquired;
    const uint64_t at = loc.offset + seg.lo;
    // Not in the page cache: read past it, the aligned pages around the segment straight into the pinned buffer.
    if (const char* direct = ReadDirect(job, from, at, len, staged)) {
      return Deliver(job, e, loc, seg, direct, /*mapped=*/false, staged);
    }
    Status st = from->ReadAt(at, staged, len);
    if (!st.ok()) {
      staging_->Release(staged);
      return r_->EntryError(job.entry, st.WithContext("chunk #" + std::to_string(job.chunk)));
    }
    r_->stats_.bytes_read += len;
    r_->stats_.read_calls += 1;
    return Deliver(job, e, loc, seg, staged, /*mapped=*/false, staged);
  }

  // Reads the pages around [at, at + len) of `from` past the page cache into the pinned buffer `staged`; returns where
  // byte `at` landed, or nullptr to read the usual way: direct reads are off, the bytes are in the page cache, the
  // aligned pages do not fit the buffer, the file system refused (then no later segment tries), or the read failed or
  // came short (ReadAt then reads again and names the error).
  const char* ReadDirect(const Job& job, const ReadableFile* from, uint64_t at, uint64_t len, char* staged) {
    constexpr uint64_t kAlign = ReadableFile::kDirectIoAlignment;
    if (!r_->options_.direct_io || DirectIoOffByEnvironment() || direct_refused_.load(std::memory_order_relaxed) ||
        reinterpret_cast<uintptr_t>(staged) % kAlign != 0 || from->Resident(at, len)) {
      return nullptr;
    }
    const uint64_t lo = at / kAlign * kAlign, hi = (at + len + kAlign - 1) / kAlign * kAlign;
    if (hi - lo > staging_->buffer_bytes()) return nullptr;
    auto got = from->ReadDirectAt(lo, staged, static_cast<size_t>(hi - lo));
    if (!got.ok()) {
      if (got.status().code() == StatusCode::kUnsupported) direct_refused_.store(true, std::memory_order_relaxed);
      return nullptr;
    }
    if (got.value() < at + len - lo) return nullptr;
    r_->stats_.bytes_read += len;
    r_->stats_.bytes_read_direct += len;
    r_->stats_.read_calls += 1;
    return staged + (at - lo);
  }

  // Verifies the segment's bytes at `buf` (read or mapped) and copies the needed runs into the destinations: host
  // ones now, device ones through the staging when `staged` (the pinned buffer `buf` is, which this call hands back
  // or over whatever happens).
  Status Deliver(const Job& job, const EntryView& e, const ChunkLocation& loc, Range seg, const char* buf, bool mapped,
                 char* staged = nullptr) {
    const uint64_t len = seg.hi - seg.lo;
    // One checksum block (at least 256 KiB) at a time: hashed, then its host runs copied while it is still in cache
    // (a segment is 8 MiB, more than a core's cache: hashing it whole and then scattering read it twice from memory;
    // warm resharded load 4->3, 5 interleaved pairs: 7.34 -> 7.47 GB/s median, bench/NOTES.md). Device runs and the
    // sink take the segment only once all of it is verified.
    const uint64_t block = r_->meta_.checksum_block_size();
    const uint64_t step = verify(job) ? std::max<uint64_t>(block, (256ull << 10) / block * block) : len;
    uint64_t delivered = 0;
    std::vector<DeviceRuns> device;
    for (uint64_t lo = seg.lo; lo < seg.hi; lo += step) {
      const Range part{lo, std::min(seg.hi, lo + step)};
      if (verify(job)) {
        Status st = Verify(job, e, loc, part, buf + (lo - seg.lo));
        if (!st.ok()) {
          if (staged != nullptr) staging_->Release(staged);  // nothing unverified reaches a device
          return st;
        }
      }
      for (const Op& op : job.ops) {
        if (op.memory.is_host()) {
          ForEachRunIn(*op.copy, part.lo, part.hi, [&](uint64_t src, uint64_t dst, uint64_t n) {
            char* to = op.dst + dst;
            const char* from = buf + (src - seg.lo);
            if (to != from) std::memcpy(to, from, n);
            delivered += n;
          });
        }
      }
    }
    for (const Op& op : job.ops) {
      if (op.memory.is_host()) continue;
      device.push_back(DeviceRuns{op.memory, {}});
      ForEachRunIn(*op.copy, seg.lo, seg.hi, [&](uint64_t src, uint64_t dst, uint64_t n) {
        device.back().runs.push_back(DeviceRun{src - seg.lo, op.dst + dst, n});
        delivered += n;
      });
    }
    r_->stats_.bytes_delivered += delivered;
    if (mapped) r_->stats_.bytes_mapped += delivered;
    if (sink_) {  // verified above: the bytes may go to the ranks that need them too
      sink_(ChunkRange{static_cast<uint32_t>(job.entry), job.chunk, seg.lo, seg.hi}, buf);
      r_->stats_.bytes_sent_to_peers += len;
    }
    if (staged != nullptr) {  // after the sink: the buffer may go back to the pool as soon as the copies land
      const size_t entry = job.entry;
      const std::string chunk = "chunk #" + std::to_string(job.chunk);
      DCKPT_RETURN_IF_ERROR(staging_->Submit(staged, device, [this, entry, chunk](const Status& st) {
        return r_->EntryError(entry, st.WithContext(chunk));
      }));
    }
    return Progress(len);
  }

  Status Verify(const Job& job, const EntryView& e, const ChunkLocation& loc, Range seg, const char* buf) {
    const uint64_t block = r_->meta_.checksum_block_size();
    const uint64_t nblocks = NumChecksumBlocks(loc.length, block);
    const bool compressed = e.compressed(job.chunk);
    auto mine = [&](uint64_t off) { return compressed || !filter_ || filter_(loc.file, loc.offset + off); };
    auto mismatch = [&](uint64_t lo, uint64_t hi, uint64_t stored, uint64_t computed) {
      // A compressed chunk's decoded bytes have no place in the file: name the decoded range.
      const std::string range =
          compressed ? "decoded bytes " + std::to_string(lo) + ".." + std::to_string(hi) + " of the chunk stored at " +
                           std::to_string(loc.offset)
                     : "bytes " + std::to_string(loc.offset + lo) + ".." + std::to_string(loc.offset + hi);
      return Corrupt("checkpoint '" + r_->path_ + "': entry '" + std::string(e.name) + "' chunk #" +
                     std::to_string(job.chunk) + ": checksum mismatch in data file '" + FileLabel(loc.file) + "' " +
                     range + " (" + Hex(stored, computed) + "); the data is corrupt: restore the file or re-save");
    };
    if (nblocks == 1) {
      if (!mine(0)) return OkStatus();
      r_->stats_.bytes_verified += loc.length;
      uint64_t h = Xxh3(buf, loc.length);
      if (h != loc.checksum) return mismatch(0, loc.length, loc.checksum, h);
      return OkStatus();
    }
    Span<const uint64_t> table(e.block_checksums.data() + loc.first_block, nblocks);
    if (CombineBlockChecksums(table) != loc.checksum) {
      return mismatch(0, loc.length, loc.checksum, CombineBlockChecksums(table));
    }
    for (uint64_t off = seg.lo; off < seg.hi; off += block) {
      if (!mine(off)) continue;
      uint64_t n = std::min(block, loc.length - off);
      r_->stats_.bytes_verified += n;
      uint64_t h = Xxh3(buf + (off - seg.lo), n);
      if (h != table[off / block]) return mismatch(off, off + n, table[off / block], h);
    }
    return OkStatus();
  }

  Reader* r_;
  BufferPool pool_;
  std::vector<MemoryLocation> device_locations_;  // of Add's device destinations
  std::unique_ptr<LoadStaging> staging_;          // made by Prepare when there are some
  std::atomic<bool> direct_refused_{false};       // the file system refused a direct read: none is tried again
  std::vector<std::vector<TensorReadOp>> plans_;
  std::vector<Job> jobs_;
  std::map<std::pair<size_t, uint32_t>, size_t> job_of_;  // (entry, chunk) -> index in jobs_ (Add's jobs)
  std::vector<Work> work_;
  bool prepared_ = false;
  VerifyFilter filter_;
  ReadBatch::ReadSink sink_;  // set during RunRanges
  ProgressFn progress_;
  std::mutex progress_mu_;
  std::atomic<uint64_t> done_{0};
  uint64_t total_ = 0;
};

ReadExecutor::ReadExecutor(Reader* reader) : impl_(std::make_unique<Impl>(reader)) {}
ReadExecutor::~ReadExecutor() = default;
Status ReadExecutor::Add(size_t entry, const std::vector<ReadTarget>& targets) { return impl_->Add(entry, targets); }
void ReadExecutor::AddVerify(size_t entry, uint32_t chunk) { impl_->AddVerify(entry, chunk); }
void ReadExecutor::AddMapped(size_t entry, uint32_t chunk) { impl_->AddMapped(entry, chunk); }
Result<std::vector<FileRange>> ReadExecutor::VerifiedRanges() { return impl_->VerifiedRanges(); }
void ReadExecutor::SetVerifyFilter(VerifyFilter filter) { impl_->SetVerifyFilter(std::move(filter)); }
Status ReadExecutor::Run(const ProgressFn& progress) { return impl_->Run(progress); }
Result<std::vector<ChunkRange>> ReadExecutor::NeededRanges() { return impl_->NeededRanges(); }
Status ReadExecutor::RunRanges(const std::vector<ChunkRange>& ranges, const ProgressFn& progress,
                               const ReadBatch::ReadSink& sink) {
  return impl_->RunRanges(ranges, progress, sink);
}
Status ReadExecutor::DeliverFromPeer(const ChunkRange& range, const char* data, const ProgressFn& progress) {
  return impl_->DeliverFromPeer(range, data, progress);
}

}  // namespace distckpt
