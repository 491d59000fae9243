// Internal to the engine: the read/verify/scatter executor behind Reader and ReadBatch (reader.h). One executor is
// one pass over one Reader: add what to read, then Run once (or, for a fan-out load, NeededRanges and then
// RunRanges / DeliverFromPeer).
#ifndef DISTCKPT_CORE_ENGINE_READ_EXECUTOR_H_
#define DISTCKPT_CORE_ENGINE_READ_EXECUTOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/base/status.h"
#include "core/engine/reader.h"

namespace distckpt {

/// Turns planned reads into segment tasks on the reader's thread pool: read, verify, scatter. Not thread-safe; the
/// reader must outlive it.
class ReadExecutor {
 public:
  explicit ReadExecutor(Reader* reader);
  ~ReadExecutor();
  ReadExecutor(const ReadExecutor&) = delete;
  ReadExecutor& operator=(const ReadExecutor&) = delete;

  /// Plans the reads of regions of entry `entry` into their destinations (errors name the checkpoint and entry).
  Status Add(size_t entry, const std::vector<ReadTarget>& targets);
  /// Reads and verifies a whole chunk without delivering it anywhere.
  void AddVerify(size_t entry, uint32_t chunk);
  /// Maps a whole chunk and verifies it in place (Reader::MapAll).
  void AddMapped(size_t entry, uint32_t chunk);
  /// See ReadBatch: VerifiedRanges, SetVerifyFilter, Run, NeededRanges, RunRanges and DeliverFromPeer.
  Result<std::vector<FileRange>> VerifiedRanges();
  void SetVerifyFilter(VerifyFilter filter);
  Status Run(const ProgressFn& progress);
  Result<std::vector<ChunkRange>> NeededRanges();
  Status RunRanges(const std::vector<ChunkRange>& ranges, const ProgressFn& progress, const ReadBatch::ReadSink& sink);
  Status DeliverFromPeer(const ChunkRange& range, const char* data, const ProgressFn& progress);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_READ_EXECUTOR_H_
