#include "core/base/box.h"

#include <gtest/gtest.h>

#include <random>

#include "core/base/dtype.h"

namespace distckpt {
namespace {

Box B(std::vector<uint64_t> off, std::vector<uint64_t> len) { return Box::Make(off, len).value(); }

TEST(BoxTest, IntersectAndVolume) {
  Box a = B({0, 0}, {4, 8}), b = B({2, 6}, {4, 4}), out;
  ASSERT_TRUE(Intersect(a, b, &out));
  EXPECT_EQ(out, B({2, 6}, {2, 2}));
  EXPECT_EQ(out.volume(), 4u);
  EXPECT_FALSE(Intersect(a, B({4, 0}, {1, 1}), &out));
  Box scalar;
  EXPECT_EQ(scalar.volume(), 1u);
  EXPECT_TRUE(Intersect(scalar, scalar, &out));
}

TEST(BoxTest, MakeRejectsOverflowAndTooManyDims) {
  EXPECT_FALSE(Box::Make(std::vector<uint64_t>{UINT64_MAX}, std::vector<uint64_t>{2}).ok());
  std::vector<uint64_t> nine(9, 1);
  EXPECT_FALSE(Box::Make(nine, nine).ok());
  EXPECT_FALSE(CheckedVolume(std::vector<uint64_t>{1ull << 40, 1ull << 40}).ok());
  EXPECT_EQ(CheckedVolume(std::vector<uint64_t>{1ull << 40, 1ull << 40, 0}).value(), 0u);
  EXPECT_EQ(CheckedVolume(std::vector<uint64_t>{3, 5}, 4).value(), 60u);
}

TEST(TilingTest, AcceptsGridsAndIrregularTilings) {
  std::vector<uint64_t> shape{6, 6};
  EXPECT_TRUE(CheckExactTiling(shape, {B({0, 0}, {6, 6})}).ok());
  EXPECT_TRUE(CheckExactTiling(shape, {B({0, 0}, {3, 6}), B({3, 0}, {3, 6})}).ok());
  // Row bands split differently in columns.
  EXPECT_TRUE(CheckExactTiling(shape, {B({0, 0}, {2, 1}), B({0, 1}, {2, 5}), B({2, 0}, {4, 4}), B({2, 4}, {4, 2})}).ok());
  // Scalar and empty tensors.
  EXPECT_TRUE(CheckExactTiling(std::vector<uint64_t>{}, {Box()}).ok());
  EXPECT_FALSE(CheckExactTiling(std::vector<uint64_t>{}, {Box(), Box()}).ok());
  EXPECT_TRUE(CheckExactTiling(std::vector<uint64_t>{0, 5}, {B({0, 0}, {0, 5})}).ok());
  EXPECT_TRUE(CheckExactTiling(std::vector<uint64_t>{0, 5}, {}).ok());
}

TEST(TilingTest, RejectsOverlapHoleAndOutOfBounds) {
  std::vector<uint64_t> shape{6, 6};
  Status overlap = CheckExactTiling(shape, {B({0, 0}, {4, 6}), B({3, 0}, {3, 6})});
  EXPECT_EQ(overlap.code(), StatusCode::kCorrupt);
  EXPECT_NE(overlap.message().find("overlap"), std::string::npos) << overlap.message();
  Status hole = CheckExactTiling(shape, {B({0, 0}, {2, 6}), B({3, 0}, {3, 6})});
  EXPECT_NE(hole.message().find("hole"), std::string::npos) << hole.message();
  EXPECT_FALSE(CheckExactTiling(shape, {B({0, 0}, {7, 6})}).ok());
  EXPECT_FALSE(CheckExactTiling(shape, {B({0, 0}, {6, 6}), B({0, 0}, {0, 6})}).ok());
  EXPECT_FALSE(CheckExactTiling(shape, {}).ok());
}

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kC128), 16u);
  EXPECT_STREQ(DTypeName(DType::kF8E4M3FN), "F8_E4M3");
  EXPECT_EQ(DTypeFromName("float32"), DType::kF32);
  EXPECT_EQ(DTypeFromName("bf16"), DType::kBF16);
  EXPECT_EQ(DTypeFromName("nope"), DType::kInvalid);
  EXPECT_FALSE(IsValidDType(0));
  EXPECT_FALSE(IsValidDType(18));
}

// Brute force: every element of the tensor is covered exactly once, and every box lies inside it.
bool TilesExactlyOracle(const std::vector<uint64_t>& shape, const std::vector<Box>& boxes) {
  Box whole = Box::Whole(shape).value();
  uint64_t total = whole.volume();
  std::vector<int> count(total, 0);
  for (const Box& b : boxes) {
    if (!whole.Contains(b)) return false;
    if (total > 0 && b.empty()) return false;  // CheckExactTiling's documented rule
    std::vector<uint64_t> idx(b.ndim, 0);
    for (uint64_t v = 0; v < b.volume(); ++v) {
      uint64_t rem = v, lin = 0;
      for (int d = static_cast<int>(b.ndim) - 1; d >= 0; --d) {
        idx[d] = b.offset[d] + rem % b.length[d];
        rem /= b.length[d];
      }
      for (uint32_t d = 0; d < b.ndim; ++d) lin = lin * shape[d] + idx[d];
      ++count[lin];
    }
  }
  for (int c : count) {
    if (c != 1) return false;
  }
  return true;
}

// Grid tilings (which take CheckExactTiling's fast path), then damaged ones: merged cells, moved, duplicated and
// dropped boxes. The verdict must match the oracle every time.
TEST(TilingTest, MatchesBruteForceOnRandomGrids) {
  std::mt19937_64 rng(12345);
  int exact = 0, inexact = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const uint32_t ndim = 1 + rng() % 3;
    std::vector<uint64_t> shape(ndim);
    std::vector<std::vector<uint64_t>> cuts(ndim);
    for (uint32_t d = 0; d < ndim; ++d) {
      shape[d] = 1 + rng() % 6;
      cuts[d].push_back(0);
      for (uint64_t x = 1; x < shape[d]; ++x) {
        if (rng() % 2) cuts[d].push_back(x);
      }
      cuts[d].push_back(shape[d]);
    }
    std::vector<Box> boxes;
    std::vector<size_t> k(ndim, 0);
    while (true) {
      Box b;
      b.ndim = ndim;
      for (uint32_t d = 0; d < ndim; ++d) {
        b.offset[d] = cuts[d][k[d]];
        b.length[d] = cuts[d][k[d] + 1] - cuts[d][k[d]];
      }
      boxes.push_back(b);
      uint32_t d = 0;
      while (d < ndim && ++k[d] + 1 == cuts[d].size()) k[d++] = 0;
      if (d == ndim) break;
    }
    std::shuffle(boxes.begin(), boxes.end(), rng);
    switch (rng() % 6) {
      case 0:  // untouched
        break;
      case 1:  // grow a box by one along some dimension (overlap or out of bounds)
        boxes[rng() % boxes.size()].length[rng() % ndim] += 1;
        break;
      case 2:  // shrink a box (hole, or an empty box)
        boxes[rng() % boxes.size()].length[rng() % ndim] -= 1;
        break;
      case 3:  // duplicate
        boxes.push_back(boxes[rng() % boxes.size()]);
        break;
      case 4:  // drop
        boxes.erase(boxes.begin() + rng() % boxes.size());
        break;
      case 5: {  // merge two neighbours along dimension 0 if they line up (still exact, but not a simple grid)
        Box& a = boxes[rng() % boxes.size()];
        for (size_t j = 0; j < boxes.size(); ++j) {
          Box& c = boxes[j];
          bool aligned = c.offset[0] == a.end(0);
          for (uint32_t d = 1; d < ndim; ++d) aligned = aligned && c.offset[d] == a.offset[d] && c.length[d] == a.length[d];
          if (aligned) {
            a.length[0] += c.length[0];
            boxes.erase(boxes.begin() + j);
            break;
          }
        }
        break;
      }
    }
    const bool want = TilesExactlyOracle(shape, boxes);
    const Status got = CheckExactTiling(shape, boxes);
    ASSERT_EQ(got.ok(), want) << "iteration " << iter << ": " << got.ToString();
    (want ? exact : inexact)++;
  }
  EXPECT_GT(exact, 500);
  EXPECT_GT(inexact, 500);
}

}  // namespace
}  // namespace distckpt
