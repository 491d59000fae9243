#include "core/base/box.h"

#include <algorithm>

namespace distckpt {

Result<Box> Box::Make(Span<const uint64_t> offsets, Span<const uint64_t> lengths) {
  if (offsets.size() != lengths.size()) {
    return InvalidArgument("box has " + std::to_string(offsets.size()) + " offsets but " +
                           std::to_string(lengths.size()) + " lengths");
  }
  if (offsets.size() > kMaxDims) {
    return InvalidArgument("box has " + std::to_string(offsets.size()) + " dimensions; at most " +
                           std::to_string(kMaxDims) + " are supported");
  }
  Box b;
  b.ndim = static_cast<uint32_t>(offsets.size());
  for (uint32_t d = 0; d < b.ndim; ++d) {
    if (offsets[d] > UINT64_MAX - lengths[d]) return InvalidArgument("box offset + length overflows in dimension " + std::to_string(d));
    b.offset[d] = offsets[d];
    b.length[d] = lengths[d];
  }
  return b;
}

Result<Box> Box::Whole(Span<const uint64_t> shape) {
  std::vector<uint64_t> zeros(shape.size(), 0);
  return Make(Span<const uint64_t>(zeros.data(), zeros.size()), shape);
}

uint64_t Box::volume() const {
  uint64_t v = 1;
  for (uint32_t d = 0; d < ndim; ++d) v *= length[d];
  return v;
}

bool Box::empty() const {
  for (uint32_t d = 0; d < ndim; ++d) {
    if (length[d] == 0) return true;
  }
  return false;
}

bool Box::operator==(const Box& o) const {
  if (ndim != o.ndim) return false;
  for (uint32_t d = 0; d < ndim; ++d) {
    if (offset[d] != o.offset[d] || length[d] != o.length[d]) return false;
  }
  return true;
}

bool Box::Contains(const Box& inner) const {
  if (ndim != inner.ndim) return false;
  for (uint32_t d = 0; d < ndim; ++d) {
    if (inner.offset[d] < offset[d] || inner.end(d) > end(d)) return false;
  }
  return true;
}

std::string Box::ToString() const {
  std::string s = "[";
  for (uint32_t d = 0; d < ndim; ++d) {
    if (d) s += ", ";
    s += std::to_string(offset[d]) + ":" + std::to_string(end(d));
  }
  return s + "]";
}

Result<uint64_t> CheckedVolume(Span<const uint64_t> dims, uint64_t itemsize) {
  uint64_t v = itemsize;
  bool overflow = false;
  for (uint64_t x : dims) {
    if (x != 0 && v > UINT64_MAX / x) overflow = true;
    v *= x;
  }
  // A zero anywhere makes the product zero, even if a partial product overflowed.
  for (uint64_t x : dims) {
    if (x == 0) return uint64_t{0};
  }
  if (overflow) return InvalidArgument("size overflows 64 bits");
  return v;
}

bool Intersect(const Box& a, const Box& b, Box* out) {
  if (a.ndim != b.ndim) return false;
  out->ndim = a.ndim;
  for (uint32_t d = 0; d < a.ndim; ++d) {
    uint64_t lo = std::max(a.offset[d], b.offset[d]);
    uint64_t hi = std::min(a.end(d), b.end(d));
    if (hi <= lo) return false;
    out->offset[d] = lo;
    out->length[d] = hi - lo;
  }
  return true;
}

namespace {

// Slab decomposition: along dimension d, cut the region at every box boundary; inside each slab, the boxes that
// span it must tile the slab in the remaining dimensions. At the last level exactly one box must remain.
class TilingChecker {
 public:
  TilingChecker(const std::vector<Box>& boxes, uint32_t ndim, uint64_t budget)
      : boxes_(boxes), ndim_(ndim), budget_(budget) {}

  Status Check(uint32_t d, Box region, std::vector<uint32_t>& ids) {
    if (ids.size() > budget_) {
      return Unsupported("chunk layout is too irregular to validate (" + std::to_string(boxes_.size()) + " boxes)");
    }
    budget_ -= ids.size();
    if (d == ndim_) {
      if (ids.empty()) return Corrupt("region " + region.ToString() + " is not covered by any chunk (hole)");
      if (ids.size() > 1) {
        return Corrupt("chunks #" + std::to_string(ids[0]) + " " + boxes_[ids[0]].ToString() + " and #" +
                       std::to_string(ids[1]) + " " + boxes_[ids[1]].ToString() + " overlap");
      }
      return OkStatus();
    }
    std::vector<uint64_t> cuts;
    cuts.reserve(ids.size() * 2 + 2);
    cuts.push_back(region.offset[d]);
    cuts.push_back(region.end(d));
    for (uint32_t id : ids) {
      cuts.push_back(std::max(boxes_[id].offset[d], region.offset[d]));
      cuts.push_back(std::min(boxes_[id].end(d), region.end(d)));
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::sort(ids.begin(), ids.end(), [&](uint32_t a, uint32_t b) { return boxes_[a].offset[d] < boxes_[b].offset[d]; });

    std::vector<uint32_t> active;
    std::vector<uint32_t> sub;
    size_t next = 0;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      uint64_t lo = cuts[k], hi = cuts[k + 1];
      while (next < ids.size() && boxes_[ids[next]].offset[d] <= lo) active.push_back(ids[next++]);
      active.erase(std::remove_if(active.begin(), active.end(), [&](uint32_t id) { return boxes_[id].end(d) <= lo; }),
                   active.end());
      Box slab = region;
      slab.offset[d] = lo;
      slab.length[d] = hi - lo;
      sub = active;
      DCKPT_RETURN_IF_ERROR(Check(d + 1, slab, sub));
    }
    return OkStatus();
  }

 private:
  const std::vector<Box>& boxes_;
  uint32_t ndim_;
  uint64_t budget_;
};

// Fast path for the common case, a (possibly uneven) grid: each box is exactly one cell of the grid whose cut points
// along dimension d are the boxes' distinct offsets. Then the boxes tile `whole` exactly iff they are pairwise
// distinct cells and there are as many boxes as cells. Returns true only when that is proven; false means "not a
// simple grid, or not exact" and the caller runs the general checker (which also words the error). O(n log n) with a
// few allocations per call, none per box. Preconditions: whole is non-empty, every box is non-empty and inside it.
bool IsExactGrid(const Box& whole, const std::vector<Box>& boxes) {
  const size_t n = boxes.size();
  const uint32_t ndim = whole.ndim;
  if (n == 0) return false;
  std::vector<uint64_t> cuts[kMaxDims];
  uint64_t cells = 1;
  for (uint32_t d = 0; d < ndim; ++d) {
    std::vector<uint64_t>& c = cuts[d];
    c.reserve(n + 1);
    for (const Box& b : boxes) c.push_back(b.offset[d]);
    if (!std::is_sorted(c.begin(), c.end())) std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    if (c.front() != whole.offset[d]) return false;
    if (c.size() > n / cells) return false;  // more cells than boxes: there is a hole
    cells *= c.size();
    c.push_back(whole.end(d));  // so cell k spans [c[k], c[k+1])
  }
  if (cells != n) return false;
  std::vector<bool> seen(n, false);
  size_t hint[kMaxDims] = {};  // boxes usually come in grid order: try the previous cell and the next one first
  for (const Box& b : boxes) {
    uint64_t cell = 0;
    for (uint32_t d = 0; d < ndim; ++d) {
      const std::vector<uint64_t>& c = cuts[d];
      size_t k = hint[d];
      if (c[k] != b.offset[d]) {
        if (k + 2 < c.size() && c[k + 1] == b.offset[d]) {
          ++k;
        } else {
          k = static_cast<size_t>(std::lower_bound(c.begin(), c.end() - 1, b.offset[d]) - c.begin());
        }
      }
      hint[d] = k;
      if (b.end(d) != c[k + 1]) return false;  // box spans several cells
      cell = cell * (c.size() - 1) + k;
    }
    if (seen[cell]) return false;  // two identical boxes
    seen[cell] = true;
  }
  return true;
}

}  // namespace

Status CheckExactTiling(Span<const uint64_t> shape, const std::vector<Box>& boxes) {
  DCKPT_ASSIGN_OR_RETURN(Box whole, Box::Whole(shape));
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (boxes[i].ndim != whole.ndim) {
      return Corrupt("chunk #" + std::to_string(i) + " has " + std::to_string(boxes[i].ndim) +
                     " dimensions; the tensor has " + std::to_string(whole.ndim));
    }
    if (!whole.Contains(boxes[i])) {
      return Corrupt("chunk #" + std::to_string(i) + " " + boxes[i].ToString() + " lies outside the tensor " +
                     whole.ToString());
    }
  }
  if (whole.empty()) {
    for (size_t i = 0; i < boxes.size(); ++i) {
      if (!boxes[i].empty()) return Corrupt("chunk #" + std::to_string(i) + " is not empty in an empty tensor");
    }
    return OkStatus();
  }
  std::vector<uint32_t> ids;
  ids.reserve(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (boxes[i].empty()) {
      return Corrupt("chunk #" + std::to_string(i) + " " + boxes[i].ToString() + " is empty in a non-empty tensor");
    }
    ids.push_back(static_cast<uint32_t>(i));
  }
  if (IsExactGrid(whole, boxes)) return OkStatus();
  TilingChecker checker(boxes, whole.ndim, 64 * static_cast<uint64_t>(boxes.size()) * (whole.ndim + 1) + (1u << 20));
  return checker.Check(0, whole, ids);
}

}  // namespace distckpt
