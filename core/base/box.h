// N-d boxes (hyper-rectangles) in a tensor's global index space, and the exact-tiling check.
#ifndef DISTCKPT_CORE_BASE_BOX_H_
#define DISTCKPT_CORE_BASE_BOX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/span.h"
#include "core/base/status.h"

namespace distckpt {

/// The most dimensions a tensor may have.
constexpr uint32_t kMaxDims = 8;

/// A box [offset, offset + length) per dimension. ndim == 0 is a scalar (volume 1). A zero length is valid
/// and makes the box empty. Fixed-size storage: no allocation, cheap to copy.
struct Box {
  uint32_t ndim = 0;
  uint64_t offset[kMaxDims] = {};
  uint64_t length[kMaxDims] = {};

  /// Builds a box, checking ndim <= kMaxDims and that offset + length does not overflow.
  static Result<Box> Make(Span<const uint64_t> offsets, Span<const uint64_t> lengths);
  /// The box [0, shape) covering a whole tensor.
  static Result<Box> Whole(Span<const uint64_t> shape);

  uint64_t end(uint32_t d) const { return offset[d] + length[d]; }
  /// Number of elements. The caller must know it does not overflow (see CheckedVolume).
  uint64_t volume() const;
  bool empty() const;
  bool operator==(const Box& o) const;
  bool operator!=(const Box& o) const { return !(*this == o); }
  /// True if `inner` lies inside this box (same ndim).
  bool Contains(const Box& inner) const;
  std::string ToString() const;  ///< e.g. "[0:4, 8:16]"
};

/// Product of `dims` times `itemsize`, or an error on uint64 overflow.
Result<uint64_t> CheckedVolume(Span<const uint64_t> dims, uint64_t itemsize = 1);

/// Intersection of two boxes with the same ndim. Returns false (and leaves *out unspecified) when it is empty.
bool Intersect(const Box& a, const Box& b, Box* out);

/// Checks that `boxes` tile the box [0, shape) exactly: every box inside it, no two overlapping, no hole.
/// For a tensor with zero elements, every box must be empty and inside the bounds.
/// Empty boxes in a non-empty tensor are rejected. On failure the message names the offending box indices.
/// Runs in O(n log n) for grid-like tilings; pathological layouts are bounded by a work limit.
Status CheckExactTiling(Span<const uint64_t> shape, const std::vector<Box>& boxes);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_BOX_H_
