// Load planning: which saved chunks overlap each destination box, and the byte runs to copy. No I/O here.
#ifndef DISTCKPT_CORE_PLAN_LOAD_PLANNER_H_
#define DISTCKPT_CORE_PLAN_LOAD_PLANNER_H_

#include <cstdint>
#include <vector>

#include "core/base/box.h"
#include "core/base/status.h"
#include "core/format/metadata.h"
#include "core/plan/copy_plan.h"

namespace distckpt {

/// Per-tensor spatial index over the saved chunk boxes (which tile the tensor exactly).
/// Regular (grid) tilings use a cell table: a query costs O(ndim log n + cells covered), which is the number of hits
/// for regular shardings. Others fall back to a sorted sweep on one dimension. Never a scan of every chunk per query.
class ChunkIndex {
 public:
  explicit ChunkIndex(const EntryView& entry);
  explicit ChunkIndex(std::vector<Box> chunk_boxes);
  /// An index that always uses the sweep fallback, so tests can check it on layouts the grid would take.
  static ChunkIndex SweepOnlyForTesting(std::vector<Box> chunk_boxes);

  /// Appends the ids of all chunks whose box intersects `query` (non-empty intersection), in increasing id order.
  void Query(const Box& query, std::vector<uint32_t>* out) const;
  size_t num_chunks() const { return boxes_.size(); }
  /// True when the grid table serves queries, false for the sweep fallback (for tests and diagnostics).
  bool is_grid() const { return grid_; }
  const Box& box(uint32_t id) const { return boxes_[id]; }

 private:
  struct SweepOnlyTag {};
  ChunkIndex(std::vector<Box> chunk_boxes, SweepOnlyTag);
  void Build(bool allow_grid = true);
  std::vector<Box> boxes_;
  uint32_t ndim_ = 0;
  // Grid index: per-dimension sorted cut points and a dense cell -> chunk table.
  bool grid_ = false;
  std::vector<std::vector<uint64_t>> cuts_;
  std::vector<uint32_t> cells_;
  // Fallback: ids sorted by their offset in one sweep dimension, plus the largest extent in that dimension.
  // The dimension is the most selective one (dimension 0 for row-like layouts, the last for column-like ones).
  std::vector<uint32_t> by_start_;
  uint64_t sweep_max_len_ = 0;
  uint32_t sweep_dim_ = 0;
};

/// One piece of work: copy the intersection of saved chunk `chunk` and destination `dest`.
/// copy.src_* are byte offsets relative to the chunk's first byte; copy.dst_* relative to the destination buffer.
struct TensorReadOp {
  uint32_t chunk = 0;
  uint32_t dest = 0;
  Box region;
  CopyPlan copy;
};

/// Plans reading `dests` (boxes in the tensor's global index space, each backed by a row-major buffer) from a saved
/// tensor. Fails with kInvalidArgument if a destination is outside the tensor or has the wrong ndim. Ops come out
/// grouped by chunk (increasing chunk id), then by dest.
Result<std::vector<TensorReadOp>> PlanTensorRead(const EntryView& entry, const ChunkIndex& index,
                                                 const std::vector<Box>& dests);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_PLAN_LOAD_PLANNER_H_
