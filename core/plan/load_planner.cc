#include "core/plan/load_planner.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/base/dtype.h"

namespace distckpt {
namespace {

constexpr uint32_t kNoChunk = 0xFFFFFFFFu;

// A grid table larger than this (relative to the number of chunks) is not worth its memory; such layouts use the
// sweep. Regular shardings have exactly one cell per chunk.
uint64_t MaxGridCells(size_t num_chunks) { return 8 * static_cast<uint64_t>(num_chunks) + 1024; }

std::string ShapeString(Span<const uint64_t> shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

}  // namespace

ChunkIndex::ChunkIndex(const EntryView& entry) {
  boxes_.reserve(entry.num_chunks);
  for (size_t i = 0; i < entry.num_chunks; ++i) boxes_.push_back(entry.chunk_box(i));
  Build();
}

ChunkIndex::ChunkIndex(std::vector<Box> chunk_boxes) : boxes_(std::move(chunk_boxes)) { Build(); }

ChunkIndex::ChunkIndex(std::vector<Box> chunk_boxes, SweepOnlyTag) : boxes_(std::move(chunk_boxes)) { Build(false); }

ChunkIndex ChunkIndex::SweepOnlyForTesting(std::vector<Box> chunk_boxes) {
  return ChunkIndex(std::move(chunk_boxes), SweepOnlyTag{});
}

void ChunkIndex::Build(bool allow_grid) {
  if (boxes_.empty()) return;
  ndim_ = boxes_[0].ndim;
  for (const Box& b : boxes_) {
    // Mixed ranks never come out of validated metadata; index nothing rather than read out of range.
    if (b.ndim != ndim_) {
      boxes_.clear();
      return;
    }
  }

  // Try the grid: every distinct boundary per dimension cuts the space into cells; each chunk covers a sub-grid.
  cuts_.assign(ndim_, {});
  uint64_t cells = 1;
  bool fits = allow_grid;
  for (uint32_t d = 0; d < ndim_ && fits; ++d) {
    std::vector<uint64_t>& c = cuts_[d];
    c.reserve(2 * boxes_.size());
    for (const Box& b : boxes_) {
      c.push_back(b.offset[d]);
      c.push_back(b.end(d));
    }
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    c.shrink_to_fit();
    const uint64_t n = c.size() - 1;
    if (n != 0 && cells > MaxGridCells(boxes_.size()) / n) fits = false;
    cells *= n;
  }
  if (fits && cells <= MaxGridCells(boxes_.size())) {
    cells_.assign(cells, kNoChunk);
    grid_ = true;
    for (uint32_t id = 0; id < boxes_.size() && grid_; ++id) {
      const Box& b = boxes_[id];
      uint64_t lo[kMaxDims], hi[kMaxDims], idx[kMaxDims];
      bool empty = false;
      for (uint32_t d = 0; d < ndim_; ++d) {
        const std::vector<uint64_t>& c = cuts_[d];
        lo[d] = std::lower_bound(c.begin(), c.end(), b.offset[d]) - c.begin();
        hi[d] = std::lower_bound(c.begin(), c.end(), b.end(d)) - c.begin();
        idx[d] = lo[d];
        if (lo[d] == hi[d]) empty = true;
      }
      if (empty) continue;  // zero-volume chunks intersect nothing
      // Walk the covered cells in row-major order.
      while (true) {
        uint64_t cell = 0;
        for (uint32_t d = 0; d < ndim_; ++d) cell = cell * (cuts_[d].size() - 1) + idx[d];
        if (cells_[cell] != kNoChunk) {
          grid_ = false;  // overlapping chunks: not a tiling, let the sweep handle it
          break;
        }
        cells_[cell] = id;
        int d = static_cast<int>(ndim_) - 1;
        while (d >= 0 && ++idx[d] == hi[d]) {
          idx[d] = lo[d];
          --d;
        }
        if (d < 0) break;
      }
    }
    if (grid_) return;
    cells_.clear();
    cells_.shrink_to_fit();
  }
  cuts_.clear();
  cuts_.shrink_to_fit();

  // Sweep fallback. For 0-d tensors every chunk is the scalar and sorting is moot.
  by_start_.resize(boxes_.size());
  for (uint32_t i = 0; i < boxes_.size(); ++i) by_start_[i] = i;
  if (ndim_ == 0) return;
  // A query sees the chunks starting within max_len of it along the sweep dimension, so sweep along the dimension
  // where the longest chunk covers the smallest fraction of the extent.
  uint64_t lo[kMaxDims], hi[kMaxDims], max_len[kMaxDims] = {};
  for (uint32_t d = 0; d < ndim_; ++d) {
    lo[d] = UINT64_MAX;
    hi[d] = 0;
  }
  for (const Box& b : boxes_) {
    for (uint32_t d = 0; d < ndim_; ++d) {
      lo[d] = std::min(lo[d], b.offset[d]);
      hi[d] = std::max(hi[d], b.end(d));
      max_len[d] = std::max(max_len[d], b.length[d]);
    }
  }
  double best = 2;
  for (uint32_t d = 0; d < ndim_; ++d) {
    const double frac = hi[d] > lo[d] ? static_cast<double>(max_len[d]) / static_cast<double>(hi[d] - lo[d]) : 1;
    if (frac < best) {
      best = frac;
      sweep_dim_ = d;
    }
  }
  sweep_max_len_ = max_len[sweep_dim_];
  const uint32_t sd = sweep_dim_;
  std::sort(by_start_.begin(), by_start_.end(), [this, sd](uint32_t a, uint32_t b) {
    return boxes_[a].offset[sd] != boxes_[b].offset[sd] ? boxes_[a].offset[sd] < boxes_[b].offset[sd] : a < b;
  });
}

void ChunkIndex::Query(const Box& query, std::vector<uint32_t>* out) const {
  if (boxes_.empty() || query.ndim != ndim_ || query.empty()) return;
  const size_t first = out->size();

  if (grid_) {
    uint64_t lo[kMaxDims], hi[kMaxDims], idx[kMaxDims];
    for (uint32_t d = 0; d < ndim_; ++d) {
      const std::vector<uint64_t>& c = cuts_[d];
      // Cell i spans [c[i], c[i+1]). Covered cells: c[i+1] > offset and c[i] < end.
      const uint64_t ncell = c.size() - 1;
      uint64_t l = std::upper_bound(c.begin(), c.end(), query.offset[d]) - c.begin();
      l = l == 0 ? 0 : l - 1;
      uint64_t h = std::lower_bound(c.begin(), c.end(), query.end(d)) - c.begin();
      h = std::min(h, ncell);
      if (l >= h) return;
      lo[d] = idx[d] = l;
      hi[d] = h;
    }
    uint32_t last = kNoChunk;
    while (true) {
      uint64_t cell = 0;
      for (uint32_t d = 0; d < ndim_; ++d) cell = cell * (cuts_[d].size() - 1) + idx[d];
      const uint32_t id = cells_[cell];
      // Neighbouring cells along the last dimension usually belong to the same chunk: skip cheap repeats here and
      // dedup the rest below.
      if (id != kNoChunk && id != last) out->push_back(id);
      last = id;
      int d = static_cast<int>(ndim_) - 1;
      while (d >= 0 && ++idx[d] == hi[d]) {
        idx[d] = lo[d];
        --d;
      }
      if (d < 0) break;
    }
  } else if (ndim_ == 0) {
    out->insert(out->end(), by_start_.begin(), by_start_.end());
  } else {
    // Candidates start in (query.offset - sweep_max_len_, query.end) along the sweep dimension; anything starting
    // earlier ends before the query.
    const uint32_t sd = sweep_dim_;
    const uint64_t min_start = query.offset[sd] >= sweep_max_len_ ? query.offset[sd] - sweep_max_len_ + 1 : 0;
    auto it = std::lower_bound(by_start_.begin(), by_start_.end(), min_start,
                               [this, sd](uint32_t id, uint64_t v) { return boxes_[id].offset[sd] < v; });
    Box unused;
    for (; it != by_start_.end() && boxes_[*it].offset[sd] < query.end(sd); ++it) {
      if (Intersect(boxes_[*it], query, &unused)) out->push_back(*it);
    }
  }
  std::sort(out->begin() + first, out->end());
  out->erase(std::unique(out->begin() + first, out->end()), out->end());
}

Result<std::vector<TensorReadOp>> PlanTensorRead(const EntryView& entry, const ChunkIndex& index,
                                                 const std::vector<Box>& dests) {
  const std::string what = "entry '" + std::string(entry.name) + "'";
  const uint64_t itemsize = DTypeSize(entry.dtype);
  if (itemsize == 0) return InvalidArgument(what + " has no valid dtype");
  if (index.num_chunks() != entry.num_chunks) {
    return InvalidArgument(what + ": the chunk index holds " + std::to_string(index.num_chunks()) +
                           " chunks but the entry has " + std::to_string(entry.num_chunks));
  }
  DCKPT_ASSIGN_OR_RETURN(Box whole, Box::Whole(entry.shape));
  for (size_t i = 0; i < dests.size(); ++i) {
    if (dests[i].ndim != whole.ndim) {
      return InvalidArgument(what + ": destination #" + std::to_string(i) + " " + dests[i].ToString() + " has " +
                             std::to_string(dests[i].ndim) + " dimensions but the tensor has shape " +
                             ShapeString(entry.shape));
    }
    if (!whole.Contains(dests[i])) {
      return InvalidArgument(what + ": destination #" + std::to_string(i) + " " + dests[i].ToString() +
                             " lies outside the tensor of shape " + ShapeString(entry.shape));
    }
  }

  // Collect (chunk, dest) pairs first and sort those: ops are large, pairs are 8 bytes.
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  std::vector<uint32_t> hits;
  for (uint32_t dest = 0; dest < dests.size(); ++dest) {
    hits.clear();
    index.Query(dests[dest], &hits);
    for (uint32_t chunk : hits) pairs.emplace_back(chunk, dest);
  }
  std::sort(pairs.begin(), pairs.end());
  std::vector<TensorReadOp> ops;
  ops.reserve(pairs.size());
  for (const auto& [chunk, dest] : pairs) {
    TensorReadOp op;
    op.chunk = chunk;
    op.dest = dest;
    if (!Intersect(index.box(chunk), dests[dest], &op.region)) continue;
    op.copy = MakeCopyPlan(op.region, index.box(chunk), dests[dest], itemsize);
    ops.push_back(op);
  }
  return ops;
}

}  // namespace distckpt
