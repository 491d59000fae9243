// ObjectStorage: the Storage interface over an ObjectClient (object_storage.h), and the in-memory object store.
#include "core/storage/object/object_storage.h"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/storage/backend_util.h"
#include "core/storage/object/read_blocks.h"

namespace distckpt {
namespace {

using internal_storage::CheckRange;
using internal_storage::ClosedFileError;
using internal_storage::Quoted;
using internal_storage::TruncatedFileError;

// Lexical normalisation: collapses "//" and ".", resolves ".." (which stops at the root), drops trailing slashes; a
// leading '/' is kept.
std::string Normalize(const std::string& full) {
  // A URL's "scheme://" is kept as written ("s3://bucket/key"): only what follows it is normalised.
  std::string scheme;
  const size_t sep = full.find("://");
  if (sep != std::string::npos && sep > 0 && std::all_of(full.begin(), full.begin() + sep, [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
      })) {
    scheme = full.substr(0, sep + 3);
  }
  const std::string path = full.substr(scheme.size());
  const std::vector<std::string> parts = internal_storage::LexicalComponents(path);
  std::string out = scheme + (!path.empty() && path[0] == '/' ? "/" : "");
  for (size_t k = 0; k < parts.size(); ++k) out += (k ? "/" : "") + parts[k];
  return out;
}

std::string Join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir == "/" ? "/" + name : dir + "/" + name;
}

// Bounds the Write and Read calls in flight across all files of one storage.
class Gate {
 public:
  explicit Gate(unsigned n) : free_(n) {}
  void Enter() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return free_ > 0; });
    --free_;
  }
  void Leave() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++free_;
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  unsigned free_;
};

class GateHold {
 public:
  explicit GateHold(Gate* gate) : gate_(gate) { gate_->Enter(); }
  ~GateHold() { gate_->Leave(); }
  GateHold(const GateHold&) = delete;
  GateHold& operator=(const GateHold&) = delete;

 private:
  Gate* gate_;
};

struct Shared {
  std::shared_ptr<ObjectClient> client;
  Gate gate;
  uint64_t part_size;
  unsigned max_part_buffers;
  std::shared_ptr<PartMemory> part_memory;
  std::unique_ptr<ReadBlocks> blocks;  // null: no read coalescing
  Shared(std::shared_ptr<ObjectClient> c, const ObjectStorageOptions& o)
      : client(std::move(c)),
        gate(o.max_in_flight ? o.max_in_flight : 16),
        part_size(o.part_size),
        max_part_buffers(o.max_part_buffers ? o.max_part_buffers : 4),
        part_memory(o.part_memory),
        blocks(o.read_block_size > 1
                   ? std::make_unique<ReadBlocks>(o.read_block_size, o.max_read_blocks ? o.max_read_blocks : 8)
                   : nullptr) {}
};

// The object is started on the first write (or Preallocate, whose size becomes the client's size hint) and published
// by Close; dropping the file unclosed discards it.
// Truncate of an upload: it can only grow (the bytes past what was written read as zeros).
Status GrowTo(const std::string& path, uint64_t size, uint64_t* end) {
  if (size < *end) {
    return Unsupported("truncating " + Quoted(path) + " to " + std::to_string(size) + " bytes below the " +
                       std::to_string(*end) + " already written: an object store cannot shrink an upload");
  }
  *end = size;
  return OkStatus();
}

class ObjectWritableFile final : public WritableFile {
 public:
  ObjectWritableFile(std::shared_ptr<Shared> shared, std::string path)
      : shared_(std::move(shared)), path_(std::move(path)) {}
  ~ObjectWritableFile() override {
    if (upload_ != nullptr && !closed_) (void)upload_->Close(0, /*discard=*/true);
  }

  Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, offset, size));
    DCKPT_ASSIGN_OR_RETURN(ObjectUpload * upload, Started(0, "writing to"));
    {
      std::lock_guard<std::mutex> lock(mu_);
      end_ = std::max(end_, offset + size);
    }
    if (size == 0) return OkStatus();
    GateHold hold(&shared_->gate);
    return upload->Write(offset, data, size)
        .WithContext("writing " + std::to_string(size) + " bytes at offset " + std::to_string(offset) + " of " +
                     Quoted(path_));
  }

  Status Preallocate(uint64_t size) override {
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, 0, size));
    return Started(size, "preallocating").status();
  }

  Status Truncate(uint64_t size) override {
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, 0, size));
    DCKPT_RETURN_IF_ERROR(Started(size, "truncating").status());
    std::lock_guard<std::mutex> lock(mu_);
    return GrowTo(path_, size, &end_);
  }

  Status Sync() override {
    DCKPT_ASSIGN_OR_RETURN(ObjectUpload * upload, Started(0, "syncing"));
    return upload->Sync().WithContext("syncing " + Quoted(path_));
  }

  Status Close() override {
    DCKPT_ASSIGN_OR_RETURN(ObjectUpload * upload, Started(0, "closing"));
    uint64_t size;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      size = end_;
    }
    return upload->Close(size, /*discard=*/false).WithContext("writing " + Quoted(path_));
  }

  const std::string& path() const override { return path_; }

 private:
  // The upload, started now if need be; fails once the file is closed.
  Result<ObjectUpload*> Started(uint64_t size_hint, const char* operation) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return ClosedFileError(path_, operation);
    if (upload_ == nullptr) {
      auto upload = shared_->client->Create(path_, size_hint);
      if (!upload.ok()) return upload.status().WithContext("creating " + Quoted(path_));
      upload_ = std::move(upload).value();
    }
    return upload_.get();
  }

  const std::shared_ptr<Shared> shared_;
  const std::string path_;
  std::mutex mu_;
  std::unique_ptr<ObjectUpload> upload_;
  uint64_t end_ = 0;
  bool closed_ = false;
};

// ---- Files assembled into parts (a client with multipart uploads) --------------------------------------------------

constexpr uint64_t kDefaultPartSize = uint64_t{8} << 20;
constexpr uint64_t kMaxParts = 10000;  // S3's limit: the part size grows with the size hint to stay below it

// A file written to a client with parts: writes are copied into part buffers, and each part goes up (UploadPart,
// through the storage's in-flight gate) as soon as the bytes expected in it are in and the parts before it have gone,
// so a file is streamed with at most `max_part_buffers` parts held while its writes arrive in order. A write further
// ahead waits for the window to move while other writes or uploads of the file are running (they move it), and
// otherwise takes more buffers (a writer that jumps around still finishes, holding more memory). The upload begins
// with the first part sent; a file that never fills one part goes up through Create/Write/Close on close. A failure
// or a discard aborts the upload, so no part is left behind.
class PartedWritableFile final : public WritableFile {
 public:
  PartedWritableFile(std::shared_ptr<Shared> shared, std::string path)
      : shared_(std::move(shared)), path_(std::move(path)), limit_(shared_->max_part_buffers) {}
  ~PartedWritableFile() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    cv_.wait(lock, [&] { return active_ == 0 && sending_ == 0; });
    if (upload_ != nullptr) (void)upload_->Abort();
    FreeAll();
  }

  Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, offset, size));
    std::unique_lock<std::mutex> lock(mu_);
    DCKPT_RETURN_IF_ERROR(Usable("writing to"));
    Start();
    if (size == 0) {
      end_ = std::max(end_, offset);
      return OkStatus();
    }
    if (offset / part_size_ < next_send_) {
      return InvalidArgument("writing " + std::to_string(size) + " bytes at offset " + std::to_string(offset) + " of " +
                             Quoted(path_) + ": part " + std::to_string(offset / part_size_ + 1) +
                             " was already uploaded (the bytes expected in it were all written)");
    }
    // Part by part, so that a write spanning many parts streams like many writes.
    const char* src = static_cast<const char*>(data);
    for (uint64_t pos = offset, end = offset + size; pos < end;) {
      const uint64_t k = pos / part_size_, n = std::min(end, (k + 1) * part_size_) - pos;
      DCKPT_RETURN_IF_ERROR(WriteInPart(lock, k, pos, src, n));
      pos += n;
      src += n;
    }
    return OkStatus();
  }

  Status Preallocate(uint64_t size) override {
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, 0, size));
    std::lock_guard<std::mutex> lock(mu_);
    DCKPT_RETURN_IF_ERROR(Usable("preallocating"));
    if (part_size_ == 0) size_hint_ = std::max(size_hint_, size);
    return OkStatus();
  }

  void ExpectWrites(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (part_size_ != 0 || closed_) return;  // only before the first write
    expected_ = ranges;
    std::sort(expected_.begin(), expected_.end());
    has_expected_ = true;
  }

  Status Truncate(uint64_t size) override {
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, 0, size));
    std::lock_guard<std::mutex> lock(mu_);
    DCKPT_RETURN_IF_ERROR(Usable("truncating"));
    return GrowTo(path_, size, &end_);
  }

  // The object is durable once Close publishes it; there is nothing to flush before.
  Status Sync() override {
    std::lock_guard<std::mutex> lock(mu_);
    return Usable("syncing");
  }

  Status Close() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_ || closing_) return ClosedFileError(path_, "closing");  // a failed upload goes on: it is aborted
    Start();
    closing_ = true;
    cv_.wait(lock, [&] { return active_ == 0 && sending_ == 0; });
    closed_ = true;
    Status st = failed_.ok() ? Finish(lock) : failed_;
    if (!st.ok() && upload_ != nullptr) (void)upload_->Abort();
    upload_.reset();
    FreeAll();
    return st.ok() ? st : st.WithContext("writing " + Quoted(path_));
  }

  const std::string& path() const override { return path_; }

 private:
  struct Part {
    std::unique_ptr<char[]> data;  // part_size_ bytes, zeroed
    uint64_t written = 0;          // bytes written into it
    uint64_t expected = 0;         // bytes that will be written into it
    bool sending = false;
  };

  // Copies n bytes at file offset pos, all inside part k, into its buffer, then sends what became ready.
  Status WriteInPart(std::unique_lock<std::mutex>& lock, uint64_t k, uint64_t pos, const char* src, uint64_t n) {
    // Wait for the window to reach part k, while something running can move it.
    while (k >= Base() + limit_) {
      if (active_ == 0 && sending_ == 0) {
        limit_ = static_cast<unsigned>(k - Base() + 1);
        break;
      }
      cv_.wait(lock);
      DCKPT_RETURN_IF_ERROR(Usable("writing to"));
    }
    char* dst = Buffer(k).data.get() + (pos - k * part_size_);
    ++active_;
    lock.unlock();
    // Disjoint ranges: no other write touches these bytes, and the part is not sent before they are counted.
    std::memcpy(dst, src, static_cast<size_t>(n));
    lock.lock();
    --active_;
    parts_[k].written += n;
    end_ = std::max(end_, pos + n);
    cv_.notify_all();
    return SendReady(lock);
  }

  Status Usable(const char* operation) {
    if (closed_ || closing_) return ClosedFileError(path_, operation);
    return failed_;
  }

  // Fixes the part size (at the first write or close; the size hint is known by then).
  void Start() {
    if (part_size_ != 0) return;
    uint64_t size = shared_->part_size ? shared_->part_size : shared_->client->min_part_size();
    if (size == 0) size = kDefaultPartSize;
    size = std::max(size, shared_->client->min_part_size());
    const uint64_t mib = uint64_t{1} << 20;
    const uint64_t needed = (size_hint_ + kMaxParts - 1) / kMaxParts;
    if (needed > size) size = (needed + mib - 1) / mib * mib;
    part_size_ = size;
  }

  // The lowest part whose buffer may still be held.
  uint64_t Base() const { return parts_.empty() ? next_send_ : std::min(parts_.begin()->first, next_send_); }

  Part& Buffer(uint64_t k) {
    Part& part = parts_[k];
    if (part.data == nullptr) {
      part.data.reset(new char[part_size_]());
      part.expected = Expected(k);
      if (shared_->part_memory != nullptr) {
        const uint64_t now = shared_->part_memory->now.fetch_add(part_size_) + part_size_;
        uint64_t peak = shared_->part_memory->peak.load();
        while (now > peak && !shared_->part_memory->peak.compare_exchange_weak(peak, now)) {
        }
      }
    }
    return part;
  }

  void Free(uint64_t k) {
    auto it = parts_.find(k);
    if (it == parts_.end()) return;
    if (shared_->part_memory != nullptr) shared_->part_memory->now.fetch_sub(part_size_);
    parts_.erase(it);
  }

  void FreeAll() {
    while (!parts_.empty()) Free(parts_.begin()->first);
  }

  // The bytes of part k that will be written: all of it, or what the ranges given to ExpectWrites put in it.
  uint64_t Expected(uint64_t k) const {
    if (!has_expected_) return part_size_;
    const uint64_t lo = k * part_size_, hi = lo + part_size_;
    // The ranges are sorted by offset and disjoint: start at the last one beginning at or before lo.
    auto it = std::upper_bound(expected_.begin(), expected_.end(), std::make_pair(lo, UINT64_MAX));
    if (it != expected_.begin()) --it;
    uint64_t n = 0;
    for (; it != expected_.end() && it->first < hi; ++it) {
      const uint64_t a = std::max(lo, it->first), b = std::min(hi, it->first + it->second);
      if (b > a) n += b - a;
    }
    return n;
  }

  // Sends, in order, every part whose expected bytes are in and whose end has been written past (so that it is a
  // full part: the file cannot end inside it).
  Status SendReady(std::unique_lock<std::mutex>& lock) {
    while (failed_.ok() && !closing_) {
      const uint64_t k = next_send_;
      if (end_ < (k + 1) * part_size_) break;
      auto held = parts_.find(k);
      if (held == parts_.end() ? Expected(k) > 0 : held->second.written < held->second.expected) break;
      Part& part = Buffer(k);  // a part nothing is written into goes up as zeros
      if (upload_ == nullptr) {
        auto begun = shared_->client->BeginParts(path_, size_hint_);
        if (!begun.ok()) return Fail(begun.status().WithContext("starting the upload of " + Quoted(path_)));
        upload_ = std::move(begun).value();
      }
      part.sending = true;
      ++next_send_;
      ++sending_;
      ObjectPartUpload* upload = upload_.get();
      const char* data = part.data.get();
      lock.unlock();
      Status st;
      {
        GateHold hold(&shared_->gate);
        st = upload->UploadPart(static_cast<unsigned>(k + 1), data, part_size_);
      }
      lock.lock();
      --sending_;
      Free(k);
      cv_.notify_all();
      if (!st.ok()) {
        return Fail(st.WithContext("uploading part " + std::to_string(k + 1) + " (" + std::to_string(part_size_) +
                                   " bytes) of " + Quoted(path_)));
      }
    }
    return failed_;
  }

  Status Fail(Status st) {
    if (failed_.ok()) failed_ = std::move(st);
    cv_.notify_all();
    return failed_;
  }

  // On close, with nothing running: what is left goes up (a file of at most one part not begun: in one piece).
  Status Finish(std::unique_lock<std::mutex>& lock) {
    const uint64_t size = end_;
    if (upload_ == nullptr && size <= part_size_) {
      DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectUpload> whole, shared_->client->Create(path_, size));
      if (size > 0) {
        Part& part = Buffer(0);
        GateHold hold(&shared_->gate);
        Status st = whole->Write(0, part.data.get(), static_cast<size_t>(size));
        if (!st.ok()) {
          (void)whole->Close(0, /*discard=*/true);
          return st;
        }
      }
      return whole->Close(size, /*discard=*/false);
    }
    if (upload_ == nullptr) {
      auto begun = shared_->client->BeginParts(path_, size_hint_ ? size_hint_ : size);
      if (!begun.ok()) return begun.status().WithContext("starting the upload");
      upload_ = std::move(begun).value();
    }
    const uint64_t parts = (size + part_size_ - 1) / part_size_;
    for (uint64_t k = next_send_; k < parts; ++k) {
      const char* data = Buffer(k).data.get();
      const uint64_t n = std::min(part_size_, size - k * part_size_);
      {
        GateHold hold(&shared_->gate);
        DCKPT_RETURN_IF_ERROR(upload_->UploadPart(static_cast<unsigned>(k + 1), data, static_cast<size_t>(n))
                                  .WithContext("uploading part " + std::to_string(k + 1)));
      }
      Free(k);
      next_send_ = k + 1;
    }
    // Complete is the last call on the upload, failed or not (no Abort after it).
    Status st = upload_->Complete().WithContext("completing the upload of " + std::to_string(parts) + " parts");
    upload_.reset();
    return st;
  }

  const std::shared_ptr<Shared> shared_;
  const std::string path_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t part_size_ = 0;  // 0: not started
  uint64_t size_hint_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> expected_;
  bool has_expected_ = false;
  std::map<uint64_t, Part> parts_;  // the part buffers held, by part index
  uint64_t next_send_ = 0;          // parts below it were handed to UploadPart
  unsigned limit_;                  // the window: parts at Base() + limit_ and beyond wait
  unsigned active_ = 0;             // writes copying into part buffers
  unsigned sending_ = 0;            // UploadPart calls running
  uint64_t end_ = 0;
  std::unique_ptr<ObjectPartUpload> upload_;
  Status failed_;
  bool closing_ = false, closed_ = false;
};

class ObjectReadableFile final : public ReadableFile {
 public:
  ObjectReadableFile(std::shared_ptr<Shared> shared, std::string path, uint64_t size)
      : shared_(std::move(shared)),
        path_(std::move(path)),
        size_(size),
        id_(shared_->blocks ? shared_->blocks->NewFileId() : 0) {}
  ~ObjectReadableFile() override {
    if (shared_->blocks) shared_->blocks->Forget(id_);
  }

  Status ReadAt(uint64_t offset, void* data, size_t size) const override {
    DCKPT_RETURN_IF_ERROR(CheckRange(path_, offset, size));
    if (offset > size_ || size > size_ - offset) return TruncatedFileError(path_, offset, size, size_);
    ReadBlocks* blocks = shared_->blocks.get();
    if (blocks == nullptr || size >= blocks->block_size() / 2) return ReadDirect(offset, data, size, nullptr);
    // A small read: from the blocks around it (one, or two where it straddles a boundary).
    const uint64_t bs = blocks->block_size();
    size_t done = 0;
    while (done < size) {
      const uint64_t at = offset + done;
      const uint64_t index = at / bs;
      const uint64_t lo = index * bs, hi = std::min(size_, lo + bs);
      const size_t n = static_cast<size_t>(std::min<uint64_t>(size - done, hi - at));
      DCKPT_RETURN_IF_ERROR(blocks->Read(id_, index, static_cast<size_t>(hi - lo), static_cast<size_t>(at - lo), n,
                                         static_cast<char*>(data) + done,
                                         [&](char* dst, size_t bytes, const std::function<void(size_t)>& arrived) {
                                           return ReadDirect(lo, dst, bytes, &arrived);
                                         }));
      done += n;
    }
    return OkStatus();
  }
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  // Reads [offset, offset + size) with client Reads (several where the client returns fewer bytes); `arrived`
  // (optional) is told how many bytes from `data` on are in as they come.
  Status ReadDirect(uint64_t offset, void* data, size_t size, const std::function<void(size_t)>* arrived) const {
    size_t done = 0;
    while (done < size) {
      Result<size_t> got(size_t{0});
      {
        GateHold hold(&shared_->gate);
        if (arrived == nullptr) {
          got = shared_->client->Read(path_, offset + done, static_cast<char*>(data) + done, size - done);
        } else {
          got = shared_->client->ReadArriving(path_, offset + done, static_cast<char*>(data) + done, size - done,
                                              [&](size_t n) { (*arrived)(done + n); });
        }
      }
      if (!got.ok()) {
        if (got.status().code() == StatusCode::kNotFound) {
          return NotFound("data file " + Quoted(path_) +
                          " is gone (removed after it was opened): " + got.status().message());
        }
        return got.status().WithContext("reading " + std::to_string(size) + " bytes at offset " +
                                        std::to_string(offset) + " of " + Quoted(path_));
      }
      if (*got > size - done) return Internal("reading " + Quoted(path_) + ": the storage returned too many bytes");
      // Shorter than its size when opened: replaced or truncated meanwhile.
      if (*got == 0) return TruncatedFileError(path_, offset, size, offset + done);
      done += *got;
    }
    return OkStatus();
  }

  const std::shared_ptr<Shared> shared_;
  const std::string path_;
  const uint64_t size_;
  const uint64_t id_;  // its blocks' owner in shared_->blocks
};

class ObjectStorage;

class ObjectDirectory final : public Directory {
 public:
  ObjectDirectory(ObjectStorage* storage, std::string path) : storage_(storage), path_(std::move(path)) {}
  const std::string& path() const override { return path_; }
  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& name) override;
  Result<bool> Exists(const std::string& name) override;

 private:
  ObjectStorage* storage_;
  const std::string path_;
};

class ObjectStorage final : public Storage {
 public:
  ObjectStorage(std::shared_ptr<ObjectClient> client, const ObjectStorageOptions& options)
      : shared_(std::make_shared<Shared>(std::move(client), options)) {}

  std::string name() const override { return shared_->client->name(); }
  CommitProtocol commit_protocol() const override { return CommitProtocol::kMetadataLast; }

  Status Publish(const std::string& path, const std::string& data, bool replace) override {
    const std::string p = Normalize(path);
    Status st = shared_->client->Commit(p, data, replace);
    if (st.code() != StatusCode::kUnsupported) {
      if (st.code() == StatusCode::kExists) return Status(StatusCode::kExists, Quoted(p) + " already exists");
      return st.WithContext("committing " + Quoted(p));
    }
    return Storage::Publish(p, data, replace);
  }

  Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& path) override {
    const std::string p = Normalize(path);
    if (p.empty() || p == "/") return InvalidArgument("cannot create a file at " + Quoted(path));
    if (shared_->client->has_parts()) return std::unique_ptr<WritableFile>(new PartedWritableFile(shared_, p));
    return std::unique_ptr<WritableFile>(new ObjectWritableFile(shared_, p));
  }

  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& path) override {
    const std::string p = Normalize(path);
    DCKPT_ASSIGN_OR_RETURN(uint64_t size, SizeOf(p));
    return std::unique_ptr<ReadableFile>(new ObjectReadableFile(shared_, p, size));
  }

  Result<std::string> ReadFile(const std::string& path, uint64_t max_size) override {
    DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, OpenFile(path));
    if (file->size() > max_size) {
      return Corrupt("file " + Quoted(file->path()) + " is " + std::to_string(file->size()) + " bytes, more than the " +
                     std::to_string(max_size) + " expected");
    }
    std::string out(static_cast<size_t>(file->size()), '\0');
    DCKPT_RETURN_IF_ERROR(file->ReadAt(0, &out[0], out.size()));
    return out;
  }

  Status WriteFileDurably(const std::string& path, const std::string& data) override {
    DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, CreateFile(path));
    DCKPT_RETURN_IF_ERROR(file->Preallocate(data.size()));
    DCKPT_RETURN_IF_ERROR(file->WriteAt(0, data.data(), data.size()));
    DCKPT_RETURN_IF_ERROR(file->Sync());
    return file->Close();
  }

  Result<uint64_t> FileSize(const std::string& path) override { return SizeOf(Normalize(path)); }

  Result<bool> Exists(const std::string& path) override {
    const std::string p = Normalize(path);
    auto size = shared_->client->Size(p);
    if (size.ok()) return true;
    if (size.status().code() != StatusCode::kNotFound) return size.status().WithContext("looking up " + Quoted(p));
    return IsDirectory(p);
  }

  Result<bool> IsDirectory(const std::string& path) override {
    DCKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(path));
    return !names.empty();
  }

  Status CreateDir(const std::string&) override { return OkStatus(); }
  Status SyncDir(const std::string&) override { return OkStatus(); }

  Status Rename(const std::string& from, const std::string& to) override {
    return Unsupported("renaming " + Quoted(from) + " to " + Quoted(to) + ": " + name() + " storage has no rename");
  }

  Status RemoveAll(const std::string& path) override {
    const std::string p = Normalize(path);
    if (p.empty() || p == "/") return InvalidArgument("refusing to remove everything (" + Quoted(path) + ")");
    // A file (the usual case: one call, no listing), else everything below the prefix.
    auto size = shared_->client->Size(p);
    if (size.ok()) return shared_->client->Remove(p).WithContext("removing " + Quoted(p));
    if (size.status().code() != StatusCode::kNotFound) return size.status().WithContext("looking up " + Quoted(p));
    DCKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(p));
    for (const std::string& n : names) DCKPT_RETURN_IF_ERROR(RemoveAll(Join(p, n)));
    return OkStatus();
  }

  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    const std::string p = Normalize(path);
    auto names = shared_->client->List(p);
    if (!names.ok()) return names.status().WithContext("listing " + Quoted(p));
    std::set<std::string> unique;
    for (const std::string& n : *names) {
      if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos) {
        return IoError("listing " + Quoted(p) + ": the storage returned '" + n + "', which is not a plain name");
      }
      unique.insert(n);
    }
    return std::vector<std::string>(unique.begin(), unique.end());
  }

  Result<std::unique_ptr<Directory>> OpenDirectory(const std::string& path) override {
    const std::string p = Normalize(path);
    DCKPT_ASSIGN_OR_RETURN(bool is_dir, IsDirectory(p));
    if (!is_dir) return NotFound("nothing is stored below " + Quoted(p));
    return std::unique_ptr<Directory>(new ObjectDirectory(this, p));
  }

  Result<std::string> Identity(const std::string& path) override {
    return Unsupported("the identity of " + Quoted(path) + ": " + name() + " storage has none");
  }
  Status Exchange(const std::string& a, const std::string& b) override {
    return Unsupported("exchanging " + Quoted(a) + " and " + Quoted(b) + ": " + name() + " storage has no rename");
  }
  Result<std::unique_ptr<DirectoryLock>> LockDirectory(const std::string& dir, std::chrono::milliseconds) override {
    return Unsupported("locking " + Quoted(dir) + ": " + name() + " storage has no locks");
  }

  Result<uint64_t> SizeOf(const std::string& p) {
    auto size = shared_->client->Size(p);
    if (size.ok()) return size;
    if (size.status().code() == StatusCode::kNotFound) return NotFound("file " + Quoted(p) + " not found");
    return size.status().WithContext("looking up " + Quoted(p));
  }

 private:
  std::shared_ptr<Shared> shared_;
};

Result<std::unique_ptr<ReadableFile>> ObjectDirectory::OpenFile(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return InvalidArgument("'" + name + "' in " + Quoted(path_) + " is not a plain file name");
  }
  return storage_->OpenFile(Join(path_, name));
}

Result<bool> ObjectDirectory::Exists(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return false;
  return storage_->Exists(Join(path_, name));
}

// ---- In-memory object store ----------------------------------------------------------------------------------------

class MemoryObjects;

class MemoryUpload final : public ObjectUpload {
 public:
  MemoryUpload(MemoryObjects* store, std::string path, uint64_t hint);
  Status Write(uint64_t offset, const void* data, size_t size) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (data_.size() < offset + size) data_.resize(static_cast<size_t>(offset + size));
    std::memcpy(&data_[static_cast<size_t>(offset)], data, size);
    return OkStatus();
  }
  Status Sync() override { return OkStatus(); }
  Status Close(uint64_t size, bool discard) override;

 private:
  MemoryObjects* store_;
  const std::string path_;
  std::mutex mu_;
  std::string data_;
};

class MemoryObjects final : public ObjectClient, public std::enable_shared_from_this<MemoryObjects> {
 public:
  std::string name() const override { return "memory"; }
  Result<std::unique_ptr<ObjectUpload>> Create(const std::string& path, uint64_t size_hint) override {
    return std::unique_ptr<ObjectUpload>(new MemoryUpload(this, path, size_hint));
  }
  Result<uint64_t> Size(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(path);
    if (it == objects_.end()) return NotFound("no object");
    return uint64_t(it->second->size());
  }
  Result<size_t> Read(const std::string& path, uint64_t offset, void* data, size_t size) override {
    std::shared_ptr<const std::string> object;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = objects_.find(path);
      if (it == objects_.end()) return NotFound("no object");
      object = it->second;
    }
    if (offset >= object->size()) return size_t{0};
    const size_t n = std::min<uint64_t>(size, object->size() - offset);
    std::memcpy(data, object->data() + offset, n);
    return n;
  }
  Result<std::vector<std::string>> List(const std::string& dir) override {
    const std::string prefix = dir.empty() ? "" : (dir == "/" ? "/" : dir + "/");
    std::vector<std::string> out;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = objects_.lower_bound(prefix); it != objects_.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      const std::string rest = it->first.substr(prefix.size());
      if (rest.empty()) continue;
      out.push_back(rest.substr(0, rest.find('/')));
    }
    return out;
  }
  Status Remove(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    objects_.erase(path);
    return OkStatus();
  }
  Status Commit(const std::string& path, const std::string& data, bool replace) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!replace && objects_.count(path)) return Status(StatusCode::kExists, "exists");
    objects_[path] = std::make_shared<const std::string>(data);
    return OkStatus();
  }
  void Put(const std::string& path, std::string data) {
    std::lock_guard<std::mutex> lock(mu_);
    objects_[path] = std::make_shared<const std::string>(std::move(data));
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const std::string>> objects_;
};

MemoryUpload::MemoryUpload(MemoryObjects* store, std::string path, uint64_t hint)
    : store_(store), path_(std::move(path)) {
  data_.reserve(static_cast<size_t>(std::min<uint64_t>(hint, uint64_t{1} << 30)));
}

Status MemoryUpload::Close(uint64_t size, bool discard) {
  if (discard) return OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  data_.resize(static_cast<size_t>(size));
  store_->Put(path_, std::move(data_));
  return OkStatus();
}

}  // namespace

std::unique_ptr<Storage> NewObjectStorage(std::shared_ptr<ObjectClient> client, ObjectStorageOptions options) {
  return std::unique_ptr<Storage>(new ObjectStorage(std::move(client), options));
}

std::shared_ptr<ObjectClient> NewMemoryObjectClient() { return std::make_shared<MemoryObjects>(); }

}  // namespace distckpt
