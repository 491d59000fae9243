#include "core/plan/copy_plan.h"

#include <gtest/gtest.h>

#include <vector>

namespace distckpt {
namespace {

Box B(std::vector<uint64_t> off, std::vector<uint64_t> len) { return Box::Make(off, len).value(); }

TEST(CopyPlanTest, FullBoxIsOneRun) {
  Box box = B({4, 0, 2}, {3, 5, 7});
  CopyPlan p = MakeCopyPlan(box, box, box, 4);
  EXPECT_EQ(p.num_runs(), 1u);
  EXPECT_EQ(p.outer_dims, 0u);
  EXPECT_EQ(MaterializeRuns(p), (std::vector<ByteRun>{{0, 0, 3 * 5 * 7 * 4}}));
  EXPECT_EQ(p.src_end(), 3u * 5 * 7 * 4);
}

TEST(CopyPlanTest, RowSlabIsOneRun) {
  // Rows 2..5 of an 8x6 f64 chunk into a destination holding rows 1..7.
  Box src = B({0, 0}, {8, 6}), dst = B({1, 0}, {6, 6}), region = B({2, 0}, {3, 6});
  CopyPlan p = MakeCopyPlan(region, src, dst, 8);
  EXPECT_EQ(p.num_runs(), 1u);
  EXPECT_EQ(MaterializeRuns(p), (std::vector<ByteRun>{{2 * 6 * 8, 1 * 6 * 8, 3 * 6 * 8}}));
}

TEST(CopyPlanTest, PartialLeadingDimensionFoldsIntoTheRun) {
  // 3-d: rows 1..3 of dim 0 with dims 1, 2 full on both sides.
  Box src = B({0, 0, 0}, {4, 2, 3}), dst = B({1, 0, 0}, {2, 2, 3});
  CopyPlan p = MakeCopyPlan(B({1, 0, 0}, {2, 2, 3}), src, dst, 2);
  EXPECT_EQ(p.num_runs(), 1u);
  EXPECT_EQ(p.run_length, 2u * 2 * 3 * 2);
  EXPECT_EQ(p.src_base, 1u * 2 * 3 * 2);
  EXPECT_EQ(p.dst_base, 0u);
}

TEST(CopyPlanTest, ColumnSlabIsOneRunPerRow) {
  // Columns 4..6 of a 5x10 u8 matrix into a 5x2 destination.
  Box src = B({0, 0}, {5, 10}), dst = B({0, 4}, {5, 2});
  CopyPlan p = MakeCopyPlan(dst, src, dst, 1);
  EXPECT_EQ(p.num_runs(), 5u);
  EXPECT_EQ(p.run_length, 2u);
  std::vector<ByteRun> runs = MaterializeRuns(p);
  ASSERT_EQ(runs.size(), 5u);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(runs[i], (ByteRun{i * 10 + 4, i * 2, 2}));
  EXPECT_EQ(p.src_end(), 4 * 10 + 4 + 2u);
}

TEST(CopyPlanTest, FullMiddleDimensionsFuseIntoOneLoop) {
  // Region spans dims 0 and 1 fully but only part of dim 2: one loop of 2*4 runs, not two nested loops.
  Box src = B({0, 0, 0}, {2, 4, 6}), dst = B({0, 0, 1}, {2, 4, 3});
  CopyPlan p = MakeCopyPlan(B({0, 0, 2}, {2, 4, 2}), src, dst, 4);
  EXPECT_EQ(p.outer_dims, 1u);
  EXPECT_EQ(p.count[0], 8u);
  EXPECT_EQ(p.src_stride[0], 6u * 4);
  EXPECT_EQ(p.dst_stride[0], 3u * 4);
  EXPECT_EQ(p.num_runs(), 8u);
}

TEST(CopyPlanTest, ScalarIsOneItem) {
  Box scalar;
  CopyPlan p = MakeCopyPlan(scalar, scalar, scalar, 16);
  EXPECT_EQ(p.num_runs(), 1u);
  EXPECT_EQ(MaterializeRuns(p), (std::vector<ByteRun>{{0, 0, 16}}));
}

TEST(CopyPlanTest, EmptyRegionHasNoRuns) {
  Box src = B({0, 0}, {4, 4});
  CopyPlan p = MakeCopyPlan(B({1, 2}, {0, 2}), src, src, 4);
  EXPECT_EQ(p.num_runs(), 0u);
  EXPECT_EQ(p.total_bytes(), 0u);
  EXPECT_TRUE(MaterializeRuns(p).empty());
  EXPECT_EQ(p.src_end(), p.src_begin());
}

TEST(CopyPlanTest, CoalesceMergesRunsContiguousOnBothSides) {
  std::vector<ByteRun> runs{{20, 120, 10}, {0, 100, 10}, {10, 110, 10}, {40, 200, 5}, {45, 300, 5}, {50, 0, 0}};
  CoalesceRuns(&runs);
  EXPECT_EQ(runs, (std::vector<ByteRun>{{0, 100, 30}, {40, 200, 5}, {45, 300, 5}}));
}

}  // namespace
}  // namespace distckpt
