#include "core/base/box.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace distckpt
