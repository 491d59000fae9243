// Save: every rank writes its chunks in parallel; the coordinator (rank 0) plans globally and commits atomically.
#ifndef DISTCKPT_CORE_ENGINE_SAVE_H_
#define DISTCKPT_CORE_ENGINE_SAVE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "core/base/status.h"
#include "core/base/thread_priority.h"
#include "core/comm/communicator.h"
#include "core/engine/state.h"
#include "core/format/metadata.h"
#include "core/storage/storage.h"

namespace distckpt {

class CopyEngine;

struct SaveOptions {
  size_t io_threads = 0;   ///< 0: a default suited to the machine
  bool overwrite = false;  ///< replace an existing checkpoint at the path
  bool sync = true;        ///< fsync data, metadata and directories (turn off only for scratch data)
  uint64_t checksum_block_size = kDefaultChecksumBlockSize;
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  Storage* storage = nullptr;  ///< nullptr: the POSIX filesystem
  /// Called with (bytes written by this rank, bytes it will write); non-zero aborts the save (kUser) on every rank.
  std::function<int(uint64_t done, uint64_t total)> progress;
  /// Device pieces: the engine that copies them to host. nullptr: the CUDA engine, loaded on first use (kUnsupported
  /// naming libcuda.so.1 where there is no driver). Tests pass a HostCopyEngine. Must outlive the save.
  CopyEngine* copy_engine = nullptr;
  /// Device pieces go through a pool of `staging_buffers` (at least 2) page-locked buffers of `staging_buffer_bytes`
  /// (rounded down to a multiple of checksum_block_size, at least one block), allocated once per process and reused
  /// by every save with the same shape: hashing and writing buffer k overlap the copy of buffer k+1.
  uint64_t staging_buffer_bytes = kDefaultStagingBufferBytes;
  size_t staging_buffers = kDefaultStagingBuffers;
  /// SaveAsync only: the host memory that the staging of all unfinished asynchronous saves of this process may hold.
  /// A SaveAsync that would go past it waits for earlier ones to finish (back-pressure) instead of allocating another
  /// state-sized buffer; one save alone may exceed it (it has to stage its whole state). 0: no cap.
  uint64_t max_async_staging_bytes = 0;
  /// SaveAsync only: device pieces are first snapshotted into device memory distckpt allocates (a device-to-device
  /// copy, at device memory bandwidth), and the call returns once those copies have finished; the background save
  /// then copies the snapshot to host through the pinned pool while training goes on. Costs free device memory the
  /// size of the device pieces; once an allocation fails, the remaining pieces are staged in host memory as without
  /// the option (never an error). The snapshot is freed as soon as the save finishes.
  bool device_snapshot = false;
  /// SaveAsync only: the CPU and I/O priority of the background thread and of the writer threads it starts. The
  /// staging copy, which the caller waits for, keeps the caller's priority. Failing to lower it is no error.
  ThreadPriority background_priority = ThreadPriority::kNormal;
  /// SaveAsync only: threads copying the state into owned buffers while the caller waits; 0: io_threads (0: the
  /// cores). The manager writes with few threads but stages with every core.
  size_t staging_threads = 0;
  /// Incremental save (FORMAT.md 4.1): an earlier checkpoint, a sibling of the path (named by its path or its name),
  /// whose chunks this save refers to instead of writing them again where the bytes are equal (same entry and box, same
  /// length and XXH3-128, hashed from the state before planning). The result is format 2.0 and needs its bases to be
  /// read. Host pieces are compared; device pieces are always written. Empty: a self-contained save.
  std::string base;
  /// With `base`: a save that would be the `full_every`-th of its chain (counting from the last self-contained save)
  /// is written whole instead. 0: no bound.
  uint32_t full_every = 0;
  /// Record every chunk's XXH3-128 (format 1.2, FORMAT.md 5.1), which later saves compare with when this checkpoint
  /// is their base: one more hash of every byte while writing (XXH3-128 runs as fast as the checksums' XXH3-64).
  /// The checkpoint manager turns it off for its node-local parts, which are never bases.
  bool chunk_hashes = true;
  /// Lossless compression (FORMAT.md "Compressed chunks"; the result is format 3.0): Codec::kZstdGrouped compresses
  /// every checksum block of a host piece on its own, its elements' bytes grouped by position first (2-, 4- and 8-byte
  /// dtypes); a block that does not shrink is stored raw, and a chunk none of whose blocks shrink is a raw chunk.
  /// Device pieces are written raw. Each rank lays its data file out as it writes (compressed sizes are known only
  /// then). Loads decode in the read threads and verify both the stored and the decoded bytes.
  Codec compression = Codec::kRaw;
  /// MinCompressionLevel() to MaxCompressionLevel() (core/codec/block_codec.h). 0, the default: zstd's entropy coder
  /// alone over the grouped bytes (as small as level 1 on floats, about 3x faster to write and 4x to read); others:
  /// zstd's levels with match finding, for data with repeats (integer ids, masks, text).
  int compression_level = 0;

  static constexpr uint64_t kDefaultStagingBufferBytes = 16ull << 20;
  static constexpr size_t kDefaultStagingBuffers = 4;
};

struct SaveSummary {
  std::string path;            ///< the committed checkpoint
  uint64_t bytes_written = 0;  ///< by this rank
  uint64_t total_bytes = 0;    ///< data bytes in the checkpoint (all ranks)
  uint32_t num_files = 0;      ///< data files in the checkpoint
  uint32_t num_entries = 0;
  uint64_t metadata_bytes = 0;
  double seconds = 0;         ///< wall time of the call on this rank
  uint64_t bytes_reused = 0;  ///< data bytes the checkpoint refers to in its bases instead of holding them
};

/// Saves `state` to `path` as one atomic checkpoint. Collective: every rank of `comm` (nullptr = single process)
/// calls it with the same path and options. On any failure on any rank, every rank returns an error, nothing is
/// visible at `path`, and other checkpoints are untouched.
Result<SaveSummary> Save(const std::string& path, const State& state, Communicator* comm, const SaveOptions& options);

/// The part of a collective Save that a rank which failed before it could take part still owes the others: it sends
/// `why` in the first round, so every rank fails at once with its message (instead of waiting out the timeout for a
/// rank that never comes), and returns once the coordinator has answered. SaveAsync uses it when staging fails.
Status JoinSaveAsFailed(const std::string& path, Communicator* comm, const SaveOptions& options, const Status& why);

/// kInvalidArgument naming `where` unless `codec` is one a save writes and `level` one of its levels.
Status CheckCompression(Codec codec, int level, const std::string& where);

/// Default number of I/O threads.
size_t DefaultIoThreads();

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_SAVE_H_
