// Test-only generators of random tensor shapes and shardings, shared by the planner property tests.
#ifndef DISTCKPT_CORE_PLAN_TEST_SHARDINGS_H_
#define DISTCKPT_CORE_PLAN_TEST_SHARDINGS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/base/box.h"

namespace distckpt {
namespace testing_shardings {

using Rng = std::mt19937_64;

inline uint64_t Uniform(Rng& rng, uint64_t lo, uint64_t hi) {  // inclusive
  return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
}

inline bool Chance(Rng& rng, double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

/// A random shape with ndim in [0, max_ndim] and at most `max_elements` elements; sometimes a zero-size dimension.
inline std::vector<uint64_t> RandomShape(Rng& rng, uint32_t max_ndim, uint64_t max_elements) {
  const uint32_t ndim = static_cast<uint32_t>(Uniform(rng, 0, max_ndim));
  std::vector<uint64_t> shape(ndim);
  uint64_t budget = max_elements;
  for (uint32_t d = 0; d < ndim; ++d) {
    // Spread the budget so later dimensions are not always 1.
    const double root = std::pow(static_cast<double>(budget), 1.0 / (ndim - d));
    const uint64_t hi = std::max<uint64_t>(1, std::min<uint64_t>(budget, static_cast<uint64_t>(2 * root)));
    shape[d] = Uniform(rng, 1, hi);
    budget = std::max<uint64_t>(1, budget / shape[d]);
  }
  if (ndim > 0 && Chance(rng, 0.06)) shape[Uniform(rng, 0, ndim - 1)] = 0;
  return shape;
}

/// Sorted distinct cut points 0 = c0 < ... < ck = size splitting [0, size) into about `parts` pieces (one piece
/// [0, 0) for a zero size). `even` spreads them like torch.chunk; otherwise they are random.
inline std::vector<uint64_t> Cuts(Rng& rng, uint64_t size, uint64_t parts, bool even) {
  std::vector<uint64_t> c{0};
  if (size == 0) return {0, 0};
  parts = std::max<uint64_t>(1, std::min(parts, size));
  if (even) {
    const uint64_t step = (size + parts - 1) / parts;
    for (uint64_t x = step; x < size; x += step) c.push_back(x);
  } else {
    for (uint64_t i = 1; i < parts; ++i) c.push_back(Uniform(rng, 1, size - 1));
  }
  c.push_back(size);
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}

/// The cartesian product of per-dimension cut lists, as boxes in row-major order.
inline std::vector<Box> GridBoxes(const std::vector<std::vector<uint64_t>>& cuts) {
  const uint32_t ndim = static_cast<uint32_t>(cuts.size());
  std::vector<Box> out;
  std::vector<size_t> idx(ndim, 0);
  while (true) {
    Box b;
    b.ndim = ndim;
    for (uint32_t d = 0; d < ndim; ++d) {
      b.offset[d] = cuts[d][idx[d]];
      b.length[d] = cuts[d][idx[d] + 1] - cuts[d][idx[d]];
    }
    out.push_back(b);
    int d = static_cast<int>(ndim) - 1;
    while (d >= 0 && ++idx[d] + 1 == cuts[d].size()) idx[d--] = 0;
    if (d < 0) return out;
  }
}

// Recursive random bisection: a k-d tree of boxes, generally not a grid.
inline void SplitRandomly(Rng& rng, const Box& b, int depth, std::vector<Box>* out) {
  std::vector<uint32_t> splittable;
  for (uint32_t d = 0; d < b.ndim; ++d) {
    if (b.length[d] >= 2) splittable.push_back(d);
  }
  if (depth == 0 || splittable.empty() || Chance(rng, 0.15)) {
    out->push_back(b);
    return;
  }
  const uint32_t d = splittable[Uniform(rng, 0, splittable.size() - 1)];
  const uint64_t cut = Uniform(rng, b.offset[d] + 1, b.end(d) - 1);
  Box lo = b, hi = b;
  lo.length[d] = cut - b.offset[d];
  hi.offset[d] = cut;
  hi.length[d] = b.end(d) - cut;
  SplitRandomly(rng, lo, depth - 1, out);
  SplitRandomly(rng, hi, depth - 1, out);
}

enum class Family { kWhole, kRow, kColumn, kBlock2D, kUneven, kIrregular, kNumTiling };

inline const char* FamilyName(Family f) {
  switch (f) {
    case Family::kWhole:
      return "whole";
    case Family::kRow:
      return "row";
    case Family::kColumn:
      return "column";
    case Family::kBlock2D:
      return "block2d";
    case Family::kUneven:
      return "uneven";
    case Family::kIrregular:
      return "irregular";
    default:
      return "?";
  }
}

/// Boxes that tile [0, shape) exactly, from one sharding family. For a tensor with no elements, the pieces are empty.
inline std::vector<Box> RandomTiling(Rng& rng, const std::vector<uint64_t>& shape, Family family) {
  const uint32_t ndim = static_cast<uint32_t>(shape.size());
  std::vector<std::vector<uint64_t>> cuts(ndim);
  for (uint32_t d = 0; d < ndim; ++d) cuts[d] = Cuts(rng, shape[d], 1, true);
  if (ndim == 0) return {Box()};
  switch (family) {
    case Family::kWhole:
      break;
    case Family::kRow:
      cuts[0] = Cuts(rng, shape[0], Uniform(rng, 2, 8), true);
      break;
    case Family::kColumn:
      cuts[ndim - 1] = Cuts(rng, shape[ndim - 1], Uniform(rng, 2, 8), true);
      break;
    case Family::kBlock2D: {
      const uint32_t a = static_cast<uint32_t>(Uniform(rng, 0, ndim - 1));
      const uint32_t b = static_cast<uint32_t>(Uniform(rng, 0, ndim - 1));
      cuts[a] = Cuts(rng, shape[a], Uniform(rng, 2, 4), true);
      cuts[b] = Cuts(rng, shape[b], Uniform(rng, 2, 4), true);
      break;
    }
    case Family::kUneven:
      for (uint32_t d = 0; d < ndim; ++d) {
        if (Chance(rng, 0.5)) cuts[d] = Cuts(rng, shape[d], Uniform(rng, 1, 5), false);
      }
      break;
    case Family::kIrregular: {
      Box whole = Box::Whole(shape).value();
      if (whole.empty()) break;
      std::vector<Box> out;
      SplitRandomly(rng, whole, static_cast<int>(Uniform(rng, 1, 6)), &out);
      return out;
    }
    default:
      break;
  }
  return GridBoxes(cuts);
}

inline Family RandomFamily(Rng& rng) {
  return static_cast<Family>(Uniform(rng, 0, static_cast<uint64_t>(Family::kNumTiling) - 1));
}

/// A random box inside [0, shape), possibly empty.
inline Box RandomSubBox(Rng& rng, const std::vector<uint64_t>& shape) {
  Box b;
  b.ndim = static_cast<uint32_t>(shape.size());
  for (uint32_t d = 0; d < b.ndim; ++d) {
    const uint64_t lo = Uniform(rng, 0, shape[d]);
    const uint64_t hi = Uniform(rng, lo, shape[d]);
    b.offset[d] = lo;
    b.length[d] = hi - lo;
  }
  return b;
}

}  // namespace testing_shardings
}  // namespace distckpt

#endif  // DISTCKPT_CORE_PLAN_TEST_SHARDINGS_H_
