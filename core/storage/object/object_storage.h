// Storage over an object store: a flat namespace of paths ("a/b/c") holding immutable objects written whole, with
// ranged reads, listing by prefix and removal, but no directories and no rename. The host's storage callbacks (C ABI
// dckpt_storage_callbacks) and the in-memory object store both come in as an ObjectClient; ObjectStorage turns one into
// a Storage whose checkpoints are committed metadata-last (CommitProtocol::kMetadataLast, FORMAT.md section 6.2).
#ifndef DISTCKPT_CORE_STORAGE_OBJECT_OBJECT_STORAGE_H_
#define DISTCKPT_CORE_STORAGE_OBJECT_OBJECT_STORAGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {

/// An object being written. Write may be called from several threads at once for disjoint ranges, in any order.
class ObjectUpload {
 public:
  virtual ~ObjectUpload() = default;
  virtual Status Write(uint64_t offset, const void* data, size_t size) = 0;
  virtual Status Sync() = 0;
  /// Called exactly once. !discard: publishes the object (durably) with `size` bytes, unwritten ones zero. discard:
  /// nothing appears.
  virtual Status Close(uint64_t size, bool discard) = 0;
};

/// A multipart upload the client started (ObjectClient::BeginParts). UploadPart may run on several threads at once for
/// different parts; Complete or Abort is called exactly once, after every UploadPart returned.
class ObjectPartUpload {
 public:
  virtual ~ObjectPartUpload() = default;
  /// Sends part `number` (from 1). Every part but the last has the same size, at least the client's min_part_size.
  virtual Status UploadPart(unsigned number, const void* data, size_t size) = 0;
  /// Publishes the object made of the parts sent.
  virtual Status Complete() = 0;
  /// Abandons the upload and its parts: nothing appears.
  virtual Status Abort() = 0;
};

/// What an object store offers. Thread-safe. Errors: kNotFound for a missing path; messages need not name the path
/// (ObjectStorage adds it).
class ObjectClient {
 public:
  virtual ~ObjectClient() = default;
  virtual std::string name() const = 0;
  /// Starts an object; `size_hint` is its final size when known (0: unknown).
  virtual Result<std::unique_ptr<ObjectUpload>> Create(const std::string& path, uint64_t size_hint) = 0;
  virtual Result<uint64_t> Size(const std::string& path) = 0;
  /// Reads up to `size` bytes at `offset`; returns how many (fewer only at the end).
  virtual Result<size_t> Read(const std::string& path, uint64_t offset, void* data, size_t size) = 0;
  /// Read, calling arrived(n) as the first n bytes of `data` are in (n grows; called from this thread). The default
  /// calls it once, when Read returns.
  virtual Result<size_t> ReadArriving(const std::string& path, uint64_t offset, void* data, size_t size,
                                      const std::function<void(size_t)>& arrived) {
    Result<size_t> got = Read(path, offset, data, size);
    if (got.ok()) arrived(*got);
    return got;
  }
  /// Names directly below `dir` (first components of longer paths included), any order, duplicates allowed.
  virtual Result<std::vector<std::string>> List(const std::string& dir) = 0;
  /// OK when nothing is there.
  virtual Status Remove(const std::string& path) = 0;
  /// An atomic write of a whole small object; without `replace`, kExists if something is there. kUnsupported: the
  /// client has none (ObjectStorage then checks and writes).
  virtual Status Commit(const std::string& path, const std::string& data, bool replace) = 0;
  /// True when the client takes multipart uploads (BeginParts): ObjectStorage then assembles files into parts.
  virtual bool has_parts() const { return false; }
  /// The smallest size of a part but the last (0: none).
  virtual uint64_t min_part_size() const { return 0; }
  /// Starts a multipart upload of `path`.
  virtual Result<std::unique_ptr<ObjectPartUpload>> BeginParts(const std::string& path, uint64_t size_hint) {
    return Unsupported("multipart uploads");
  }
};

/// The bytes the part buffers of one storage's files hold (ObjectStorageOptions::part_memory), now and at most.
struct PartMemory {
  std::atomic<uint64_t> now{0};
  std::atomic<uint64_t> peak{0};
};

struct ObjectStorageOptions {
  /// The most Write and Read calls running at once (the engine's I/O threads wait beyond it). 0: 16.
  unsigned max_in_flight = 0;
  /// For a client with parts: the part size (0: the client's min_part_size, or 8 MiB without one); grown so that a
  /// file of its size hint needs at most 10000 parts.
  uint64_t part_size = 0;
  /// For a client with parts: the part buffers one file holds at most while its writes arrive in order (a file whose
  /// writes run further ahead of its oldest unsent part than this gets more rather than stall). 0: 4.
  unsigned max_part_buffers = 0;
  /// Where to count the bytes held in part buffers (tests, diagnostics); nullptr: not counted.
  std::shared_ptr<PartMemory> part_memory;
  /// Read coalescing (read_blocks.h): a read shorter than half of this fetches the aligned block of this size around
  /// it, which the reads of the same open file that follow share. 0: off (every read is one client Read).
  uint64_t read_block_size = 0;
  /// The blocks held at once across the storage's files. 0: 8.
  unsigned max_read_blocks = 0;
};

/// A Storage over `client`: paths are normalised ("//a/./b/" -> "a/b"; a leading '/' is kept as written so that a
/// client mapping paths onto a local tree sees absolute paths), a directory is any path with something below it,
/// CreateDir/SyncDir do nothing, Rename/Exchange/LockDirectory/Identity are kUnsupported, Map() is unavailable.
std::unique_ptr<Storage> NewObjectStorage(std::shared_ptr<ObjectClient> client, ObjectStorageOptions options = {});

/// An object store in process memory (objects appear when closed; Commit is atomic and conditional).
std::shared_ptr<ObjectClient> NewMemoryObjectClient();

}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_OBJECT_OBJECT_STORAGE_H_
