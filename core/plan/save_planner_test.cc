#include "core/plan/save_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/format/checksum.h"
#include "core/format/metadata.h"
#include "core/plan/test_shardings.h"

namespace distckpt {
namespace {

using namespace testing_shardings;  // NOLINT

Box B(std::vector<uint64_t> off, std::vector<uint64_t> len) { return Box::Make(off, len).value(); }
Box Whole(std::vector<uint64_t> shape) { return Box::Whole(shape).value(); }

LocalTensorDecl T(std::string name, DType dtype, std::vector<uint64_t> shape, std::vector<Box> boxes) {
  return LocalTensorDecl{std::move(name), dtype, std::move(shape), std::move(boxes)};
}

std::vector<LocalPlan> Ranks(uint32_t n) {
  std::vector<LocalPlan> plans(n);
  for (uint32_t r = 0; r < n; ++r) plans[r].rank = r;
  return plans;
}

Box ChunkBox(const EntryRecord& e, size_t k) {
  Box b;
  b.ndim = static_cast<uint32_t>(e.shape.size());
  for (uint32_t d = 0; d < b.ndim; ++d) {
    b.offset[d] = e.chunk_offsets[k * b.ndim + d];
    b.length[d] = e.chunk_lengths[k * b.ndim + d];
  }
  return b;
}

std::vector<uint64_t> Loads(const GlobalPlan& plan) {
  std::vector<uint64_t> load(plan.per_rank.size(), 0);
  for (size_t r = 0; r < plan.per_rank.size(); ++r) {
    for (const WriteTask& t : plan.per_rank[r]) load[r] += t.length;
  }
  return load;
}

// Invariants every plan must satisfy, whatever its input.
void CheckPlanInvariants(const std::vector<LocalPlan>& plans, const GlobalPlan& plan, uint64_t alignment) {
  const MetadataRecord& md = plan.metadata;
  ASSERT_EQ(plan.per_rank.size(), plans.size());
  for (size_t e = 1; e < md.entries.size(); ++e) EXPECT_LT(md.entries[e - 1].name, md.entries[e].name);

  // Every chunk is written by exactly one task, whose writer declared that exact box.
  std::set<std::pair<uint32_t, uint32_t>> seen;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> extents(md.files.size());
  for (uint32_t r = 0; r < plan.per_rank.size(); ++r) {
    uint64_t prev_end = 0;
    for (const WriteTask& t : plan.per_rank[r]) {
      ASSERT_LT(t.entry, md.entries.size());
      const EntryRecord& e = md.entries[t.entry];
      ASSERT_LT(t.chunk, e.chunks.size());
      EXPECT_TRUE(seen.insert({t.entry, t.chunk}).second) << "chunk written twice";
      const ChunkLocation& loc = e.chunks[t.chunk];
      EXPECT_EQ(loc.file, t.file);
      EXPECT_EQ(loc.offset, t.offset);
      EXPECT_EQ(loc.length, t.length);
      EXPECT_EQ(md.files[t.file].name, DataFileName(r));
      EXPECT_EQ(t.offset % alignment, 0u);
      if (t.length > 0) {
        EXPECT_GE(t.offset, prev_end) << "tasks out of offset order or overlapping";
        prev_end = t.offset + t.length;
      }
      EXPECT_LE(t.offset + t.length, md.files[t.file].size);
      if (e.kind == EntryKind::kTensor) {
        // The writer holds this box as local piece t.local (empty tensors: any piece, or none).
        const LocalTensorDecl* decl = nullptr;
        for (const LocalTensorDecl& d : plans[r].tensors) {
          if (d.name == e.name) decl = &d;
        }
        ASSERT_NE(decl, nullptr) << "rank " << r << " writes " << e.name << " without declaring it";
        const Box box = ChunkBox(e, t.chunk);
        if (!box.empty() || box.ndim == 0) {
          ASSERT_LT(t.local, decl->boxes.size());
          EXPECT_EQ(decl->boxes[t.local], box);
        }
        EXPECT_EQ(t.length, box.volume() * DTypeSize(e.dtype));
      }
    }
    if (!plan.per_rank[r].empty()) {
      EXPECT_EQ(md.files[plan.per_rank[r][0].file].size, prev_end);
    }
  }
  size_t total = 0;
  for (const EntryRecord& e : md.entries) {
    total += e.chunks.size();
    for (const ChunkLocation& loc : e.chunks) {
      EXPECT_EQ(loc.checksum, 0u);
      EXPECT_EQ(loc.first_block, kNoBlockTable);
    }
    if (e.kind == EntryKind::kTensor) {
      std::vector<Box> boxes;
      for (size_t k = 0; k < e.chunks.size(); ++k) boxes.push_back(ChunkBox(e, k));
      EXPECT_TRUE(CheckExactTiling(e.shape, boxes).ok()) << e.name;
    }
  }
  EXPECT_EQ(seen.size(), total);
  // Files: one per writing rank, in rank order.
  for (size_t f = 1; f < md.files.size(); ++f) EXPECT_LT(md.files[f - 1].name, md.files[f].name);

  // Declarations map to entries of the same name.
  for (uint32_t r = 0; r < plans.size(); ++r) {
    ASSERT_EQ(plan.tensor_entry[r].size(), plans[r].tensors.size());
    for (size_t j = 0; j < plans[r].tensors.size(); ++j) {
      EXPECT_EQ(md.entries[plan.tensor_entry[r][j]].name, plans[r].tensors[j].name);
    }
    ASSERT_EQ(plan.bytes_entry[r].size(), plans[r].bytes.size());
    for (size_t j = 0; j < plans[r].bytes.size(); ++j) {
      EXPECT_EQ(md.entries[plan.bytes_entry[r][j]].name, plans[r].bytes[j].name);
    }
  }
}

std::string ErrorOf(const std::vector<LocalPlan>& plans, SavePlanOptions options = {}) {
  auto plan = MakeGlobalPlan(plans, options);
  EXPECT_FALSE(plan.ok());
  if (plan.ok()) return "";
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument) << plan.status().ToString();
  return plan.status().message();
}

TEST(SavePlannerTest, DataParallelWritesEachTensorOnceAndBalances) {
  // Every rank holds everything (DDP): one chunk per entry, bytes spread within one largest chunk.
  const uint32_t kRanks = 8;
  std::vector<LocalPlan> plans = Ranks(kRanks);
  uint64_t largest = 0;
  for (LocalPlan& p : plans) {
    for (int i = 0; i < 20; ++i) {
      std::vector<uint64_t> shape{static_cast<uint64_t>(1000 + 97 * i), 16};
      p.tensors.push_back(T("layer" + std::to_string(i), DType::kF32, shape, {Whole(shape)}));
      largest = std::max(largest, shape[0] * shape[1] * 4);
    }
    p.bytes.push_back(LocalBytesDecl{"optimizer_state", 123456});
  }
  auto plan = MakeGlobalPlan(plans, {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  CheckPlanInvariants(plans, *plan, kChunkAlignment);
  ASSERT_EQ(plan->metadata.entries.size(), 21u);
  for (const EntryRecord& e : plan->metadata.entries) EXPECT_EQ(e.chunks.size(), 1u);
  const std::vector<uint64_t> load = Loads(*plan);
  const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
  EXPECT_LE(*hi - *lo, largest);
  EXPECT_GT(*lo, 0u);
  EXPECT_EQ(plan->metadata.files.size(), kRanks);

  const EntryRecord& blob = plan->metadata.entries[plan->bytes_entry[3][0]];
  EXPECT_EQ(blob.name, "optimizer_state");
  EXPECT_EQ(blob.kind, EntryKind::kBytes);
  EXPECT_EQ(blob.dtype, DType::kU8);
  EXPECT_EQ(blob.shape, std::vector<uint64_t>{123456});
  EXPECT_EQ(blob.chunk_offsets, std::vector<uint64_t>{0});
  EXPECT_EQ(blob.chunk_lengths, std::vector<uint64_t>{123456});
  EXPECT_EQ(blob.chunks[0].length, 123456u);
}

TEST(SavePlannerTest, RowShardsAreWrittenByTheirOwners) {
  // FSDP-like: 4 ranks own uneven row shards of a [10, 3] bf16 tensor; rank 2 has two pieces.
  std::vector<LocalPlan> plans = Ranks(4);
  const std::vector<uint64_t> shape{10, 3};
  plans[0].tensors.push_back(T("w", DType::kBF16, shape, {B({0, 0}, {3, 3})}));
  plans[1].tensors.push_back(T("w", DType::kBF16, shape, {B({3, 0}, {3, 3})}));
  plans[2].tensors.push_back(T("w", DType::kBF16, shape, {B({8, 0}, {2, 3}), B({6, 0}, {1, 3})}));
  plans[3].tensors.push_back(T("w", DType::kBF16, shape, {B({7, 0}, {1, 3}), B({0, 0}, {0, 3})}));
  auto plan = MakeGlobalPlan(plans, {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  CheckPlanInvariants(plans, *plan, kChunkAlignment);
  const EntryRecord& w = plan->metadata.entries[0];
  ASSERT_EQ(w.chunks.size(), 5u);  // the empty piece produces no chunk
  // Chunks come out sorted by box.
  EXPECT_EQ(w.chunk_offsets, (std::vector<uint64_t>{0, 0, 3, 0, 6, 0, 7, 0, 8, 0}));
  ASSERT_EQ(plan->per_rank[2].size(), 2u);
  EXPECT_EQ(plan->per_rank[2][0].local, 1u);  // [6:7] comes first in the file
  EXPECT_EQ(plan->per_rank[2][1].local, 0u);
  EXPECT_EQ(plan->per_rank[2][1].offset, kChunkAlignment);
  EXPECT_EQ(plan->metadata.files[2].size, kChunkAlignment + 2 * 3 * 2);
}

TEST(SavePlannerTest, HybridShardingDedupsReplicaGroups) {
  // HSDP: ranks {0..3} and {4..7} each shard a tensor 4 ways; rank r and r+4 are replicas of one shard.
  std::vector<LocalPlan> plans = Ranks(8);
  const std::vector<uint64_t> shape{16, 8};
  for (uint32_t r = 0; r < 8; ++r) {
    plans[r].tensors.push_back(T("emb", DType::kF16, shape, {B({(r % 4) * 4, 0}, {4, 8})}));
    plans[r].tensors.push_back(T("step", DType::kI64, {}, {Box()}));
  }
  auto plan = MakeGlobalPlan(plans, {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  CheckPlanInvariants(plans, *plan, kChunkAlignment);
  EXPECT_EQ(plan->metadata.entries[0].chunks.size(), 4u);
  EXPECT_EQ(plan->metadata.entries[1].chunks.size(), 1u);  // the scalar: one chunk, empty box
  EXPECT_TRUE(plan->metadata.entries[1].chunk_offsets.empty());
  // Equal shards: each replica pair splits its work, so 4 ranks write one shard each and one writes the scalar.
  const std::vector<uint64_t> load = Loads(*plan);
  EXPECT_EQ(std::count(load.begin(), load.end(), 4 * 8 * 2u) + std::count(load.begin(), load.end(), 4 * 8 * 2u + 8), 4);
}

TEST(SavePlannerTest, EmptyTensorGetsOneEmptyChunkFromTheLowestRank) {
  std::vector<LocalPlan> plans = Ranks(3);
  const std::vector<uint64_t> shape{0, 5};
  plans[1].tensors.push_back(T("empty", DType::kF32, shape, {B({0, 0}, {0, 5})}));
  plans[2].tensors.push_back(T("empty", DType::kF32, shape, {}));
  auto plan = MakeGlobalPlan(plans, {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  CheckPlanInvariants(plans, *plan, kChunkAlignment);
  const EntryRecord& e = plan->metadata.entries[0];
  ASSERT_EQ(e.chunks.size(), 1u);
  EXPECT_EQ(e.chunk_offsets, (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(e.chunk_lengths, (std::vector<uint64_t>{0, 5}));
  EXPECT_EQ(e.chunks[0].length, 0u);
  EXPECT_TRUE(plan->per_rank[0].empty());
  ASSERT_EQ(plan->per_rank[1].size(), 1u);
  ASSERT_EQ(plan->metadata.files.size(), 1u);
  EXPECT_EQ(plan->metadata.files[0].name, "data-00001.bin");
  EXPECT_EQ(plan->metadata.files[0].size, 0u);

  // Rank 0 declares it without a piece: the lowest rank holding one writes it, so `local` names a real piece.
  plans[0].tensors.push_back(T("empty", DType::kF32, shape, {}));
  plan = MakeGlobalPlan(plans, {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_TRUE(plan->per_rank[0].empty());
  ASSERT_EQ(plan->per_rank[1].size(), 1u);
  EXPECT_EQ(plan->per_rank[1][0].local, 0u);
}

TEST(SavePlannerTest, ZeroLengthChunksStayInsideTheFile) {
  // A zero-byte blob after a 10-byte one: its aligned offset must not point past the end of the file.
  std::vector<LocalPlan> plans = Ranks(1);
  plans[0].bytes = {LocalBytesDecl{"a", 10}, LocalBytesDecl{"b", 0}};
  auto plan = MakeGlobalPlan(plans, {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  CheckPlanInvariants(plans, *plan, kChunkAlignment);
  EXPECT_EQ(plan->metadata.files[0].size, 10u);
  EXPECT_EQ(plan->metadata.entries[1].chunks[0].offset, 0u);
}

TEST(SavePlannerTest, HonoursLargerAlignmentAndBlockSize) {
  std::vector<LocalPlan> plans = Ranks(1);
  plans[0].bytes = {LocalBytesDecl{"a", 10}, LocalBytesDecl{"b", 10}};
  SavePlanOptions options;
  options.alignment = 1 << 16;
  options.checksum_block_size = 4096;
  auto plan = MakeGlobalPlan(plans, options);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->metadata.entries[1].chunks[0].offset, 1u << 16);
  EXPECT_EQ(plan->metadata.checksum_block_size, 4096u);
  EXPECT_EQ(plan->metadata.alignment, 1u << 16);

  options.alignment = 4096 + 512;
  EXPECT_NE(ErrorOf(plans, options).find("power of two"), std::string::npos);
  options.alignment = 512;
  EXPECT_NE(ErrorOf(plans, options).find("power of two"), std::string::npos);
}

TEST(SavePlannerTest, DisagreementsNameTheTensorAndBothRanks) {
  std::vector<LocalPlan> plans = Ranks(3);
  plans[0].tensors.push_back(T("h.0.attn", DType::kF32, {4, 4}, {Whole({4, 4})}));
  plans[1].tensors.push_back(T("h.0.attn", DType::kF32, {4, 4}, {Whole({4, 4})}));
  plans[2].tensors.push_back(T("h.0.attn", DType::kBF16, {4, 4}, {Whole({4, 4})}));
  std::string msg = ErrorOf(plans);
  EXPECT_NE(msg.find("'h.0.attn'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("BF16"), std::string::npos) << msg;

  plans[2].tensors[0] = T("h.0.attn", DType::kF32, {4, 5}, {Whole({4, 5})});
  msg = ErrorOf(plans);
  EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 2"), std::string::npos) << msg;
}

TEST(SavePlannerTest, OverlapsNameTheRanks) {
  std::vector<LocalPlan> plans = Ranks(3);
  const std::vector<uint64_t> shape{8, 8};
  plans[0].tensors.push_back(T("w", DType::kF32, shape, {B({0, 0}, {4, 8})}));
  plans[1].tensors.push_back(T("w", DType::kF32, shape, {B({4, 0}, {4, 8})}));
  plans[2].tensors.push_back(T("w", DType::kF32, shape, {B({2, 0}, {4, 8})}));
  const std::string msg = ErrorOf(plans);
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 2"), std::string::npos) << msg;
  EXPECT_TRUE(msg.find("rank 0") != std::string::npos || msg.find("rank 1") != std::string::npos) << msg;
}

TEST(SavePlannerTest, HolesNameTheRegion) {
  std::vector<LocalPlan> plans = Ranks(2);
  const std::vector<uint64_t> shape{8, 8};
  plans[0].tensors.push_back(T("w", DType::kF32, shape, {B({0, 0}, {4, 8})}));
  plans[1].tensors.push_back(T("w", DType::kF32, shape, {B({6, 0}, {2, 8})}));
  const std::string msg = ErrorOf(plans);
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hole"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4:6, 0:8]"), std::string::npos) << msg;

  // A scalar nobody holds a piece of is a hole too.
  plans = Ranks(1);
  plans[0].tensors.push_back(T("s", DType::kF32, {}, {}));
  EXPECT_NE(ErrorOf(plans).find("'s'"), std::string::npos);
}

TEST(SavePlannerTest, RejectsBadDeclarations) {
  std::vector<LocalPlan> plans = Ranks(2);
  plans[0].bytes.push_back(LocalBytesDecl{"rng", 16});
  plans[1].bytes.push_back(LocalBytesDecl{"rng", 24});
  std::string msg = ErrorOf(plans);
  EXPECT_NE(msg.find("'rng'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;

  plans = Ranks(2);
  plans[0].tensors.push_back(T("x", DType::kU8, {1}, {Whole({1})}));
  plans[1].bytes.push_back(LocalBytesDecl{"x", 1});
  msg = ErrorOf(plans);
  EXPECT_NE(msg.find("'x'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;

  plans = Ranks(1);
  plans[0].tensors.push_back(T("x", DType::kU8, {4}, {B({2}, {3})}));
  msg = ErrorOf(plans);
  EXPECT_NE(msg.find("outside"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2:5]"), std::string::npos) << msg;

  plans = Ranks(1);
  plans[0].tensors.push_back(T("x", DType::kU8, {4}, {B({0}, {2})}));
  plans[0].tensors.push_back(T("x", DType::kU8, {4}, {B({2}, {2})}));
  EXPECT_NE(ErrorOf(plans).find("more than once"), std::string::npos);

  plans = Ranks(1);
  plans[0].tensors.push_back(T("x", DType::kInvalid, {4}, {B({0}, {4})}));
  EXPECT_NE(ErrorOf(plans).find("dtype"), std::string::npos);

  plans = Ranks(1);
  plans[0].tensors.push_back(T("x", DType::kU8, {4}, {B({0, 0}, {4, 1})}));  // box rank differs from shape
  EXPECT_NE(ErrorOf(plans).find("'x'"), std::string::npos);

  for (const std::string& bad :
       {std::string(), std::string("a\0b", 3), std::string("caf\xc3"), std::string("\xc0\xaf")}) {
    plans = Ranks(2);
    plans[1].tensors.push_back(T(bad, DType::kU8, {4}, {B({0}, {4})}));
    msg = ErrorOf(plans);
    EXPECT_NE(msg.find("rank 1 declares an entry name"), std::string::npos) << msg;
  }
  plans = Ranks(1);
  plans[0].tensors.push_back(T("caf\xc3\xa9", DType::kU8, {4}, {B({0}, {4})}));
  EXPECT_TRUE(MakeGlobalPlan(plans, {}).ok());
  SavePlanOptions odd_blocks;
  odd_blocks.checksum_block_size = 1000;
  EXPECT_NE(ErrorOf(plans, odd_blocks).find("checksum block size"), std::string::npos);

  plans = Ranks(2);
  plans[1].rank = 5;
  EXPECT_NE(ErrorOf(plans).find("rank 5"), std::string::npos);
}

TEST(SavePlannerTest, RankAssignmentIsTheRanksSlice) {
  std::vector<LocalPlan> plans = Ranks(2);
  plans[0].tensors.push_back(T("w", DType::kF32, {4}, {B({0}, {2})}));
  plans[1].tensors.push_back(T("w", DType::kF32, {4}, {B({2}, {2})}));
  auto plan = MakeGlobalPlan(plans, {});
  ASSERT_TRUE(plan.ok());
  auto a = GetRankAssignment(*plan, 1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->rank, 1u);
  ASSERT_EQ(a->tasks.size(), 1u);
  EXPECT_EQ(a->tasks[0].chunk, 1u);
  EXPECT_EQ(a->tensor_entry, std::vector<uint32_t>{0});
  EXPECT_FALSE(GetRankAssignment(*plan, 2).ok());
}

// Random tensors, random tilings, each tile held by a random set of ranks (plus decoy empty pieces and ranks that
// declare a tensor without holding any of it).
TEST(SavePlannerPropertyTest, RandomReplicatedPlans) {
  for (uint64_t seed = 1; seed <= 2000; ++seed) {
    Rng rng(seed);
    SCOPED_TRACE("seed " + std::to_string(seed));
    const uint32_t nranks = static_cast<uint32_t>(Uniform(rng, 1, 12));
    std::vector<LocalPlan> plans = Ranks(nranks);
    const int ntensors = static_cast<int>(Uniform(rng, 1, 10));
    for (int t = 0; t < ntensors; ++t) {
      const std::vector<uint64_t> shape = RandomShape(rng, 4, 2048);
      const DType dtype = static_cast<DType>(Uniform(rng, 1, kNumDTypes - 1));
      const std::string name = "t" + std::to_string(Uniform(rng, 0, 1u << 20)) + "_" + std::to_string(t);
      std::vector<std::vector<Box>> held(nranks);
      std::vector<bool> declares(nranks, false);
      for (const Box& tile : RandomTiling(rng, shape, RandomFamily(rng))) {
        for (uint64_t k = Uniform(rng, 1, std::min<uint32_t>(nranks, 3)); k > 0; --k) {
          const uint32_t r = static_cast<uint32_t>(Uniform(rng, 0, nranks - 1));
          held[r].push_back(tile);
          declares[r] = true;
        }
      }
      for (uint32_t r = 0; r < nranks; ++r) {
        if (Chance(rng, 0.2)) declares[r] = true;
        if (!shape.empty() && Chance(rng, 0.1)) {
          Box empty = RandomSubBox(rng, shape);
          empty.length[0] = 0;
          held[r].push_back(empty);
          declares[r] = true;
        }
        std::shuffle(held[r].begin(), held[r].end(), rng);
        if (declares[r]) plans[r].tensors.push_back(T(name, dtype, shape, held[r]));
      }
    }
    for (uint32_t r = 0; r < nranks; ++r) {
      if (Chance(rng, 0.5)) plans[r].bytes.push_back(LocalBytesDecl{"extra_state", 77});
      if (Chance(rng, 0.3)) plans[r].bytes.push_back(LocalBytesDecl{"rank" + std::to_string(r), r * 1000u});
      std::shuffle(plans[r].tensors.begin(), plans[r].tensors.end(), rng);
    }
    auto plan = MakeGlobalPlan(plans, {});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    CheckPlanInvariants(plans, *plan, kChunkAlignment);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Checksum reports for every chunk of `plan`, with `block_size`-sized blocks.
std::vector<ChunkChecksums> ReportsFor(const GlobalPlan& plan) {
  std::vector<ChunkChecksums> reports;
  for (uint32_t e = 0; e < plan.metadata.entries.size(); ++e) {
    for (uint32_t k = 0; k < plan.metadata.entries[e].chunks.size(); ++k) {
      ChunkChecksums c;
      c.entry = e;
      c.chunk = k;
      const uint64_t n =
          NumChecksumBlocks(plan.metadata.entries[e].chunks[k].length, plan.metadata.checksum_block_size);
      for (uint64_t b = 0; n > 1 && b < n; ++b) c.blocks.push_back(1000 * e + 10 * k + b);
      c.checksum = n > 1 ? CombineBlockChecksums(c.blocks) : 7 + e;
      reports.push_back(c);
    }
  }
  return reports;
}

class FinalizeChecksumsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<LocalPlan> plans = Ranks(2);
    // [0:3] is 3*4096*4 bytes: 3 blocks of 16 KiB; [3:4] is one block.
    plans[0].tensors.push_back(T("w", DType::kF32, {4, 4096}, {B({0, 0}, {3, 4096})}));
    plans[1].tensors.push_back(T("w", DType::kF32, {4, 4096}, {B({3, 0}, {1, 4096})}));
    plans[1].bytes.push_back(LocalBytesDecl{"blob", 40000});  // 3 blocks
    SavePlanOptions options;
    options.checksum_block_size = 16384;
    auto p = MakeGlobalPlan(plans, options);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    plan_ = std::move(p).value();
    reports_ = ReportsFor(plan_);
  }
  GlobalPlan plan_;
  std::vector<ChunkChecksums> reports_;
};

TEST_F(FinalizeChecksumsTest, InstallsChecksumsAndBlockTablesInChunkOrder) {
  std::reverse(reports_.begin(), reports_.end());
  ASSERT_TRUE(FinalizeChecksums(reports_, &plan_).ok());
  const EntryRecord& blob = plan_.metadata.entries[0];
  const EntryRecord& w = plan_.metadata.entries[1];
  ASSERT_EQ(w.name, "w");
  EXPECT_EQ(w.chunks[0].first_block, 0u);
  EXPECT_EQ(w.chunks[1].first_block, kNoBlockTable);
  EXPECT_EQ(w.chunks[1].checksum, 8u);
  EXPECT_EQ(w.block_checksums, (std::vector<uint64_t>{1000, 1001, 1002}));
  EXPECT_EQ(w.chunks[0].checksum, CombineBlockChecksums(w.block_checksums));
  EXPECT_EQ(blob.block_checksums.size(), 3u);
  EXPECT_EQ(blob.chunks[0].first_block, 0u);

  // Running it again replaces, rather than appends to, the tables.
  ASSERT_TRUE(FinalizeChecksums(reports_, &plan_).ok());
  EXPECT_EQ(plan_.metadata.entries[1].block_checksums.size(), 3u);
}

TEST_F(FinalizeChecksumsTest, RejectsMissingDuplicateAndMalformedReports) {
  const GlobalPlan before = plan_;
  auto fails = [&](std::vector<ChunkChecksums> reports, const std::string& needle) {
    const Status s = FinalizeChecksums(reports, &plan_);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    // A failed call leaves the plan as it was.
    EXPECT_EQ(plan_.metadata.entries[1].block_checksums, before.metadata.entries[1].block_checksums);
    EXPECT_EQ(plan_.metadata.entries[1].chunks[0].checksum, 0u);
  };
  std::vector<ChunkChecksums> r = reports_;
  r.pop_back();
  fails(r, "no checksum report");
  r = reports_;
  r.push_back(reports_[1]);
  fails(r, "twice");
  r = reports_;
  r[1].blocks.pop_back();
  fails(r, "block checksums were reported");
  r = reports_;
  r[2].blocks.push_back(5);  // a single-block chunk reports none
  fails(r, "block checksums were reported");
  r = reports_;
  r[1].checksum ^= 1;
  fails(r, "does not match");
  r = reports_;
  r[0].chunk = 9;
  fails(r, "does not have");
}

// The plan, once checksums are in, must be metadata the format layer accepts.
TEST_F(FinalizeChecksumsTest, FinalizedPlanIsValidMetadata) {
  ASSERT_TRUE(FinalizeChecksums(reports_, &plan_).ok());
  plan_.metadata.writer = "distckpt test";
  auto encoded = EncodeMetadata(plan_.metadata);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  auto view = MetadataView::Parse(std::make_shared<const std::string>(std::move(encoded).value()), "test");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->num_entries(), 2u);
  EXPECT_EQ(view->num_files(), 2u);
}

}  // namespace
}  // namespace distckpt
