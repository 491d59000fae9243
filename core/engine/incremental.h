// The coordinator's side of an incremental save (FORMAT.md 4.1): which chunks of the new checkpoint its base already
// holds, and the references that replace them.
#ifndef DISTCKPT_CORE_ENGINE_INCREMENTAL_H_
#define DISTCKPT_CORE_ENGINE_INCREMENTAL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/engine/base_checkpoint.h"
#include "core/plan/save_planner.h"
#include "core/storage/storage.h"

namespace distckpt {

class IncrementalBase {
 public:
  /// Opens `base` (a sibling of `path`: its path or its name) for the save to `path`. With `full_every` > 0, a save
  /// whose chain would reach that many saves since the last self-contained one compares nothing (active() is false)
  /// and is written whole.
  static Result<std::unique_ptr<IncrementalBase>> Open(Storage* storage, const std::string& path,
                                                       const std::string& base, uint32_t full_every);

  /// Whether chunks are compared at all.
  bool active() const { return active_; }

  /// The planner's hook (SavePlanOptions::reuse): a chunk is reused when the base has the same entry (kind, dtype,
  /// shape), a chunk with the same box, the same length and the same XXH3-128 as the writer's fingerprint, at an offset
  /// the new checkpoint's alignment allows, with the same checksum block size. Chunks the base itself refers to are
  /// referred to where they lie (one hop). Records the bases it names. Null when not active().
  ReuseFn Reuse(uint64_t checksum_block_size, uint64_t alignment);

  /// After planning: the bases the plan refers to, and the chain length (0 and none if nothing was reused).
  void Finish(MetadataRecord* metadata) const;

  /// Just before the commit: the base still has the metadata the plan compared with (it was not replaced or
  /// overwritten meanwhile); kState naming it otherwise.
  Status CheckUnchanged(Storage* storage) const;

  /// Data bytes the plan took from bases.
  uint64_t bytes_reused() const { return bytes_reused_; }

 private:
  IncrementalBase(std::string path, std::string name, BaseCheckpoint base, bool active)
      : path_(std::move(path)), name_(std::move(name)), base_(std::move(base)), active_(active) {}
  // 1-based index in bases_ of checkpoint `name` (added on first use).
  uint32_t BaseIndex(const std::string& name, uint64_t checksum, uint64_t size);

  std::string path_;  // the checkpoint being saved
  std::string name_;  // the base's name (a sibling of path_)
  BaseCheckpoint base_;
  bool active_;
  std::vector<BaseRecord> bases_;
  std::map<std::string, uint32_t> base_index_;
  uint64_t bytes_reused_ = 0;
  // The base entry whose chunks `boxes_` indexes (the planner asks entry by entry).
  size_t indexed_entry_ = SIZE_MAX;
  std::map<std::vector<uint64_t>, uint32_t> boxes_;  // box offsets then lengths -> chunk
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_INCREMENTAL_H_
