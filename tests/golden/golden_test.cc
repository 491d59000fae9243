// The committed golden checkpoints load to their known values, forever. If this test fails after a format change,
// the change broke compatibility: fix the reader, never regenerate the goldens.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "tests/golden/golden_values.h"

namespace distckpt {
namespace golden {
namespace {

std::string GoldenDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(src ? src : ".") + "/" + (ws ? ws : "distckpt") + "/tests/golden/v1_all_dtypes";
}

std::vector<uint8_t> Expected(const GoldenTensor& t, const Box& box) {
  const uint64_t item = DTypeSize(t.dtype);
  std::vector<uint8_t> out(box.volume() * item);
  std::vector<uint64_t> idx(box.ndim);
  for (uint64_t e = 0; e < box.volume(); ++e) {
    uint64_t rem = e, linear = 0;
    for (int d = static_cast<int>(box.ndim) - 1; d >= 0; --d) {
      idx[d] = rem % box.length[d];
      rem /= box.length[d];
    }
    for (uint32_t d = 0; d < box.ndim; ++d) linear = linear * t.shape[d] + box.offset[d] + idx[d];
    for (uint64_t k = 0; k < item; ++k) out[e * item + k] = GoldenByte(t.name, linear, k);
  }
  return out;
}

TEST(GoldenTest, V1AllDtypesLoadsToKnownValues) {
  auto reader = Reader::Open(GoldenDir(), nullptr, ReadOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const MetadataView& m = (*reader)->metadata();
  EXPECT_EQ(m.format_major(), 1);
  EXPECT_EQ(m.FindUser("step").value(), "42");
  EXPECT_EQ(std::string(m.structure()), "{\"golden\": true}");
  ASSERT_TRUE((*reader)->VerifyAll(nullptr).ok());

  for (const GoldenTensor& t : AllDtypesTensors()) {
    SCOPED_TRACE(t.name);
    auto idx = m.Find(t.name);
    ASSERT_TRUE(idx.has_value());
    EntryView e = m.entry(*idx);
    EXPECT_EQ(e.dtype, t.dtype);
    EXPECT_EQ(std::vector<uint64_t>(e.shape.begin(), e.shape.end()), t.shape);
    // The whole tensor, then every single row (a partial read that crosses piece boundaries).
    Box whole = Box::Whole(t.shape).value();
    std::vector<uint8_t> got(whole.volume() * DTypeSize(t.dtype));
    ASSERT_TRUE((*reader)->ReadRegion(t.name, whole, got.data(), got.size()).ok());
    EXPECT_EQ(got, Expected(t, whole));
    if (!t.shape.empty()) {
      for (uint64_t r = 0; r < t.shape[0]; ++r) {
        Box row = whole;
        row.offset[0] = r;
        row.length[0] = 1;
        std::vector<uint8_t> g(row.volume() * DTypeSize(t.dtype));
        ASSERT_TRUE((*reader)->ReadRegion(t.name, row, g.data(), g.size()).ok());
        EXPECT_EQ(g, Expected(t, row));
      }
    }
  }
  std::string blob(256, '\0');
  auto size = (*reader)->ReadBytes("train.state", blob.data(), blob.size());
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(blob.substr(0, *size), GoldenBytesValue());
}

}  // namespace
}  // namespace golden
}  // namespace distckpt
