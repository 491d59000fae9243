// Reading a committed checkpoint: open (metadata verified and validated), list entries, read any region of any
// tensor straight into a caller buffer, read bytes entries, verify every chunk. Load is built on this.
#ifndef DISTCKPT_CORE_ENGINE_READER_H_
#define DISTCKPT_CORE_ENGINE_READER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/box.h"
#include "core/base/span.h"
#include "core/base/status.h"
#include "core/base/thread_pool.h"
#include "core/comm/communicator.h"
#include "core/cuda/memory.h"
#include "core/format/metadata.h"
#include "core/plan/load_planner.h"
#include "core/storage/storage.h"

namespace distckpt {

class CopyEngine;

/// When a collective load exchanges replicated bytes between ranks instead of reading them on each (ReadOptions).
enum class FanoutMode { kOff, kAuto, kAlways };

struct ReadOptions {
  bool verify = true;     ///< check chunk checksums for every byte read
  size_t io_threads = 0;  ///< 0: DefaultIoThreads()
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  Storage* storage = nullptr;  ///< nullptr: the POSIX filesystem
  /// Read data that is already in the page cache through a read-only mapping of the file (no kernel copy, and only
  /// the bytes needed are touched); data not resident is read with pread. See ReadableFile::Map for the caveat.
  bool map_files = true;
  /// Load only: when several ranks on one host verify the same checksum blocks (resharded loads), each block is
  /// hashed by one of them and every rank learns the outcome in the load's final status exchange. Ranks share only
  /// blocks of files with the same ReadableFile::CacheIdentity (the same inode through the same page cache).
  bool share_verification = true;
  /// Load only, with several ranks: bytes that several ranks need (replicas) are read from storage once, each rank
  /// reading a disjoint part, and exchanged over the communicator (core/engine/fanout.h, load.h). kAuto (default):
  /// only when the ranks do not all read through one page cache (ranks on several hosts, or storage whose cache
  /// identity is unknown, such as a plugged-in object store): there it divides the bytes read from storage by the
  /// replica factor, while ranks on one host already share the page cache and the exchange would only add copies
  /// (bench/fanout). kAlways: whenever bytes are shared. kOff: every rank reads what it needs itself.
  FanoutMode fanout = FanoutMode::kAuto;
  /// Load only: the most a rank receives per exchange round of the fan-out, all contributions together (the group
  /// uses the smallest asked for), shared evenly among the ranks that contribute, each at least one checksum block.
  /// It bounds the fan-out's memory whatever the checkpoint's size.
  uint64_t fanout_round_bytes = 256ull << 20;
  /// Load only: called with (bytes read, bytes to read); non-zero aborts (kUser).
  std::function<int(uint64_t done, uint64_t total)> progress;
  /// Device destinations are filled through this engine (nullptr: the CUDA engine, loaded on the first device
  /// destination; kUnsupported naming libcuda.so.1 without a driver). Tests pass a HostCopyEngine. Must outlive
  /// the reads.
  CopyEngine* copy_engine = nullptr;
  /// Device destinations: bytes go through a pool of `staging_buffers` (at least 2) pinned buffers of
  /// `staging_buffer_bytes` (rounded down to checksum blocks, at least one), the same process-wide pool a save with
  /// the same shape uses; the pinned memory of a load is bounded by it whatever the checkpoint's size.
  uint64_t staging_buffer_bytes = 16ull << 20;
  size_t staging_buffers = 4;
  /// Device destinations: a segment not in the page cache is read past it (O_DIRECT, ReadableFile::ReadDirectAt)
  /// straight into its pinned staging buffer, where the file system allows it (else read as before; IoStats says which
  /// bytes went which way). Data in the page cache is copied out of it as before. DCKPT_DIRECT_IO=0 in the environment
  /// turns it off for the process.
  bool direct_io = true;
};

/// Counters of the I/O a reader did. Partial reads show here: bytes_read is what came from storage.
struct IoStats {
  uint64_t bytes_read = 0;                 ///< bytes read from data files
  uint64_t read_calls = 0;                 ///< pread calls
  uint64_t bytes_verified = 0;             ///< bytes hashed to check checksums
  uint64_t bytes_delivered = 0;            ///< bytes written into caller buffers
  uint64_t bytes_mapped = 0;               ///< bytes served from the page cache through a mapping (not in bytes_read)
  uint64_t bytes_received_from_peers = 0;  ///< fan-out load: bytes other ranks read for this one (in bytes_delivered)
  uint64_t bytes_sent_to_peers = 0;        ///< fan-out load: bytes this rank read for others (counted once)
  uint64_t bytes_read_direct = 0;          ///< of bytes_read, those read past the page cache (O_DIRECT)
};

/// A byte range [lo, hi) of data file `file` (an index into the metadata's file table).
struct FileRange {
  uint32_t file = 0;
  uint64_t lo = 0, hi = 0;
};

/// Bytes [lo, hi) of chunk `chunk` of entry `entry`, relative to the chunk's start.
struct ChunkRange {
  uint32_t entry = 0;
  uint32_t chunk = 0;
  uint64_t lo = 0, hi = 0;
};

/// Says whether this process hashes the checksum block that starts at byte `offset` of data file `file`.
using VerifyFilter = std::function<bool(uint32_t file, uint64_t offset)>;

/// A destination for part of a tensor: a row-major buffer holding `box`, in host memory or in device memory
/// (`memory`). Bytes for device memory are read into pinned staging buffers, verified there, and copied to the device
/// after the work queued on memory.stream (load_staging.h); a read pass returns once those copies have landed.
struct ReadTarget {
  Box box;
  void* data = nullptr;
  MemoryLocation memory;
};

/// Progress callback: (done_bytes, total_bytes). Return non-zero to abort (kUser).
using ProgressFn = std::function<int(uint64_t done, uint64_t total)>;

class Reader;
class ReadExecutor;
struct BaseCheckpoint;

/// A planned set of reads over one Reader: Add targets, optionally look at what will be verified and hand over a
/// VerifyFilter, then Run once. Reader::ReadMany is Add + Run.
class ReadBatch {
 public:
  explicit ReadBatch(Reader* reader);
  ~ReadBatch();
  ReadBatch(const ReadBatch&) = delete;
  ReadBatch& operator=(const ReadBatch&) = delete;

  /// Plans the reads of regions of entry `entry` (errors name the checkpoint and the entry).
  Status Add(size_t entry, const std::vector<ReadTarget>& targets);
  /// The checksum blocks Run will verify, as merged file ranges sorted by (file, lo). Opens the files involved.
  Result<std::vector<FileRange>> VerifiedRanges();
  /// Only blocks for which `filter` returns true are hashed (the others are someone else's to verify).
  void SetVerifyFilter(VerifyFilter filter);
  Status Run(const ProgressFn& progress);

  /// For a fan-out load, instead of Run. The bytes Run would read, by chunk: sorted by (entry, chunk, lo), merged.
  /// With verification on they start and end on the chunk's checksum blocks (or at its end).
  Result<std::vector<ChunkRange>> NeededRanges();
  /// Called with bytes read and verified, before Run returns; from several threads at once.
  using ReadSink = std::function<void(const ChunkRange& piece, const char* data)>;
  /// Reads `ranges` (parts of NeededRanges, starting on checksum blocks when verifying) from storage, verifies them,
  /// delivers them into this batch's destinations and, with `sink`, hands them over (counted as sent to peers).
  /// Progress counts against the total of NeededRanges.
  Status RunRanges(const std::vector<ChunkRange>& ranges, const ProgressFn& progress, const ReadSink& sink);
  /// Delivers bytes another rank read and verified: `data` holds range.hi - range.lo bytes of the chunk.
  Status DeliverFromPeer(const ChunkRange& range, const char* data, const ProgressFn& progress);

 private:
  std::unique_ptr<ReadExecutor> ex_;
};

/// When a Reader opens the data files of its checkpoint.
enum class FilePinning {
  /// All of them while it opens: the reader then reads the checkpoint it opened, whatever happens to the path later
  /// (an overwrite, a removal). A file that cannot be opened then fails the reads that need it, with the error of
  /// open time. What dckpt_reader_open does.
  kAllAtOpen,
  /// Each on first use, through the directory opened with the metadata: a load opens only the files it reads. A
  /// checkpoint replaced or removed meanwhile gives an error (its files are gone), never another checkpoint's data.
  kOnFirstUse,
};

/// Thread-safe: several threads may read through one Reader at once.
class Reader {
 public:
  /// Opens the checkpoint at `path`: its directory once (a symbolic link to the directory itself is followed), then
  /// the metadata and the data files inside it, never through a link. With a communicator of several ranks the call
  /// is collective: rank 0 reads the metadata file once and broadcasts it, every rank verifies and validates it
  /// itself and checks that its own directory holds the same metadata file.
  /// A directory without metadata.dckpt that is a Hugging Face safetensors checkpoint (an index and its shards, or
  /// .safetensors files) or a PyTorch DCP one (.metadata), and a path naming one .safetensors file, are read in
  /// place through a description of them (core/foreign, FORMAT.md 2.4): every read path works on them, without
  /// verification (those formats carry no checksums).
  static Result<std::unique_ptr<Reader>> Open(const std::string& path, Communicator* comm, const ReadOptions& options,
                                              FilePinning pinning = FilePinning::kAllAtOpen);
  ~Reader();

  const std::string& path() const { return path_; }
  const MetadataView& metadata() const { return meta_; }
  const ReadOptions& options() const { return options_; }

  /// Reads the region `box` of tensor `name` into `dst` (row-major, exactly volume * itemsize bytes), in host memory
  /// or in the device memory `memory` describes.
  Status ReadRegion(std::string_view name, const Box& box, void* dst, uint64_t dst_size,
                    const MemoryLocation& memory = MemoryLocation());
  /// Reads several regions of entry `entry` (an index into metadata()) in one planned, parallel pass.
  Status ReadTargets(size_t entry, const std::vector<ReadTarget>& targets);
  /// Reads regions of many entries in one planned, parallel pass (what Load uses).
  struct EntryTargets {
    size_t entry = 0;
    std::vector<ReadTarget> targets;
  };
  Status ReadMany(const std::vector<EntryTargets>& work);
  /// Reads a bytes entry. Returns its size; kBufferTooSmall (nothing copied) when capacity is too small.
  Result<uint64_t> ReadBytes(std::string_view name, void* dst, uint64_t capacity);
  /// Reads and checks every chunk of every entry, reporting progress. Returns the first corruption found.
  /// kUnsupported for a foreign checkpoint (no checksums), saying so.
  Status VerifyAll(const ProgressFn& progress);
  /// Whole-checkpoint load for zero-copy readers (inference servers): every chunk of the entries listed (all entries
  /// when `entries` is empty) is read into the page cache, mapped into this process and verified in place, spread
  /// over the reader's I/O threads as one sequential stream each, each stream asking for its next segment while it
  /// hashes the current one. Nothing is copied; the pages stay mapped for views (MappedFile) until the reader goes.
  /// Progress reports the bytes made ready. kUnsupported where nothing can be mapped (map_files off, a storage
  /// without mappings); a corrupt block fails the call as a load does.
  /// Compressed chunks (format 3.0) have no bytes to map: MapAll reads, decodes and verifies them, in the same pass,
  /// into memory the reader owns (MapChunk returns it), which adds their decoded size to the resident set.
  Status MapAll(const std::vector<size_t>& entries, const ProgressFn& progress);
  /// Chunk `chunk` of entry `entry` for zero-copy use, valid until the reader goes. A raw chunk: its bytes in the
  /// mapping of its data file (MappedFile), NOT verified (VerifyChunk or MapAll first); kUnsupported where nothing is
  /// mapped. A compressed chunk: its decoded bytes, read, decoded and verified (as a read is, by ReadOptions::verify)
  /// into memory the reader owns, by MapAll or on the first call, whether files are mapped or not. Thread-safe.
  Result<Span<const char>> MapChunk(size_t entry, uint32_t chunk);
  /// Reads and checks one chunk.
  Status VerifyChunk(size_t entry, uint32_t chunk, const ProgressFn& progress = nullptr);

  IoStats io_stats() const;

  /// Data file `index` of the metadata (pinned at open, or opened now); its size is checked against the metadata.
  Result<const ReadableFile*> File(uint32_t index);
  /// Where data file `index` lies: in this checkpoint's directory, or in a base's (format 2.0), for messages.
  std::string FilePath(uint32_t index) const;
  /// The whole data file `index` mapped read-only (pages come from the page cache as they are touched; the mapping
  /// lives as long as the reader), or kUnsupported where the reader was opened with map_files off or the file cannot
  /// be mapped. See ReadableFile::Map for what a truncation of the file by someone else does.
  Result<const char*> MappedFile(uint32_t index);
  /// The (cached) spatial index over the chunks of entry `entry`.
  const ChunkIndex& Index(size_t entry);

 private:
  friend class ReadExecutor;
  Reader(std::string path, std::string dir_path, MetadataView meta, const ReadOptions& options,
         std::unique_ptr<Directory> dir);
  Result<std::unique_ptr<ReadableFile>> OpenDataFile(uint32_t index);
  /// Base k of a checkpoint with references (format 2.0), opened and checked on first use.
  Result<const BaseCheckpoint*> Base(uint32_t k);
  Status EntryError(size_t entry, const Status& st) const;
  Status EntryError(size_t entry, const std::string& msg) const;  // kInvalidArgument
  Status NoChecksums() const;  // kUnsupported: a foreign checkpoint has nothing to verify
  // The box chunk `chunk` of entry `entry` covers (a bytes entry: the whole entry).
  Box ChunkBox(size_t entry, uint32_t chunk) const;
  // The decoded bytes of a compressed chunk kept for MapChunk, or nullptr.
  const char* Decoded(size_t entry, uint32_t chunk);
  // Keeps `bytes` as the decoded chunk, unless another thread kept one first; returns the one kept.
  const char* KeepDecoded(size_t entry, uint32_t chunk, std::unique_ptr<char[]> bytes);

  std::string path_;      // as the caller named it (a directory, or one safetensors file)
  std::string dir_path_;  // the directory holding the data files (path_, or a single file's directory)
  MetadataView meta_;
  ReadOptions options_;
  Storage* storage_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Directory> dir_;  // the checkpoint's directory, as opened
  // Compressed chunks decoded for MapChunk, by (entry, chunk); kept until the reader goes.
  std::mutex decoded_mu_;
  std::map<std::pair<size_t, uint32_t>, std::unique_ptr<char[]>> decoded_;
  std::mutex files_mu_;
  std::vector<std::unique_ptr<ReadableFile>> files_;
  std::vector<Status> file_errors_;  // why files_[i] could not be opened at open time (kAllAtOpen)
  std::mutex bases_mu_;
  std::vector<std::unique_ptr<BaseCheckpoint>> bases_;  // opened by Base()
  std::mutex index_mu_;
  std::vector<std::unique_ptr<ChunkIndex>> indexes_;
  struct AtomicStats {
    std::atomic<uint64_t> bytes_read{0}, read_calls{0}, bytes_verified{0}, bytes_delivered{0}, bytes_mapped{0},
        bytes_received_from_peers{0}, bytes_sent_to_peers{0}, bytes_read_direct{0};
  } stats_;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_READER_H_
