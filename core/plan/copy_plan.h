// Turning the intersection of two row-major boxes into contiguous byte runs.
#ifndef DISTCKPT_CORE_PLAN_COPY_PLAN_H_
#define DISTCKPT_CORE_PLAN_COPY_PLAN_H_

#include <cstdint>
#include <vector>

#include "core/base/box.h"

namespace distckpt {

/// One contiguous copy: `length` bytes from byte `src` of the source buffer to byte `dst` of the destination.
struct ByteRun {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t length = 0;
  bool operator==(const ByteRun& o) const { return src == o.src && dst == o.dst && length == o.length; }
};

/// A strided description of the runs that copy `region` from a row-major buffer holding box `src` into a
/// row-major buffer holding box `dst`. Trailing dimensions that are contiguous in both buffers are merged into a
/// single run, so a full-box copy is one run. Runs are produced in increasing src (and dst) order.
struct CopyPlan {
  uint64_t src_base = 0;    ///< byte offset of the first run in the source buffer
  uint64_t dst_base = 0;    ///< byte offset of the first run in the destination buffer
  uint64_t run_length = 0;  ///< bytes per run
  uint32_t outer_dims = 0;  ///< number of outer loop dimensions
  uint64_t count[kMaxDims] = {};
  uint64_t src_stride[kMaxDims] = {};  ///< bytes
  uint64_t dst_stride[kMaxDims] = {};  ///< bytes

  /// Number of runs (product of count). 0 if run_length == 0.
  uint64_t num_runs() const;
  uint64_t total_bytes() const { return num_runs() * run_length; }
  /// First and one-past-last source byte touched.
  uint64_t src_begin() const { return src_base; }
  uint64_t src_end() const;

  /// Calls fn(const ByteRun&) for every run in increasing order.
  template <typename Fn>
  void ForEachRun(Fn&& fn) const;
};

/// Builds the plan. Precondition: region is inside both src and dst, all three have the same ndim, itemsize > 0.
CopyPlan MakeCopyPlan(const Box& region, const Box& src, const Box& dst, uint64_t itemsize);

/// Materialises every run of `plan`, coalescing runs that are adjacent in both src and dst.
std::vector<ByteRun> MaterializeRuns(const CopyPlan& plan);

/// Sorts runs by src and merges neighbours that are contiguous in both src and dst.
void CoalesceRuns(std::vector<ByteRun>* runs);

template <typename Fn>
void CopyPlan::ForEachRun(Fn&& fn) const {
  if (run_length == 0) return;
  uint64_t idx[kMaxDims] = {};
  for (uint32_t d = 0; d < outer_dims; ++d) {
    if (count[d] == 0) return;
  }
  while (true) {
    uint64_t s = src_base, t = dst_base;
    for (uint32_t d = 0; d < outer_dims; ++d) {
      s += idx[d] * src_stride[d];
      t += idx[d] * dst_stride[d];
    }
    fn(ByteRun{s, t, run_length});
    int d = static_cast<int>(outer_dims) - 1;
    while (d >= 0) {
      if (++idx[d] < count[d]) break;
      idx[d] = 0;
      --d;
    }
    if (d < 0) return;
  }
}

}  // namespace distckpt

#endif  // DISTCKPT_CORE_PLAN_COPY_PLAN_H_
