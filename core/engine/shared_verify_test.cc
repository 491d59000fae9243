// The split of checksum verification between ranks that read the same files through one page cache.
#include "core/engine/shared_verify.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace distckpt {
namespace {

constexpr uint64_t kBlock = 1 << 20;

// Every block of `ranges`, as (file, offset) pairs.
std::vector<std::pair<uint32_t, uint64_t>> Blocks(const std::vector<FileRange>& ranges) {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (const FileRange& r : ranges) {
    for (uint64_t off = r.lo; off < r.hi; off += kBlock) out.emplace_back(r.file, off);
  }
  return out;
}

bool Needs(const VerifyClaim& c, uint32_t file, uint64_t off) {
  for (const FileRange& r : c.ranges) {
    if (r.file == file && r.lo <= off && off < r.hi) return true;
  }
  return false;
}

TEST(SharedVerifyTest, EveryNeededBlockIsVerifiedByExactlyOneRankThatNeedsIt) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 200; ++round) {
    const int world = 1 + static_cast<int>(rng() % 6);
    const uint32_t files = 1 + static_cast<uint32_t>(rng() % 3);
    std::vector<VerifyClaim> claims(world);
    for (int r = 0; r < world; ++r) {
      for (uint32_t f = 0; f < files; ++f) {
        claims[r].identities.emplace_back(f, IdentityDigest("boot:dev:ino" + std::to_string(f)));
        // A few block-aligned ranges out of 32 blocks, sorted and disjoint.
        uint64_t at = 0;
        while (at < 32) {
          at += rng() % 6;
          const uint64_t len = 1 + rng() % 8;
          if (at >= 32) break;
          claims[r].ranges.push_back(FileRange{f, at * kBlock, std::min<uint64_t>(32, at + len) * kBlock});
          at += len + 1;
        }
      }
    }
    std::vector<VerifyFilter> filters;
    for (int r = 0; r < world; ++r) filters.push_back(MakeVerifyFilter(claims, r));
    for (int r = 0; r < world; ++r) {
      for (const auto& [file, off] : Blocks(claims[r].ranges)) {
        int verifiers = 0;
        for (int q = 0; q < world; ++q) {
          if (!Needs(claims[q], file, off)) continue;
          if (!filters[q] || filters[q](file, off)) ++verifiers;
        }
        ASSERT_EQ(verifiers, 1) << "round " << round << " file " << file << " block at " << off;
      }
    }
  }
}

TEST(SharedVerifyTest, SharingIsBalanced) {
  // Three ranks that all need the same 3,000 blocks (a tensor saved by rows, loaded by columns).
  std::vector<VerifyClaim> claims(3);
  for (VerifyClaim& c : claims) {
    c.identities = {{0, IdentityDigest("same-inode")}};
    c.ranges = {FileRange{0, 0, 3000 * kBlock}};
  }
  for (int r = 0; r < 3; ++r) {
    VerifyFilter f = MakeVerifyFilter(claims, r);
    ASSERT_TRUE(f);
    int mine = 0;
    for (uint64_t b = 0; b < 3000; ++b) mine += f(0, b * kBlock) ? 1 : 0;
    EXPECT_GT(mine, 850) << "rank " << r;
    EXPECT_LT(mine, 1150) << "rank " << r;
  }
}

TEST(SharedVerifyTest, OnlyRanksReadingTheSameInodeShare) {
  std::vector<VerifyClaim> claims(3);
  for (VerifyClaim& c : claims) c.ranges = {FileRange{0, 0, 64 * kBlock}};
  claims[0].identities = {{0, IdentityDigest("host-a:inode")}};
  claims[1].identities = {{0, IdentityDigest("host-b:inode")}};  // another host: its own page cache
  claims[2].identities = {{0, IdentityDigest("")}};              // unknown: verifies everything itself
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(MakeVerifyFilter(claims, r)) << "rank " << r;
  // Same identity on ranks 0 and 1: they split; rank 2 (unknown) still verifies all of its blocks.
  claims[1].identities = {{0, IdentityDigest("host-a:inode")}};
  VerifyFilter f0 = MakeVerifyFilter(claims, 0), f1 = MakeVerifyFilter(claims, 1);
  ASSERT_TRUE(f0 && f1);
  EXPECT_FALSE(MakeVerifyFilter(claims, 2));
  for (uint64_t b = 0; b < 64; ++b) EXPECT_NE(f0(0, b * kBlock), f1(0, b * kBlock)) << b;
  // A file only this rank reads is always verified by it.
  EXPECT_TRUE(f0(7, 0));
}

TEST(SharedVerifyTest, ClaimsRoundTripAndMalformedOnesAreRejected) {
  VerifyClaim c;
  c.identities = {{0, IdentityDigest("x")}, {5, IdentityDigest("y")}};
  c.ranges = {FileRange{0, 4096, 8192}, FileRange{5, 0, 1ull << 40}};
  const std::string msg = EncodeVerifyClaim(Corrupt("bad block"), c);
  Status st;
  VerifyClaim back;
  ASSERT_TRUE(DecodeVerifyClaim(msg, &st, &back));
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_EQ(st.message(), "bad block");
  ASSERT_EQ(back.ranges.size(), 2u);
  EXPECT_EQ(back.ranges[1].file, 5u);
  EXPECT_EQ(back.ranges[1].hi, 1ull << 40);
  EXPECT_EQ(back.identities[1].second, IdentityDigest("y"));
  EXPECT_EQ(IdentityDigest(""), 0u);
  // Every truncation and every single-byte corruption decodes to false or to some claim, never a crash.
  for (size_t n = 0; n < msg.size(); ++n) EXPECT_FALSE(DecodeVerifyClaim(msg.substr(0, n), &st, &back)) << n;
  for (size_t i = 0; i < msg.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = msg;
      bad[i] ^= static_cast<char>(1 << bit);
      VerifyClaim out;
      (void)DecodeVerifyClaim(bad, &st, &out);
    }
  }
  // A claim too large to send goes out empty: that rank then hashes everything it reads itself.
  VerifyClaim big;
  big.identities = {{0, IdentityDigest("x")}};
  for (uint64_t i = 0; i < 10000; ++i) big.ranges.push_back(FileRange{0, i * 2 * kBlock, (i * 2 + 1) * kBlock});
  ASSERT_TRUE(DecodeVerifyClaim(VerifyClaimMessage(OkStatus(), big), &st, &back));
  EXPECT_TRUE(st.ok());
  EXPECT_TRUE(back.ranges.empty() && back.identities.empty());
  ASSERT_TRUE(DecodeVerifyClaim(VerifyClaimMessage(OkStatus(), c), &st, &back));
  EXPECT_EQ(back.ranges.size(), 2u);
  // A count larger than the message can hold is rejected before allocating.
  std::string huge = EncodeVerifyClaim(OkStatus(), VerifyClaim{});
  huge.back() = '\xff';
  huge += std::string(9, '\xff');
  EXPECT_FALSE(DecodeVerifyClaim(huge, &st, &back));
}

}  // namespace
}  // namespace distckpt
