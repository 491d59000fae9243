#include "core/tools/safetensors_export.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "core/base/box.h"
#include "core/engine/coordinator_round.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/foreign/json.h"
#include "core/format/metadata.h"

namespace distckpt {
namespace {

// Worst-case width of a uint64 in decimal; the shard-size estimate assumes it for both data offsets.
constexpr uint64_t kMaxDecimalDigits = 20;
// Buffers of at least this size are whole pages, so that every write but a file's last is page-aligned in offset,
// length and memory: the POSIX storage then writes it with O_DIRECT (no page cache to fill and flush at the fsync).
constexpr uint64_t kPage = 4096;
// The smallest buffer: a multiple of the largest element (8 bytes), so that no buffer boundary splits an element.
constexpr uint64_t kMinBufferBytes = 8;
// The reader's read unit (read_executor.cc's segment): what each of its I/O threads may hold in a buffer of its own.
constexpr uint64_t kReaderSegmentBytes = 8ull << 20;
// Buffers per writing thread where the budget allows: up to three writes in flight while the fourth is filled, so a
// fill that is late (a busy CPU) does not leave the disk idle.
constexpr size_t kRing = 4;

struct TensorToExport {
  size_t entry = 0;  // index in the metadata
  std::string name;  // the exported name (after the rename rules)
  DType dtype = DType::kInvalid;
  std::vector<uint64_t> shape;
  uint64_t nbytes = 0;
  uint64_t begin = 0;  // data_offsets inside its file, once laid out
};

struct ShardFile {
  std::vector<TensorToExport> tensors;  // in file order once laid out
  std::string name;                     // final file name
  std::string head;                     // the 8-byte header length and the header
  uint64_t size = 0;                    // the whole file
  uint64_t tensor_bytes = 0;
  int rank = 0;  // the rank that writes it
};

std::string ShapeJson(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d) s += ",";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

// `"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}`
std::string TensorHeader(const TensorToExport& t) {
  return JsonQuote(t.name) + ":{\"dtype\":\"" + SafetensorsDTypeName(t.dtype) + "\",\"shape\":" + ShapeJson(t.shape) +
         ",\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.begin + t.nbytes) + "]}";
}

// An upper bound of TensorHeader(t).size() + 1 (the separating comma), whatever the offsets turn out to be.
uint64_t TensorHeaderBound(const TensorToExport& t) {
  TensorToExport zero = t;
  zero.begin = 0;
  zero.nbytes = 0;
  return TensorHeader(zero).size() + 1 + 2 * (kMaxDecimalDigits - 1);
}

std::string FileName(const std::string& prefix, size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, n);
  return prefix + buf;
}

std::string TempName(const std::string& name, const std::string& nonce) { return "." + name + ".tmp-" + nonce; }

bool TraceEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("DCKPT_EXPORT_TRACE");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Appends to `out` boxes that together cover the elements [lo, hi) of a row-major array of `shape`, in order, each
// of them contiguous in row-major order (lengths 1 before one dimension, whole after it): so the boxes' bytes, one
// after the other, are exactly the array's bytes [lo, hi) * itemsize. At most 2 * ndim - 1 boxes.
void FlatRangeBoxes(const std::vector<uint64_t>& shape, size_t d, const Box& prefix, uint64_t lo, uint64_t hi,
                    std::vector<Box>* out) {
  if (lo >= hi) return;
  if (d == shape.size()) {  // a single element: [0, 1)
    out->push_back(prefix);
    return;
  }
  uint64_t inner = 1;
  for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  uint64_t i0 = lo / inner;
  const uint64_t r0 = lo % inner, i1 = hi / inner, r1 = hi % inner;
  auto slab = [&](uint64_t index) {
    Box b = prefix;
    b.offset[d] = index;
    b.length[d] = 1;
    return b;
  };
  if (r0 != 0) {
    if (i0 == i1) return FlatRangeBoxes(shape, d + 1, slab(i0), r0, r1, out);
    FlatRangeBoxes(shape, d + 1, slab(i0), r0, inner, out);
    ++i0;
  }
  if (i1 > i0) {
    Box b = prefix;
    b.offset[d] = i0;
    b.length[d] = i1 - i0;
    out->push_back(b);
  }
  if (r1 != 0) FlatRangeBoxes(shape, d + 1, slab(i1), 0, r1, out);
}

// Everything the writing threads of one process share.
class FileWriter {
 public:
  FileWriter(Reader* reader, Storage* storage, const SafetensorsExportOptions& options, uint64_t total_here)
      : reader_(reader), storage_(storage), options_(options), total_here_(total_here) {}

  // Where a writing thread's time went (DCKPT_EXPORT_TRACE=1 prints it).
  struct Times {
    std::chrono::steady_clock::duration fill{}, wait{}, sync{};
  };

  // One writing thread's pipeline, across the files it writes: a ring of whole `size`-byte buffers used round robin,
  // each written at a multiple of `size` in its file, with up to bufs.size() - 1 writes in flight while the next
  // buffer is filled. A file's end does not drain the pipeline: once its last write completes, the file is truncated
  // to its size, synced and closed on a thread of its own while the next file's writes go on.
  class Stream {
   public:
    Stream(FileWriter* writer, std::vector<char*> bufs, uint64_t size, Times* times)
        : w_(writer), bufs_(std::move(bufs)), size_(size), times_(times) {}
    ~Stream() { (void)Finish(); }

    // Queues every byte of `file` (created at `path`); returns once its last buffer is queued.
    Status Write(const ShardFile& file, const std::string& path) {
      auto created = w_->storage_->CreateFile(path);
      if (!created.ok()) return created.status();
      std::shared_ptr<WritableFile> out(std::move(*created));
      out->ExpectWrites({{0, file.size}});
      DCKPT_RETURN_IF_ERROR(out->Preallocate(file.size));
      for (uint64_t pos = 0; pos < file.size; pos += size_) {
        if (w_->stop_.load()) return Status(StatusCode::kPeer, "stopped: another writing thread failed");
        while (writes_ + 1 >= bufs_.size()) DCKPT_RETURN_IF_ERROR(WaitOldest());  // frees the next buffer
        const uint64_t len = std::min(size_, file.size - pos);
        char* buf = bufs_[next_buf_];
        next_buf_ = (next_buf_ + 1) % bufs_.size();
        const auto t0 = std::chrono::steady_clock::now();
        uint64_t tensor_bytes = 0;
        Status st = w_->Fill(file, pos, len, buf, &tensor_bytes);
        times_->fill += std::chrono::steady_clock::now() - t0;
        DCKPT_RETURN_IF_ERROR(st);
        // The write holds the file: a failure returns from here with writes still in flight (Finish waits for them).
        pending_.push_back(
            {std::async(std::launch::async, [out, pos, buf, len] { return out->WriteAt(pos, buf, len); }), tensor_bytes,
             nullptr, 0, &file});
        ++writes_;
      }
      pending_.push_back({std::future<Status>(), 0, std::move(out), file.size, &file});  // then finish the file
      return OkStatus();
    }

    // Waits for every write and every file's sync; the first failure (naming its file), else OK.
    Status Finish() {
      Status first;
      while (!pending_.empty()) {
        Status st = WaitOldest();
        if (first.ok() && !st.ok()) first = st;
      }
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& [file, done] : finishing_) {
        Status st = done.get();
        if (first.ok() && !st.ok()) first = st.WithContext("syncing '" + file->name + "'");
      }
      finishing_.clear();
      times_->sync += std::chrono::steady_clock::now() - t0;
      return first;
    }

   private:
    struct Pending {
      std::future<Status> write;  // a write, or (invalid) the marker after a file's last write
      uint64_t tensor_bytes;
      std::shared_ptr<WritableFile> out;  // marker: the file to finish
      uint64_t size;
      const ShardFile* file;
    };

    // Waits for the oldest write and reports its bytes; or, for a marker, starts finishing its file (every write of
    // it has completed: they are older). After a failure, files are closed without being synced.
    Status WaitOldest() {
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      if (!p.write.valid()) {
        if (failed_) return OkStatus();
        std::shared_ptr<WritableFile> out = std::move(p.out);
        const uint64_t size = p.size;
        finishing_.emplace_back(p.file, std::async(std::launch::async, [out, size]() -> Status {
                                  DCKPT_RETURN_IF_ERROR(out->Truncate(size));
                                  DCKPT_RETURN_IF_ERROR(out->Sync());
                                  return out->Close();
                                }));
        return OkStatus();
      }
      --writes_;
      const auto t0 = std::chrono::steady_clock::now();
      Status st = p.write.get();
      times_->wait += std::chrono::steady_clock::now() - t0;
      if (st.ok()) st = w_->Written(p.tensor_bytes);
      if (!st.ok()) {
        failed_ = true;
        return st.WithContext("writing '" + p.file->name + "'");
      }
      return OkStatus();
    }

    FileWriter* w_;
    const std::vector<char*> bufs_;
    const uint64_t size_;
    Times* times_;
    std::deque<Pending> pending_;  // oldest first
    size_t writes_ = 0;            // writes in pending_
    size_t next_buf_ = 0;
    bool failed_ = false;
    std::vector<std::pair<const ShardFile*, std::future<Status>>> finishing_;
  };

  void Stop() { stop_.store(true); }

  static std::string Trace(const Times& t) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "fill (read+verify) %.3f s, waiting for writes %.3f s, sync %.3f s", Seconds(t.fill),
                  Seconds(t.wait), Seconds(t.sync));
    return buf;
  }

 private:
  // Fills `buf` with the file's bytes [pos, pos + len): the header's, then the tensors' read from the checkpoint in
  // one planned pass (every tensor region a box of contiguous bytes, read straight into its place in the buffer).
  Status Fill(const ShardFile& file, uint64_t pos, uint64_t len, char* buf, uint64_t* tensor_bytes) {
    const uint64_t end = pos + len;
    const uint64_t head = file.head.size();
    if (pos < head) std::memcpy(buf, file.head.data() + pos, std::min(end, head) - pos);
    // The first tensor that ends after pos (tensors are in file order, contiguous after the header).
    auto it = std::upper_bound(file.tensors.begin(), file.tensors.end(), pos,
                               [&](uint64_t p, const TensorToExport& t) { return p < head + t.begin + t.nbytes; });
    std::vector<Reader::EntryTargets> work;
    std::vector<Box> boxes;
    for (; it != file.tensors.end() && head + it->begin < end; ++it) {
      const TensorToExport& t = *it;
      const uint64_t start = head + t.begin;
      const uint64_t a = std::max(pos, start) - start, b = std::min(end, start + t.nbytes) - start;
      if (a >= b) continue;
      const uint64_t itemsize = DTypeSize(t.dtype);
      boxes.clear();
      Box whole;
      whole.ndim = static_cast<uint32_t>(t.shape.size());
      for (size_t k = 0; k < t.shape.size(); ++k) whole.length[k] = t.shape[k];
      FlatRangeBoxes(t.shape, 0, whole, a / itemsize, b / itemsize, &boxes);
      Reader::EntryTargets et;
      et.entry = t.entry;
      char* dst = buf + (start + a - pos);
      for (const Box& box : boxes) {
        et.targets.push_back(ReadTarget{box, dst, MemoryLocation()});
        dst += box.volume() * itemsize;
      }
      work.push_back(std::move(et));
      *tensor_bytes += b - a;
    }
    if (work.empty()) return OkStatus();
    return reader_->ReadMany(work);
  }

  Status Written(uint64_t tensor_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    done_ += tensor_bytes;
    if (options_.progress && options_.progress(done_, total_here_) != 0) {
      return Status(StatusCode::kUser, "aborted by the progress callback");
    }
    return OkStatus();
  }

  Reader* reader_;
  Storage* storage_;
  const SafetensorsExportOptions& options_;
  const uint64_t total_here_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  uint64_t done_ = 0;
};

// The aligned memory of the writing threads.
struct AlignedBuffer {
  explicit AlignedBuffer(uint64_t size)
      : p(static_cast<char*>(std::aligned_alloc(kPage, (size + kPage - 1) / kPage * kPage))) {}
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* p;
};

}  // namespace

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kC128:
    case DType::kInvalid:
      return nullptr;
    default:
      // distckpt's canonical names are safetensors' names wherever safetensors has the dtype (DESIGN.md, Dtypes).
      return DTypeName(dtype);
  }
}

namespace {

// What every rank computes alike from the metadata and the options: the files, their layout and their writers.
struct ExportPlan {
  SafetensorsExportSummary summary;
  std::vector<ShardFile> files;
};

Result<ExportPlan> PlanExport(const std::string& ckpt_path, const MetadataView& meta,
                              const SafetensorsExportOptions& options, int world) {
  ExportPlan plan;
  SafetensorsExportSummary& summary = plan.summary;
  DCKPT_ASSIGN_OR_RETURN(NameRules rules, NameRules::Compile(options.rename_rules));

  std::vector<size_t> entries;
  std::vector<std::string> names;
  for (size_t i = 0; i < meta.num_entries(); ++i) {
    EntryView e = meta.entry(i);
    if (e.kind != EntryKind::kTensor) {
      ++summary.skipped_bytes_entries;
      continue;
    }
    entries.push_back(i);
    names.emplace_back(e.name);
  }
  auto mapped = rules.MapAll(names);
  if (!mapped.ok()) return mapped.status().WithContext("safetensors export of '" + ckpt_path + "'");

  // Tensors in order of their exported names; fail on a dtype safetensors lacks before writing anything.
  std::vector<TensorToExport> tensors;
  for (size_t k = 0; k < entries.size(); ++k) {
    if (!(*mapped)[k]) {
      ++summary.dropped_tensors;
      continue;
    }
    EntryView e = meta.entry(entries[k]);
    if (SafetensorsDTypeName(e.dtype) == nullptr) {
      return Unsupported("safetensors export of '" + ckpt_path + "': tensor '" + std::string(e.name) + "' is " +
                         DTypeName(e.dtype) +
                         ", which safetensors cannot represent; convert it (e.g. to two F64 tensors), or leave it out "
                         "with a rename rule whose replacement is empty");
    }
    TensorToExport t;
    t.entry = entries[k];
    t.name = std::move(*(*mapped)[k]);
    t.dtype = e.dtype;
    t.shape.assign(e.shape.begin(), e.shape.end());
    t.nbytes = e.nbytes();
    summary.total_size += t.nbytes;
    tensors.push_back(std::move(t));
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorToExport& a, const TensorToExport& b) { return a.name < b.name; });
  summary.num_tensors = tensors.size();

  // "__metadata__": the user metadata, plus format=pt unless the user set a format.
  std::map<std::string, std::string> user;
  for (size_t i = 0; i < meta.num_user(); ++i) {
    auto kv = meta.user(i);
    user.emplace(std::string(kv.first), std::string(kv.second));
  }
  user.emplace("format", "pt");
  std::string metadata_json = "\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : user) {
    if (!first) metadata_json += ",";
    first = false;
    metadata_json += JsonQuote(k) + ":" + JsonQuote(v);
  }
  metadata_json += "}";

  // Assign tensors to files in name order, bounding each file's size (header included).
  const uint64_t base_bytes = 8 + 2 + metadata_json.size() + 7;  // length prefix, braces, metadata, padding
  std::vector<ShardFile>& shards = plan.files;
  shards.emplace_back();
  uint64_t current = base_bytes;
  for (TensorToExport& t : tensors) {
    const uint64_t add = TensorHeaderBound(t) + t.nbytes;
    if (!shards.back().tensors.empty() && current + add > options.max_shard_bytes) {
      shards.emplace_back();
      current = base_bytes;
    }
    current += add;
    shards.back().tensors.push_back(std::move(t));
  }

  for (size_t s = 0; s < shards.size(); ++s) {
    ShardFile& shard = shards[s];
    shard.name = FileName(options.prefix, s, shards.size());
    // Largest elements first keeps every tensor aligned to its element size (safetensors' own writer does this).
    std::stable_sort(shard.tensors.begin(), shard.tensors.end(), [](const TensorToExport& a, const TensorToExport& b) {
      const size_t sa = DTypeSize(a.dtype), sb = DTypeSize(b.dtype);
      return sa != sb ? sa > sb : a.name < b.name;
    });
    std::string header = "{" + metadata_json;
    for (TensorToExport& t : shard.tensors) {
      t.begin = shard.tensor_bytes;
      shard.tensor_bytes += t.nbytes;
      header += "," + TensorHeader(t);
    }
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');
    shard.head.assign(8, '\0');
    const uint64_t n = header.size();
    for (int b = 0; b < 8; ++b) shard.head[b] = static_cast<char>((n >> (8 * b)) & 0xff);
    shard.head += header;
    shard.size = shard.head.size() + shard.tensor_bytes;
    summary.files.push_back(shard.name);
  }

  // Files to ranks, balanced by bytes: largest first, each to the rank with the fewest bytes so far (the lowest rank
  // on a tie), so every rank computes the same assignment.
  std::vector<size_t> order(shards.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return shards[a].size > shards[b].size; });
  std::vector<uint64_t> load(static_cast<size_t>(std::max(world, 1)), 0);
  for (size_t i : order) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    shards[i].rank = static_cast<int>(r);
    load[r] += shards[i].size;
  }
  return plan;
}

// The index: weight_map sorted by tensor name, as Hugging Face writes it.
std::string IndexJson(const ExportPlan& plan) {
  std::map<std::string_view, const std::string*> weight_map;
  for (const ShardFile& shard : plan.files) {
    for (const TensorToExport& t : shard.tensors) weight_map.emplace(t.name, &shard.name);
  }
  std::string index = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(plan.summary.total_size) +
                      "\n  },\n  \"weight_map\": {";
  bool first = true;
  for (const auto& [name, file] : weight_map) {
    index += first ? "\n    " : ",\n    ";
    first = false;
    index += JsonQuote(name) + ": " + JsonQuote(*file);
  }
  index += first ? "}\n}\n" : "\n  }\n}\n";
  return index;
}

}  // namespace

Result<SafetensorsExportSummary> ExportSafetensors(const std::string& ckpt_path, const std::string& out_dir,
                                                   const SafetensorsExportOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  std::unique_ptr<Communicator> single;
  Communicator* comm = options.comm;
  if (comm == nullptr) {
    single = NewSingleProcessCommunicator();
    comm = single.get();
  }
  const int rank = comm->rank();
  const std::chrono::milliseconds timeout = options.timeout;
  const std::string what = "safetensors export of '" + ckpt_path + "' into '" + out_dir + "'";
  Storage* storage = options.out_storage ? options.out_storage : options.storage ? options.storage : DefaultStorage();
  // Object stores have no rename and no directories: files go straight to their names.
  const bool direct = storage->commit_protocol() == CommitProtocol::kMetadataLast;
  const std::string index_name = options.prefix + ".safetensors.index.json";

  // 1. Arguments, checked on every rank; the ranks agree before the collective open, so that one rank's bad
  //    directory fails all of them at once.
  Status local = [&]() -> Status {
    if (options.prefix.empty() || !IsValidFileName(index_name)) {
      return InvalidArgument("safetensors export: prefix '" + options.prefix +
                             "' is not a plain file name (no '/', no '..', no control characters)");
    }
    if (options.max_shard_bytes == 0) return InvalidArgument("safetensors export: max_shard_bytes must be > 0");
    DCKPT_ASSIGN_OR_RETURN(bool is_dir, direct ? Result<bool>(true) : storage->IsDirectory(out_dir));
    if (!is_dir) {
      return NotFound("safetensors export: output directory '" + out_dir + "' does not exist; create it first");
    }
    return OkStatus();
  }();
  DCKPT_RETURN_IF_ERROR(AgreeOnStatus(comm, local, timeout));

  ReadOptions ro;
  ro.verify = options.verify;
  ro.storage = options.storage;
  ro.timeout = timeout;
  // The reader reads what is not in the page cache through buffers of its own, one segment (8 MiB) per I/O thread:
  // as many threads as the budget has room for (a quarter of it), at least one, at most the default.
  ro.io_threads =
      static_cast<size_t>(std::clamp<uint64_t>(options.buffer_bytes / 4 / kReaderSegmentBytes, 1, DefaultIoThreads()));
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader,
                         Reader::Open(ckpt_path, comm->size() > 1 ? comm : nullptr, ro));

  // 2. The plan (the same on every rank), then rank 0's nonce names every temporary file. Where files are written
  //    straight to their names (object stores), an earlier export's index goes before any of them is replaced.
  const std::string index_path = out_dir + "/" + index_name;
  Result<ExportPlan> planned = PlanExport(ckpt_path, reader->metadata(), options, comm->size());
  Status ready = planned.status();
  if (ready.ok() && direct && rank == 0) ready = storage->RemoveAll(index_path).WithContext(what);
  const std::string my_nonce = NewNonce();
  DCKPT_ASSIGN_OR_RETURN(std::string nonce, CoordinatorRound(comm, ready, "", timeout,
                                                             [&](std::vector<std::string>&) { return my_nonce; }));
  ExportPlan& plan = *planned;
  SafetensorsExportSummary& summary = plan.summary;
  auto path_of = [&](const ShardFile& f) { return out_dir + "/" + (direct ? f.name : TempName(f.name, nonce)); };

  // 3. This rank's files, by io_threads threads at once, largest first.
  std::vector<const ShardFile*> mine;
  uint64_t total_here = 0;
  for (const ShardFile& f : plan.files) {
    if (f.rank != rank) continue;
    mine.push_back(&f);
    total_here += f.tensor_bytes;
  }
  std::stable_sort(mine.begin(), mine.end(), [](const ShardFile* a, const ShardFile* b) { return a->size > b->size; });
  const size_t threads = std::max<size_t>(
      1, std::min<size_t>(options.io_threads ? options.io_threads : 1, std::max<size_t>(mine.size(), 1)));
  // Each thread's ring of buffers: kRing of them where the budget gives each whole pages, else two; never larger
  // than the largest file needs. One buffer's worth of the budget is left for the checkpoint's pages the reader has
  // mapped while it fills a buffer (it releases them once copied), so that the whole stays within buffer_bytes.
  uint64_t largest = 0;
  for (const ShardFile* f : mine) largest = std::max(largest, f->size);
  const uint64_t share = options.buffer_bytes / threads;
  const size_t ring = share / (kRing + 1) >= kPage ? kRing : 2;
  uint64_t bytes = std::max<uint64_t>(kMinBufferBytes, share / (ring + 1));
  bytes = bytes >= kPage ? bytes / kPage * kPage : bytes / kMinBufferBytes * kMinBufferBytes;
  bytes = std::min(bytes, std::max<uint64_t>(kMinBufferBytes, (largest + kPage - 1) / kPage * kPage));

  FileWriter writer(reader.get(), storage, options, total_here);
  std::vector<Status> statuses(threads);
  std::vector<FileWriter::Times> times(threads);
  std::atomic<size_t> next{0};
  auto work = [&](size_t id) {
    std::vector<std::unique_ptr<AlignedBuffer>> owned;
    std::vector<char*> bufs;
    for (size_t b = 0; b < ring && !mine.empty(); ++b) {
      owned.push_back(std::make_unique<AlignedBuffer>(bytes));
      bufs.push_back(owned.back()->p);
      if (bufs.back() == nullptr) {
        statuses[id] = Status(StatusCode::kNoMemory, "cannot allocate " + std::to_string(ring) + " export buffers of " +
                                                         std::to_string(bytes) + " bytes (buffer_bytes)");
        writer.Stop();
        return;
      }
    }
    FileWriter::Stream stream(&writer, std::move(bufs), bytes, &times[id]);
    for (size_t i; (i = next.fetch_add(1)) < mine.size();) {
      Status st = stream.Write(*mine[i], path_of(*mine[i]));
      if (!st.ok()) {
        statuses[id] = st.WithContext("writing '" + mine[i]->name + "'");
        writer.Stop();
        break;
      }
    }
    Status st = stream.Finish();
    if (!st.ok()) {
      if (statuses[id].ok()) statuses[id] = st;
      writer.Stop();
    }
  };
  if (threads == 1) {
    work(0);
  } else {
    std::vector<std::thread> pool;
    for (size_t id = 0; id < threads; ++id) pool.emplace_back(work, id);
    for (std::thread& t : pool) t.join();
  }
  Status written;
  for (const Status& st : statuses) {
    // A thread stopped because another failed says so; report the failure itself.
    if (!st.ok() && (written.ok() || written.code() == StatusCode::kPeer)) written = st;
  }
  if (!written.ok()) written = written.WithContext(what);
  for (const ShardFile* f : mine) {
    summary.bytes_written_here += f->size;
    ++summary.files_written_here;
  }
  if (TraceEnabled()) {
    for (size_t id = 0; id < threads; ++id) {
      std::fprintf(stderr, "[distckpt export] rank %d thread %zu: %s\n", rank, id,
                   FileWriter::Trace(times[id]).c_str());
    }
    std::fprintf(
        stderr, "[distckpt export] rank %d: %zu files, %llu bytes in %.3f s (buffers %zu x %llu bytes x %zu)\n", rank,
        mine.size(), static_cast<unsigned long long>(summary.bytes_written_here),
        Seconds(std::chrono::steady_clock::now() - started), ring, static_cast<unsigned long long>(bytes), threads);
  }

  // 4. Every rank's files are durable (or someone failed: then each rank removes its own, and no index appears).
  auto remove_mine = [&]() {
    for (const ShardFile* f : mine) (void)storage->RemoveAll(path_of(*f));
  };
  if (Status st = AgreeOnStatus(comm, written, timeout); !st.ok()) {
    remove_mine();
    return st;
  }

  // 5. Rank 0 commits: the index of an earlier export goes first (so that no index ever lists a mix of old and new
  //    files), then the files move into place, then the new index, made durable.
  Status committed;
  if (rank == 0) {
    committed = [&]() -> Status {
      const std::string index = IndexJson(plan);
      if (direct) return storage->WriteFileDurably(index_path, index);
      DCKPT_RETURN_IF_ERROR(storage->RemoveAll(index_path));
      DCKPT_RETURN_IF_ERROR(storage->SyncDir(out_dir));
      for (const ShardFile& f : plan.files) {
        const std::string final_path = out_dir + "/" + f.name;
        DCKPT_RETURN_IF_ERROR(storage->RemoveAll(final_path));
        DCKPT_RETURN_IF_ERROR(storage->Rename(path_of(f), final_path));
      }
      const std::string index_tmp = out_dir + "/" + TempName(index_name, nonce);
      DCKPT_RETURN_IF_ERROR(storage->WriteFileDurably(index_tmp, index));
      if (Status st = storage->Rename(index_tmp, index_path); !st.ok()) {
        (void)storage->RemoveAll(index_tmp);
        return st;
      }
      return storage->SyncDir(out_dir);
    }();
    if (!committed.ok()) {
      committed = committed.WithContext(what);
      for (const ShardFile& f : plan.files) {
        if (!direct) (void)storage->RemoveAll(path_of(f));  // those not yet renamed
      }
    }
  }
  DCKPT_RETURN_IF_ERROR(AgreeOnStatus(comm, committed, timeout));
  summary.index_file = index_name;
  return summary;
}

}  // namespace distckpt
