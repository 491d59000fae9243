#include "core/format/checksum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "core/format/xxh3/xxh3.h"

namespace distckpt {
namespace {

// The xorshift test buffer and XXH3-64 (seed 0) values from LLVM's xxhash unit test (computed with the reference
// xxHash), so a wrong hash function or a wrong seed is caught whatever libxxhash does.
std::vector<uint8_t> XorshiftBuffer(size_t size) {
  std::vector<uint8_t> a(size);
  uint64_t x = 1;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    a[i] = static_cast<uint8_t>(x);
  }
  return a;
}

TEST(ChecksumTest, KnownXxh3Values) {
  const std::vector<uint8_t> a = XorshiftBuffer(2243);
  const struct {
    size_t len;
    uint64_t want;
  } kCases[] = {
      {0, 0x2d06800538d394c2},    {1, 0xd0d496e05c553485},    {2, 0x84d625edb7055eac},
      {3, 0x6ea2d59aca5c3778},    {4, 0xbf65290914e80242},    {8, 0xabc1413da6cd0209},
      {9, 0x8bc89400bfed51f6},    {16, 0x7e46916754d7c9b8},   {17, 0xed4be912ba5f836d},
      {128, 0x06a146ee9a2da378},  {129, 0xbc7138129bf065da},  {403, 0xcefeb3ffa532ad8c},
      {512, 0xcdfa6b6268e3650f},  {2048, 0x330ce110cbb79eae}, {2243, 0x0979f786a24edde7},
  };
  for (const auto& c : kCases) EXPECT_EQ(Xxh3(a.data(), c.len), c.want) << "length " << c.len;
  EXPECT_EQ(Xxh3("a", 1), 0xe6c632b61e964e1fu);
  EXPECT_EQ(Xxh3("abc", 3), 0x78af5f94892f3950u);
  EXPECT_EQ(Xxh3(nullptr, 0), 0x2d06800538d394c2u);
}

TEST(ChecksumTest, NumChecksumBlocks) {
  EXPECT_EQ(NumChecksumBlocks(0, 4096), 1u);
  EXPECT_EQ(NumChecksumBlocks(1, 4096), 1u);
  EXPECT_EQ(NumChecksumBlocks(4096, 4096), 1u);
  EXPECT_EQ(NumChecksumBlocks(4097, 4096), 2u);
  EXPECT_EQ(NumChecksumBlocks(8192, 4096), 2u);
  EXPECT_EQ(NumChecksumBlocks(UINT64_MAX, 1ull << 20), (UINT64_MAX >> 20) + 1);  // no overflow in the rounding
  EXPECT_EQ(NumChecksumBlocks(UINT64_MAX, 1ull << 63), 2u);
}

TEST(ChecksumTest, SingleBlockChunkIsThePlainHash) {
  const std::vector<uint8_t> a = XorshiftBuffer(4096);
  std::vector<uint64_t> blocks = {1, 2, 3};
  EXPECT_EQ(ChunkChecksum(a.data(), 4096, 4096, &blocks), Xxh3(a.data(), 4096));
  EXPECT_TRUE(blocks.empty());  // single-block chunks store no block table
  EXPECT_EQ(ChunkChecksum(a.data(), 403, 4096, &blocks), 0xcefeb3ffa532ad8cu);
  EXPECT_EQ(ChunkChecksum(nullptr, 0, 4096, &blocks), 0x2d06800538d394c2u);
  EXPECT_EQ(ChunkChecksum(a.data(), 17, 4096, nullptr), 0xed4be912ba5f836du);
}

TEST(ChecksumTest, MultiBlockChunkCombinesLittleEndianBlockHashes) {
  const std::vector<uint8_t> a = XorshiftBuffer(2243);
  // Block size 512: blocks [0,512) [512,1024) [1024,1536) [1536,2048) [2048,2243).
  std::vector<uint64_t> blocks;
  const uint64_t got = ChunkChecksum(a.data(), a.size(), 512, &blocks);
  ASSERT_EQ(blocks.size(), 5u);
  EXPECT_EQ(blocks[0], 0xcdfa6b6268e3650fu);  // the known value for the first 512 bytes
  for (size_t b = 0; b < 5; ++b) {
    const size_t len = b == 4 ? 2243 - 2048 : 512;
    EXPECT_EQ(blocks[b], Xxh3(a.data() + b * 512, len)) << "block " << b;
  }
  // The rule spelled out: XXH3-64 of the 8-byte little-endian encodings, concatenated.
  std::vector<uint8_t> concat;
  for (uint64_t h : blocks) {
    for (int k = 0; k < 8; ++k) concat.push_back(static_cast<uint8_t>(h >> (8 * k)));
  }
  EXPECT_EQ(got, Xxh3(concat.data(), concat.size()));
  EXPECT_EQ(got, CombineBlockChecksums(Span<const uint64_t>(blocks.data(), blocks.size())));
  EXPECT_NE(got, Xxh3(a.data(), a.size()));

  // A single block combines to itself; blocks hashed separately (in parallel, say) combine to the same value.
  const uint64_t one = 0x1234;
  EXPECT_EQ(CombineBlockChecksums(Span<const uint64_t>(&one, 1)), one);
  std::vector<uint64_t> parallel(5);
  for (size_t b = 0; b < 5; ++b) parallel[4 - b] = Xxh3(a.data() + (4 - b) * 512, b == 0 ? 195 : 512);
  EXPECT_EQ(CombineBlockChecksums(Span<const uint64_t>(parallel.data(), parallel.size())), got);

  // Exactly two full blocks: no empty trailing block.
  ChunkChecksum(a.data(), 1024, 512, &blocks);
  EXPECT_EQ(blocks.size(), 2u);
}

// Every SIMD build this CPU can run gives the scalar build's values, at every length class of XXH3 (0-16, 17-128,
// 129-240 bytes, the long loop with and without a partial stripe and block) and at unaligned starts; the one
// checksum.cc picked gives them too. On x86-64 that is SSE2 and what of AVX2 and AVX-512F the CPU has; on AArch64,
// NEON (also run under qemu-user by tests/packaging/aarch64.sh).
TEST(ChecksumTest, EverySimdBuildAgreesWithTheScalarBuild) {
  const std::vector<uint8_t> a = XorshiftBuffer((1 << 20) + 4096);
  const std::vector<internal_xxh3::Xxh3Variant> variants = internal_xxh3::Xxh3Variants();
  ASSERT_STREQ(variants.back().name, "scalar");
#if defined(__x86_64__) || defined(__aarch64__)
  ASSERT_GE(variants.size(), 2u) << "the architecture's baseline SIMD build is missing";
#endif
  for (size_t len : {0, 1, 3, 4, 8, 9, 16, 17, 100, 128, 129, 200, 240, 241, 255, 256, 1023, 1024, 1025, 4096, 65537,
                     1 << 20}) {
    for (size_t start : {0, 1, 7, 64}) {
      const uint64_t want = distckpt_xxh3_scalar(a.data() + start, len);
      EXPECT_EQ(Xxh3(a.data() + start, len), want) << "len " << len << " start " << start;
      uint64_t want128[2];
      distckpt_xxh3_128_scalar(a.data() + start, len, want128);
      const ChunkHash got128 = Xxh3_128(a.data() + start, len);
      EXPECT_TRUE(got128.lo == want128[0] && got128.hi == want128[1]) << "XXH3-128 len " << len << " start " << start;
      for (const internal_xxh3::Xxh3Variant& v : variants) {
        EXPECT_EQ(v.fn(a.data() + start, len), want) << v.name << " len " << len << " start " << start;
        uint64_t h[2];
        v.fn128(a.data() + start, len, h);
        EXPECT_TRUE(h[0] == want128[0] && h[1] == want128[1]) << v.name << " XXH3-128 len " << len;
      }
    }
  }
  std::string names;
  for (const internal_xxh3::Xxh3Variant& v : variants) names += std::string(names.empty() ? "" : ", ") + v.name;
  std::cout << "XXH3 builds checked: " << names << " (hashing with " << variants.front().name << ")\n";
}

// XXH3-128 is xxHash's own (the published value for no input), and a chunk hash combines its blocks' hashes the way
// FORMAT.md "Chunk hashes" says: the block's hash for one block, XXH3-128 of the concatenated block hashes otherwise.
TEST(ChecksumTest, ChunkHashIsXxh3_128OfItsBlocks) {
  const ChunkHash empty = Xxh3_128(nullptr, 0);
  EXPECT_EQ(empty.lo, 0x6001C324468D497Full);
  EXPECT_EQ(empty.hi, 0x99AA06D3014798D8ull);
  const std::vector<uint8_t> a = XorshiftBuffer(10000);
  EXPECT_EQ(ChunkStrongHash(a.data(), 4096, 4096), Xxh3_128(a.data(), 4096));
  const ChunkHash blocks[3] = {Xxh3_128(a.data(), 4096), Xxh3_128(a.data() + 4096, 4096),
                               Xxh3_128(a.data() + 8192, 10000 - 8192)};
  std::string concat(reinterpret_cast<const char*>(blocks), sizeof blocks);
  EXPECT_EQ(ChunkStrongHash(a.data(), 10000, 4096), Xxh3_128(concat.data(), concat.size()));
  EXPECT_EQ(CombineBlockHashes(Span<const ChunkHash>(blocks, 3)), Xxh3_128(concat.data(), concat.size()));
  std::vector<uint8_t> b = a;
  b[9999] ^= 1;
  EXPECT_NE(ChunkStrongHash(b.data(), 10000, 4096), ChunkStrongHash(a.data(), 10000, 4096));
}

}  // namespace
}  // namespace distckpt
