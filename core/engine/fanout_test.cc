// The fan-out assignment (which rank reads which bytes) and its round schedule, against a brute-force oracle.
#include "core/engine/fanout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

namespace distckpt {
namespace {

using Needs = std::vector<std::vector<ChunkRange>>;
using Key = std::pair<uint32_t, uint32_t>;  // (entry, chunk)

// Oracle: for every byte of every chunk, the set of ranks that need it.
std::map<Key, std::map<uint64_t, std::set<int>>> NeedersByByte(const Needs& needs) {
  std::map<Key, std::map<uint64_t, std::set<int>>> out;
  for (size_t r = 0; r < needs.size(); ++r) {
    for (const ChunkRange& c : needs[r]) {
      for (uint64_t b = c.lo; b < c.hi; ++b) out[{c.entry, c.chunk}][b].insert(static_cast<int>(r));
    }
  }
  return out;
}

std::vector<uint64_t> Loads(const std::vector<FanoutPart>& parts, size_t ranks) {
  std::vector<uint64_t> load(ranks, 0);
  for (const FanoutPart& p : parts) load[p.reader] += p.range.hi - p.range.lo;
  return load;
}

// Every property the load relies on, checked byte by byte.
void CheckAssignment(const Needs& needs, uint64_t block, const std::vector<FanoutPart>& parts) {
  auto oracle = NeedersByByte(needs);
  std::set<uint64_t> boundaries_of_needs;  // (a cut may also fall where a rank's range starts or ends)
  std::map<Key, std::set<uint64_t>> range_ends;
  for (const auto& rank : needs) {
    for (const ChunkRange& c : rank) {
      range_ends[{c.entry, c.chunk}].insert(c.lo);
      range_ends[{c.entry, c.chunk}].insert(c.hi);
    }
  }
  std::map<Key, std::map<uint64_t, int>> reader_of_byte;
  for (size_t i = 0; i < parts.size(); ++i) {
    const FanoutPart& p = parts[i];
    const Key key{p.range.entry, p.range.chunk};
    ASSERT_LT(p.range.lo, p.range.hi) << "empty part";
    ASSERT_TRUE(std::is_sorted(p.needers->begin(), p.needers->end()));
    ASSERT_TRUE(std::binary_search(p.needers->begin(), p.needers->end(), p.reader)) << "reader does not need its part";
    if (i > 0) {
      const ChunkRange& q = parts[i - 1].range;
      ASSERT_TRUE(std::tie(q.entry, q.chunk, q.lo) < std::tie(p.range.entry, p.range.chunk, p.range.lo)) << "unsorted";
    }
    // Cuts fall on chunk-relative multiples of the block, or where some rank's range starts or ends.
    for (uint64_t end : {p.range.lo, p.range.hi}) {
      EXPECT_TRUE(end % block == 0 || range_ends[key].count(end)) << "cut at " << end << " not block-aligned";
    }
    for (uint64_t b = p.range.lo; b < p.range.hi; ++b) {
      ASSERT_TRUE(reader_of_byte[key].emplace(b, p.reader).second) << "byte " << b << " assigned twice";
      auto it = oracle[key].find(b);
      ASSERT_NE(it, oracle[key].end()) << "byte " << b << " of chunk " << key.second << " nobody needs";
      EXPECT_EQ(std::vector<int>(it->second.begin(), it->second.end()), *p.needers) << "byte " << b;
    }
  }
  for (const auto& [key, bytes] : oracle) {
    EXPECT_EQ(bytes.size(), reader_of_byte[key].size()) << "part of the union not covered";
    for (const auto& [b, who] : bytes) {
      if (who.size() == 1) {
        EXPECT_EQ(reader_of_byte[key][b], *who.begin()) << "a lone need read by another rank";
      }
    }
  }
}

TEST(AssignFanoutTest, EmptyAndSingleRank) {
  EXPECT_TRUE(AssignFanout({}, 4096).empty());
  Needs one{{ChunkRange{0, 0, 0, 100}, ChunkRange{1, 2, 4096, 9000}}};
  auto parts = AssignFanout(one, 4096);
  ASSERT_EQ(parts.size(), 2u);
  for (const FanoutPart& p : parts) {
    EXPECT_EQ(p.reader, 0);
    EXPECT_EQ(*p.needers, std::vector<int>{0});
  }
}

TEST(AssignFanoutTest, FullyReplicatedSplitsEvenlyOnBlocks) {
  const uint64_t block = 64;  // small, for the byte-by-byte oracle
  Needs needs(4, {ChunkRange{3, 0, 0, 64 * block}});
  auto parts = AssignFanout(needs, block);
  CheckAssignment(needs, block, parts);
  ASSERT_EQ(parts.size(), 4u);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(Loads(parts, 4)[r], 16 * block);
  std::set<int> readers;
  for (const FanoutPart& p : parts) readers.insert(p.reader);
  EXPECT_EQ(readers.size(), 4u);
}

TEST(AssignFanoutTest, SmallWholeChunksGoToTheLeastLoaded) {
  // 40 one-block chunks everyone needs: a whole chunk per part, 10 per rank.
  Needs needs(4);
  for (auto& n : needs) {
    for (uint32_t c = 0; c < 40; ++c) n.push_back(ChunkRange{c, 0, 0, 1000});
  }
  auto parts = AssignFanout(needs, 4096);
  CheckAssignment(needs, 4096, parts);
  EXPECT_EQ(parts.size(), 40u);
  for (uint64_t l : Loads(parts, 4)) EXPECT_EQ(l, 10000u);
}

TEST(AssignFanoutTest, MixedShardedAndReplicated) {
  const uint64_t b = 64;
  // Chunk (0,0) sharded: each rank its own quarter; chunk (1,0) replicated on ranks 0 and 2 only; (2,0) on all.
  Needs needs(4);
  for (int r = 0; r < 4; ++r) needs[r].push_back(ChunkRange{0, 0, r * 8 * b, (r + 1) * 8 * b});
  needs[0].push_back(ChunkRange{1, 0, 0, 10 * b});
  needs[2].push_back(ChunkRange{1, 0, 0, 10 * b});
  for (int r = 0; r < 4; ++r) needs[r].push_back(ChunkRange{2, 0, 0, 40 * b + 17});
  auto parts = AssignFanout(needs, b);
  CheckAssignment(needs, b, parts);
  auto load = Loads(parts, 4);
  const uint64_t total = 32 * b + 10 * b + 40 * b + 17;
  for (uint64_t l : load) EXPECT_LE(l, total / 4 + b + 17) << "unbalanced";
}

TEST(AssignFanoutTest, DeterministicWhateverTheCall) {
  Needs needs(3, {ChunkRange{0, 1, 0, 123456}, ChunkRange{5, 0, 8192, 50000}});
  auto a = AssignFanout(needs, 4096), b = AssignFanout(needs, 4096);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::tie(a[i].range.entry, a[i].range.chunk, a[i].range.lo, a[i].range.hi, a[i].reader, *a[i].needers),
              std::tie(b[i].range.entry, b[i].range.chunk, b[i].range.lo, b[i].range.hi, b[i].reader, *b[i].needers));
  }
}

// Random needs: block-aligned (a verifying load) or not (verification off); checked against the byte oracle, plus
// balance where every rank needs the same bytes.
TEST(AssignFanoutTest, RandomAgainstOracle) {
  std::mt19937_64 rng(12);
  for (int iter = 0; iter < 300; ++iter) {
    const int ranks = 1 + static_cast<int>(rng() % 6);
    const uint64_t block = 1 + rng() % 16;
    const bool aligned = rng() % 2;
    const bool replicated = rng() % 4 == 0;
    Needs needs(ranks);
    for (int r = 0; r < ranks; ++r) {
      if (replicated && r > 0) {
        needs[r] = needs[0];
        continue;
      }
      for (uint32_t chunk = 0; chunk < 3; ++chunk) {
        const uint64_t length = 1 + rng() % 200;
        uint64_t at = 0;
        while (at < length && rng() % 3 != 0) {
          uint64_t lo = at + rng() % 40, hi = lo + 1 + rng() % 60;
          if (aligned) {
            lo = lo / block * block;
            hi = std::min(length, (hi + block - 1) / block * block);
          }
          hi = std::min(hi, length);
          if (lo >= hi || lo < at) break;
          needs[r].push_back(ChunkRange{chunk % 2, chunk, lo, hi});
          at = hi + 1;  // disjoint and not touching, as NeededRanges merges
        }
      }
      std::sort(needs[r].begin(), needs[r].end(), [](const ChunkRange& a, const ChunkRange& b) {
        return std::tie(a.entry, a.chunk, a.lo) < std::tie(b.entry, b.chunk, b.lo);
      });
    }
    auto parts = AssignFanout(needs, block);
    SCOPED_TRACE("iteration " + std::to_string(iter));
    CheckAssignment(needs, block, parts);
    if (replicated && ranks > 1) {
      // Each shared piece is cut into near-equal groups of blocks (largest to the least loaded): the spread is at
      // most a couple of blocks per piece.
      auto load = Loads(parts, ranks);
      uint64_t pieces = needs[0].size();
      auto [lo, hi] = std::minmax_element(load.begin(), load.end());
      EXPECT_LE(*hi - *lo, 2 * block * pieces + 60) << "unbalanced";
    }
    // The schedule carries exactly the shared parts, within the cap.
    const uint64_t cap = 1 + rng() % 100;
    FanoutRounds rounds = ScheduleFanoutRounds(parts, ranks, cap, block);
    std::map<size_t, uint64_t> scheduled;
    for (const auto& round : rounds) {
      ASSERT_EQ(round.size(), static_cast<size_t>(ranks));
      for (int r = 0; r < ranks; ++r) {
        uint64_t bytes = 0;
        for (const FanoutPiece& p : round[r]) {
          EXPECT_EQ(p.reader, r);
          EXPECT_EQ(parts[p.part].reader, r);
          EXPECT_GE(p.range.lo, parts[p.part].range.lo);
          EXPECT_LE(p.range.hi, parts[p.part].range.hi);
          EXPECT_TRUE(p.range.lo == parts[p.part].range.lo || p.range.lo % block == 0);
          scheduled[p.part] += p.range.hi - p.range.lo;
          bytes += p.range.hi - p.range.lo;
        }
        EXPECT_TRUE(bytes <= std::max(cap, block) || round[r].size() == 1) << bytes << " bytes in a round";
      }
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      const uint64_t want = parts[i].needers->size() > 1 ? parts[i].range.hi - parts[i].range.lo : 0;
      EXPECT_EQ(scheduled[i], want) << "part " << i;
    }
  }
}

// A data-parallel group of 1024 ranks, every one loading the same 200 chunks: the assignment stays cheap (the
// needers of a run of bytes are shared by its parts, not copied) and balanced to within a block.
TEST(AssignFanoutTest, ThousandRanksFullyReplicated) {
  const uint64_t block = 1 << 20;
  std::vector<ChunkRange> model;
  for (uint32_t c = 0; c < 200; ++c) model.push_back(ChunkRange{c, 0, 0, (1 + c % 7) * 13 * block + c});
  Needs needs(1024, model);
  auto parts = AssignFanout(needs, block);
  uint64_t total = 0;
  for (const ChunkRange& c : model) total += c.hi - c.lo;
  auto load = Loads(parts, needs.size());
  uint64_t sum = 0;
  for (uint64_t l : load) sum += l;
  EXPECT_EQ(sum, total);
  auto [lo, hi] = std::minmax_element(load.begin(), load.end());
  EXPECT_LE(*hi - *lo, 2 * block) << "unbalanced";
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].range.entry == parts[i - 1].range.entry) EXPECT_EQ(parts[i].needers, parts[i - 1].needers);
  }
}

TEST(DecideFanoutTest, AutoFansOutOnlyAcrossCaches) {
  auto rank = [](bool take_part, bool always, bool verify, uint64_t round,
                 std::vector<std::pair<uint32_t, uint64_t>> ids) {
    FanoutNeeds n;
    n.take_part = take_part;
    n.always = always;
    n.verify = verify;
    n.round_bytes = round;
    n.identities = std::move(ids);
    return n;
  };
  // One host: both ranks read files 0 and 1 through the same cache.
  EXPECT_EQ(
      DecideFanout({rank(true, false, true, 64, {{0, 7}, {1, 8}}), rank(true, false, true, 64, {{0, 7}, {1, 8}})}), 0u);
  // Two hosts: file 0 through two caches. The smallest round wins.
  EXPECT_EQ(DecideFanout({rank(true, false, true, 64, {{0, 7}}), rank(true, false, true, 32, {{0, 9}})}), 32u);
  // An unknown cache (storage plugged in through the C ABI) counts as separate.
  EXPECT_EQ(DecideFanout({rank(true, false, true, 64, {{0, 0}}), rank(true, false, true, 64, {{0, 0}})}), 64u);
  // kAlways on one rank: the group fans out even through one cache.
  EXPECT_EQ(DecideFanout({rank(true, true, true, 64, {{0, 7}}), rank(true, false, true, 64, {{0, 7}})}), 64u);
  // Disagreeing on verification: never.
  EXPECT_EQ(DecideFanout({rank(true, true, true, 64, {{0, 7}}), rank(true, true, false, 64, {{0, 9}})}), 0u);
  // Ranks with the fan-out off do not count (nor their caches).
  EXPECT_EQ(DecideFanout({rank(false, false, false, 64, {{0, 9}}), rank(true, false, true, 64, {{0, 7}}),
                          rank(true, false, true, 64, {{0, 7}})}),
            0u);
  EXPECT_EQ(DecideFanout({rank(false, true, true, 64, {}), rank(false, true, true, 64, {})}), 0u);
}

TEST(FanoutNeedsTest, RoundTripAndMalformed) {
  FanoutNeeds n;
  n.take_part = true;
  n.verify = false;
  n.round_bytes = 1 << 26;
  n.always = true;
  n.identities = {{0, 0}, {3, 0x1234567890abcdefull}};
  n.ranges = {ChunkRange{1, 2, 3, 4}, ChunkRange{7, 0, 0, 1ull << 40}};
  FanoutNeeds back;
  ASSERT_TRUE(DecodeFanoutNeeds(EncodeFanoutNeeds(n), &back));
  EXPECT_TRUE(back.take_part);
  EXPECT_TRUE(back.always);
  ASSERT_EQ(back.identities.size(), 2u);
  EXPECT_EQ(back.identities[1], n.identities[1]);
  EXPECT_FALSE(back.verify);
  EXPECT_EQ(back.round_bytes, n.round_bytes);
  ASSERT_EQ(back.ranges.size(), 2u);
  EXPECT_EQ(back.ranges[1].hi, 1ull << 40);
  const std::string msg = EncodeFanoutNeeds(n);
  for (size_t cut = 0; cut < msg.size(); ++cut) EXPECT_FALSE(DecodeFanoutNeeds(msg.substr(0, cut), &back));
  EXPECT_FALSE(DecodeFanoutNeeds(msg + "x", &back));
}

}  // namespace
}  // namespace distckpt
