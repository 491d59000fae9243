#include "core/codec/block_codec.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace distckpt {
namespace {

// bf16-like values: random mantissas, exponents in a narrow band (as trained weights have).
std::string Weights(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n * 2, '\0');
  for (size_t i = 0; i < n; ++i) {
    uint16_t v = static_cast<uint16_t>((rng() & 0x807f) | ((0x3c + rng() % 4) << 7));
    std::memcpy(&s[i * 2], &v, 2);
  }
  return s;
}

TEST(GroupBytes, RoundTripsEveryWidth) {
  for (size_t elements : {1, 15, 16, 17, 37, 512, 1031}) {
    std::string src(elements * 8, '\0');
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 3);
    for (size_t width : {2, 4, 8}) {
      const size_t len = elements * width;
      std::string grouped(len, '\0'), back(len, '\0');
      GroupBytes(src.data(), len, width, &grouped[0]);
      for (size_t i = 0; i < elements; ++i) {
        for (size_t j = 0; j < width; ++j) ASSERT_EQ(grouped[j * elements + i], src[i * width + j]) << width;
      }
      UngroupBytes(grouped.data(), len, width, &back[0]);
      EXPECT_EQ(back, src.substr(0, len)) << "width " << width << ", " << elements << " elements";
    }
  }
  std::string src(4096, '\0');
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 3);
  for (size_t width : {1, 2, 4, 8}) {
    std::string grouped(src.size(), '\0'), back(src.size(), '\0');
    GroupBytes(src.data(), src.size(), width, &grouped[0]);
    if (width > 1) {
      EXPECT_EQ(grouped[0], src[0]);
      EXPECT_EQ(grouped[1], src[width]);               // element 1's first byte follows element 0's
      EXPECT_EQ(grouped[src.size() / width], src[1]);  // then every second byte
    }
    UngroupBytes(grouped.data(), grouped.size(), width, &back[0]);
    EXPECT_EQ(back, src) << "width " << width;
  }
}

TEST(GroupWidth, GroupsTwoFourAndEightByteElements) {
  EXPECT_EQ(GroupWidth(1), 1u);
  EXPECT_EQ(GroupWidth(2), 2u);
  EXPECT_EQ(GroupWidth(4), 4u);
  EXPECT_EQ(GroupWidth(8), 8u);
  EXPECT_EQ(GroupWidth(16), 1u);
}

TEST(EncodeBlock, ShrinksWeightsAndDecodesExactlyAtEveryKindOfLevel) {
  const std::string src = Weights(1 << 19, 1);
  for (int level : {kEntropyLevel, 1, 3, -5}) {
    std::string out(src.size(), '\0'), back(src.size(), '\0');
    auto n = EncodeBlock(src.data(), src.size(), 2, level, &out[0]);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    if (level >= 0) EXPECT_LT(*n, src.size() * 8 / 10) << level;  // the exponent bytes compress, the mantissas do not
    ASSERT_TRUE(DecodeBlock(out.data(), *n, 2, &back[0], back.size()).ok()) << level;
    EXPECT_EQ(back, src) << level;
  }
}

TEST(EncodeBlock, EntropyFramesCodeEachPlaneAndSmallBlocks) {
  // fp32 whose top bytes are constant and low bytes random, in a block that is not a multiple of zstd's 128 KiB.
  std::mt19937 rng(5);
  for (size_t elements : {1u, 3u, 1000u, 40000u, 70001u}) {
    std::string src(elements * 4, '\0');
    for (size_t i = 0; i < elements; ++i) {
      const uint32_t v = 0x3f000000u | (rng() & 0xffff);
      std::memcpy(&src[i * 4], &v, 4);
    }
    std::string out(src.size(), '\0'), back(src.size(), '\0');
    auto n = EncodeBlock(src.data(), src.size(), 4, kEntropyLevel, &out[0]);
    ASSERT_TRUE(n.ok());
    if (elements >= 1000) EXPECT_LT(*n, src.size() * 6 / 10) << elements;
    ASSERT_TRUE(DecodeBlock(*n == src.size() ? src.data() : out.data(), *n, 4, &back[0], back.size()).ok());
    EXPECT_EQ(back, src) << elements;
  }
}

TEST(EncodeBlock, RandomBytesAreStoredRaw) {
  std::mt19937_64 rng(2);
  std::string src(1 << 16, '\0');
  for (size_t i = 0; i < src.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(&src[i], &v, 8);
  }
  std::string out(src.size(), '\0'), back(src.size(), '\0');
  for (int level : {kEntropyLevel, 3}) {
    auto n = EncodeBlock(src.data(), src.size(), 4, level, &out[0]);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, src.size()) << level;
  }
  ASSERT_TRUE(DecodeBlock(src.data(), src.size(), 4, &back[0], back.size()).ok());  // a raw block is its own copy
  EXPECT_EQ(back, src);
}

TEST(EncodeBlock, RejectsAnUnknownLevel) {
  const std::string src = Weights(1024, 3);
  std::string out(src.size(), '\0');
  EXPECT_FALSE(EncodeBlock(src.data(), src.size(), 2, MaxCompressionLevel() + 100, &out[0]).ok());
}

TEST(DecodeBlock, DamageIsAnErrorNeverAnOverrun) {
  const std::string src = Weights(1 << 14, 4);
  std::string frame(src.size(), '\0');
  auto n = EncodeBlock(src.data(), src.size(), 2, kEntropyLevel, &frame[0]);
  ASSERT_TRUE(n.ok());
  frame.resize(*n);
  // Every truncation, and a flipped bit at every byte: an error, or (where zstd cannot tell) the exact length; the
  // destination is guarded, and the bytes past it stay untouched.
  for (size_t cut = 0; cut < frame.size(); cut += 1 + cut / 8) {
    std::string dst(src.size() + 64, 'g');
    Status st = DecodeBlock(frame.data(), cut, 2, &dst[0], src.size());
    EXPECT_FALSE(st.ok()) << "truncated to " << cut;
    EXPECT_EQ(dst.substr(src.size()), std::string(64, 'g'));
  }
  for (size_t i = 0; i < frame.size(); ++i) {
    std::string bad = frame;
    bad[i] ^= 0x10;
    std::string dst(src.size() + 64, 'g');
    (void)DecodeBlock(bad.data(), bad.size(), 2, &dst[0], src.size());
    EXPECT_EQ(dst.substr(src.size()), std::string(64, 'g')) << "byte " << i;
  }
  std::string dst(src.size(), '\0');
  EXPECT_FALSE(DecodeBlock(frame.data(), frame.size(), 2, &dst[0], src.size() - 2).ok());  // decodes to more
  EXPECT_FALSE(DecodeBlock(frame.data(), src.size() + 1, 2, &dst[0], src.size()).ok());    // larger than decoded
}

}  // namespace
}  // namespace distckpt
