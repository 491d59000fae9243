#include "core/base/stream_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace distckpt {
namespace {

// Every size around the thresholds and every alignment of source and destination copies exactly the bytes asked for.
TEST(StreamCopyTest, CopiesExactlyAtEverySizeAndAlignment) {
  const size_t sizes[] = {0, 1, 63, 64, 65, (64 << 10) - 1, 64 << 10, (64 << 10) + 1, (1 << 20) + 37};
  std::vector<uint8_t> src((1 << 20) + 256), dst(src.size() + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t n : sizes) {
    for (size_t so : {0, 1, 17, 64}) {
      for (size_t d_off : {0, 3, 32, 63}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        StreamCopy(dst.data() + d_off, src.data() + so, n);
        for (size_t i = 0; i < d_off; ++i) ASSERT_EQ(dst[i], 0xEE) << n << " " << so << " " << d_off;
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(dst[d_off + i], src[so + i]) << n << " " << so << " " << d_off << " @" << i;
        ASSERT_EQ(dst[d_off + n], 0xEE) << n << " " << so << " " << d_off;
      }
    }
  }
}

}  // namespace
}  // namespace distckpt
