#include "core/plan/copy_plan.h"

#include <algorithm>

namespace distckpt {

uint64_t CopyPlan::num_runs() const {
  if (run_length == 0) return 0;
  uint64_t n = 1;
  for (uint32_t d = 0; d < outer_dims; ++d) n *= count[d];
  return n;
}

uint64_t CopyPlan::src_end() const {
  if (num_runs() == 0) return src_base;
  uint64_t end = src_base + run_length;
  for (uint32_t d = 0; d < outer_dims; ++d) end += (count[d] - 1) * src_stride[d];
  return end;
}

CopyPlan MakeCopyPlan(const Box& region, const Box& src, const Box& dst, uint64_t itemsize) {
  CopyPlan plan;
  const uint32_t n = region.ndim;
  if (region.empty()) return plan;  // run_length 0: no runs

  // Row-major byte strides of both buffers, and the region's first byte in each.
  uint64_t src_stride[kMaxDims], dst_stride[kMaxDims];
  uint64_t s = itemsize, t = itemsize;
  for (int d = static_cast<int>(n) - 1; d >= 0; --d) {
    src_stride[d] = s;
    dst_stride[d] = t;
    s *= src.length[d];
    t *= dst.length[d];
  }
  for (uint32_t d = 0; d < n; ++d) {
    plan.src_base += (region.offset[d] - src.offset[d]) * src_stride[d];
    plan.dst_base += (region.offset[d] - dst.offset[d]) * dst_stride[d];
  }

  // Fold trailing dimensions into the run: dimension d joins the run when every dimension after it spans the full
  // extent of both buffers, so consecutive rows of d are adjacent in memory on both sides.
  uint64_t run = itemsize;
  int d = static_cast<int>(n) - 1;
  for (; d >= 0; --d) {
    run *= region.length[d];
    if (region.length[d] != src.length[d] || region.length[d] != dst.length[d]) {
      --d;
      break;
    }
  }
  plan.run_length = run;

  // The remaining dimensions 0..d are loops. Drop trivial ones (count 1) and fuse neighbours whose strides nest
  // (possible when a middle dimension is full but a later one is not), so the plan stays as short as possible.
  for (int k = 0; k <= d; ++k) {
    if (region.length[k] == 1) continue;
    const uint32_t o = plan.outer_dims;
    if (o > 0 && plan.src_stride[o - 1] == region.length[k] * src_stride[k] &&
        plan.dst_stride[o - 1] == region.length[k] * dst_stride[k]) {
      plan.count[o - 1] *= region.length[k];
      plan.src_stride[o - 1] = src_stride[k];
      plan.dst_stride[o - 1] = dst_stride[k];
      continue;
    }
    plan.count[o] = region.length[k];
    plan.src_stride[o] = src_stride[k];
    plan.dst_stride[o] = dst_stride[k];
    plan.outer_dims = o + 1;
  }
  return plan;
}

std::vector<ByteRun> MaterializeRuns(const CopyPlan& plan) {
  std::vector<ByteRun> runs;
  runs.reserve(plan.num_runs());
  plan.ForEachRun([&runs](const ByteRun& r) {
    if (!runs.empty()) {
      ByteRun& last = runs.back();
      if (last.src + last.length == r.src && last.dst + last.length == r.dst) {
        last.length += r.length;
        return;
      }
    }
    runs.push_back(r);
  });
  return runs;
}

void CoalesceRuns(std::vector<ByteRun>* runs) {
  std::vector<ByteRun>& v = *runs;
  std::sort(v.begin(), v.end(),
            [](const ByteRun& a, const ByteRun& b) { return a.src != b.src ? a.src < b.src : a.dst < b.dst; });
  size_t out = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].length == 0) continue;
    if (out > 0) {
      ByteRun& last = v[out - 1];
      if (last.src + last.length == v[i].src && last.dst + last.length == v[i].dst) {
        last.length += v[i].length;
        continue;
      }
    }
    v[out++] = v[i];
  }
  v.resize(out);
}

}  // namespace distckpt
