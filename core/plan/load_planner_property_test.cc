// Property tests for load planning: random tensors saved with one sharding and read back with another. Every plan is
// executed with memcpy and every destination byte is checked against an oracle computed from global coordinates.
//
// Reproduce a failure with DCKPT_PLAN_SEED=<seed printed> (and DCKPT_PLAN_CASES=1); DCKPT_PLAN_CASES raises the count.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/base/dtype.h"
#include "core/plan/load_planner.h"
#include "core/plan/test_shardings.h"

namespace distckpt {
namespace {

using namespace testing_shardings;  // NOLINT

constexpr uint64_t kDefaultSeed = 0x5eed'0001;
constexpr int kDefaultCases = 5000;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}

// Byte k of the element at global linear index g. A mixed hash rather than a short period, so a run copied from the
// wrong place cannot match by accident.
uint8_t Pattern(uint64_t g, uint64_t k) {
  uint64_t x = g * 16 + k + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint8_t>(x ^ (x >> 31));
}

// Calls fn(local_linear, global_linear) for every element of `box` inside a tensor of `shape`, in row-major order.
template <typename Fn>
void ForEachElement(const Box& box, const std::vector<uint64_t>& shape, Fn&& fn) {
  if (box.empty()) return;
  const uint32_t n = box.ndim;
  uint64_t idx[kMaxDims] = {};
  uint64_t local = 0;
  while (true) {
    uint64_t g = 0;
    for (uint32_t d = 0; d < n; ++d) g = g * shape[d] + box.offset[d] + idx[d];
    fn(local++, g);
    int d = static_cast<int>(n) - 1;
    while (d >= 0 && ++idx[d] == box.length[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

DType DTypeOfSize(uint64_t size) {
  switch (size) {
    case 1:
      return DType::kU8;
    case 2:
      return DType::kBF16;
    case 4:
      return DType::kF32;
    case 8:
      return DType::kF64;
    default:
      return DType::kC128;
  }
}

std::string Describe(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// An EntryView over test-owned arrays, as MetadataView would hand one out.
struct FakeEntry {
  std::vector<uint64_t> shape, offsets, lengths;
  EntryView view;

  FakeEntry(const std::vector<uint64_t>& s, const std::vector<Box>& chunks, DType dtype) : shape(s) {
    for (const Box& b : chunks) {
      offsets.insert(offsets.end(), b.offset, b.offset + b.ndim);
      lengths.insert(lengths.end(), b.length, b.length + b.ndim);
    }
    view.name = "t";
    view.dtype = dtype;
    view.shape = Span<const uint64_t>(shape.data(), shape.size());
    view.num_chunks = chunks.size();
    view.chunk_offsets = offsets.data();
    view.chunk_lengths = lengths.data();
  }
};

std::vector<Box> RandomDests(Rng& rng, const std::vector<uint64_t>& shape, std::string* family) {
  const uint64_t pick = Uniform(rng, 0, static_cast<uint64_t>(Family::kNumTiling) + 1);
  if (pick < static_cast<uint64_t>(Family::kNumTiling)) {
    *family = FamilyName(static_cast<Family>(pick));
    return RandomTiling(rng, shape, static_cast<Family>(pick));
  }
  std::vector<Box> dests;
  if (pick == static_cast<uint64_t>(Family::kNumTiling)) {
    *family = "replicated";
    dests.assign(Uniform(rng, 2, 4), Box::Whole(shape).value());
  } else {
    *family = "random-subboxes";
    for (uint64_t i = Uniform(rng, 1, 6); i > 0; --i) dests.push_back(RandomSubBox(rng, shape));
  }
  return dests;
}

// What the random cases covered, printed so a reader can see the generator is not degenerate.
struct Coverage {
  uint64_t cases = 0, scalar = 0, zero_size = 0, sweep_index = 0, ops = 0, bytes = 0;
  uint64_t saved[static_cast<int>(Family::kNumTiling)] = {};
};

// One randomised save/load round trip.
void RunCase(uint64_t seed, Coverage* cov) {
  Rng rng(seed);
  const std::vector<uint64_t> shape = RandomShape(rng, 5, 4096);
  static const uint64_t kSizes[] = {1, 2, 4, 8, 16};
  const uint64_t itemsize = kSizes[Uniform(rng, 0, 4)];
  const Family save_family = RandomFamily(rng);
  const std::vector<Box> chunks = RandomTiling(rng, shape, save_family);
  std::string load_family;
  const std::vector<Box> dests = RandomDests(rng, shape, &load_family);
  SCOPED_TRACE("seed " + std::to_string(seed) + ": shape " + Describe(shape) + " itemsize " + std::to_string(itemsize) +
               ", saved " + FamilyName(save_family) + " (" + std::to_string(chunks.size()) + " chunks), loaded " +
               load_family + " (" + std::to_string(dests.size()) + " dests)");

  // Saved chunk buffers: every element encodes its global index.
  std::vector<std::vector<uint8_t>> chunk_data(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    chunk_data[c].resize(chunks[c].volume() * itemsize);
    ForEachElement(chunks[c], shape, [&](uint64_t local, uint64_t g) {
      for (uint64_t k = 0; k < itemsize; ++k) chunk_data[c][local * itemsize + k] = Pattern(g, k);
    });
  }

  FakeEntry entry(shape, chunks, DTypeOfSize(itemsize));
  // Rotate between the constructors, and force the sweep index on a third of the cases: small tensors nearly always
  // fit the grid.
  const ChunkIndex index = seed % 3 == 0   ? ChunkIndex(entry.view)
                           : seed % 3 == 1 ? ChunkIndex(chunks)
                                           : ChunkIndex::SweepOnlyForTesting(chunks);
  EXPECT_EQ(index.num_chunks(), chunks.size());
  auto ops = PlanTensorRead(entry.view, index, dests);
  EXPECT_TRUE(ops.ok()) << ops.status().ToString();
  if (!ops.ok()) return;
  ++cov->cases;
  ++cov->saved[static_cast<int>(save_family)];
  cov->scalar += shape.empty();
  cov->zero_size += !shape.empty() && Box::Whole(shape).value().empty();
  cov->sweep_index += !index.is_grid();
  cov->ops += ops->size();

  std::vector<std::vector<uint8_t>> dest_data(dests.size());
  std::vector<std::vector<uint8_t>> written(dests.size());
  for (size_t i = 0; i < dests.size(); ++i) {
    dest_data[i].assign(dests[i].volume() * itemsize, 0xCD);
    written[i].assign(dest_data[i].size(), 0);
  }
  const TensorReadOp* prev = nullptr;
  for (const TensorReadOp& op : *ops) {
    EXPECT_LT(op.chunk, chunks.size());
    EXPECT_LT(op.dest, dests.size());
    if (op.chunk >= chunks.size() || op.dest >= dests.size()) return;
    if (prev) {
      EXPECT_TRUE(prev->chunk < op.chunk || (prev->chunk == op.chunk && prev->dest < op.dest));
    }
    prev = &op;
    EXPECT_TRUE(chunks[op.chunk].Contains(op.region) && dests[op.dest].Contains(op.region));
    EXPECT_EQ(op.copy.total_bytes(), op.region.volume() * itemsize);
    EXPECT_LE(op.copy.src_end(), chunk_data[op.chunk].size());

    // Half the cases go through MaterializeRuns + CoalesceRuns, the rest through ForEachRun directly.
    std::vector<ByteRun> runs;
    if (seed & 2) {
      runs = MaterializeRuns(op.copy);
      CoalesceRuns(&runs);
    } else {
      op.copy.ForEachRun([&](const ByteRun& r) { runs.push_back(r); });
    }
    for (const ByteRun& r : runs) {
      const bool in_bounds =
          r.src + r.length <= chunk_data[op.chunk].size() && r.dst + r.length <= dest_data[op.dest].size();
      EXPECT_TRUE(in_bounds) << "run src " << r.src << " dst " << r.dst << " length " << r.length;
      if (!in_bounds) return;
      std::memcpy(dest_data[op.dest].data() + r.dst, chunk_data[op.chunk].data() + r.src, r.length);
      for (uint64_t b = 0; b < r.length; ++b) ++written[op.dest][r.dst + b];
    }
  }

  for (size_t i = 0; i < dests.size(); ++i) {
    for (uint64_t b = 0; b < written[i].size(); ++b) {
      if (written[i][b] != 1) {
        ADD_FAILURE() << "dest #" << i << " " << dests[i].ToString() << " byte " << b << " written "
                      << int(written[i][b]) << " times";
        return;
      }
    }
    bool ok = true;
    ForEachElement(dests[i], shape, [&](uint64_t local, uint64_t g) {
      for (uint64_t k = 0; ok && k < itemsize; ++k) {
        if (dest_data[i][local * itemsize + k] != Pattern(g, k)) {
          ADD_FAILURE() << "dest #" << i << " " << dests[i].ToString() << " element " << local << " (global " << g
                        << ") byte " << k << " is wrong";
          ok = false;
        }
      }
    });
    if (!ok) return;
    cov->bytes += dest_data[i].size();
  }
}

TEST(LoadPlannerPropertyTest, RandomShardingsRoundTripElementByElement) {
  const uint64_t seed = EnvOr("DCKPT_PLAN_SEED", kDefaultSeed);
  const uint64_t cases = EnvOr("DCKPT_PLAN_CASES", kDefaultCases);
  Coverage cov;
  for (uint64_t i = 0; i < cases; ++i) {
    RunCase(seed + i, &cov);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "reproduce with DCKPT_PLAN_SEED=" << seed + i << " DCKPT_PLAN_CASES=1";
      return;
    }
  }
  std::printf(
      "%llu cases (%llu 0-d, %llu zero-size, %llu on the sweep index), %llu ops, %llu destination bytes "
      "checked\nsaved as:",
      static_cast<unsigned long long>(cov.cases), static_cast<unsigned long long>(cov.scalar),
      static_cast<unsigned long long>(cov.zero_size), static_cast<unsigned long long>(cov.sweep_index),
      static_cast<unsigned long long>(cov.ops), static_cast<unsigned long long>(cov.bytes));
  for (int f = 0; f < static_cast<int>(Family::kNumTiling); ++f) {
    std::printf(" %s=%llu", FamilyName(static_cast<Family>(f)), static_cast<unsigned long long>(cov.saved[f]));
  }
  std::printf("\n");
  EXPECT_EQ(cov.cases, cases);
}

// ChunkIndex against a brute-force scan, on layouts large enough to exercise both the grid and the sweep.
void CheckIndexAgainstScan(Rng& rng, const std::vector<uint64_t>& shape, const std::vector<Box>& chunks, int queries,
                           bool sweep_only = false) {
  const ChunkIndex index = sweep_only ? ChunkIndex::SweepOnlyForTesting(chunks) : ChunkIndex(chunks);
  std::vector<uint32_t> got, want;
  Box unused;
  for (int q = 0; q < queries; ++q) {
    const Box query = RandomSubBox(rng, shape);
    got.clear();
    want.clear();
    index.Query(query, &got);
    for (uint32_t i = 0; i < chunks.size(); ++i) {
      if (Intersect(chunks[i], query, &unused)) want.push_back(i);
    }
    ASSERT_EQ(got, want) << "query " << query.ToString() << " grid=" << index.is_grid();
  }
}

TEST(ChunkIndexTest, GridLayoutsMatchBruteForce) {
  Rng rng(EnvOr("DCKPT_PLAN_SEED", kDefaultSeed) ^ 0x1111);
  for (int i = 0; i < 60; ++i) {
    const uint32_t ndim = static_cast<uint32_t>(Uniform(rng, 1, 4));
    std::vector<uint64_t> shape(ndim);
    std::vector<std::vector<uint64_t>> cuts(ndim);
    for (uint32_t d = 0; d < ndim; ++d) {
      shape[d] = Uniform(rng, 1, 200);
      cuts[d] = Cuts(rng, shape[d], Uniform(rng, 1, 12), Chance(rng, 0.5));
    }
    const std::vector<Box> chunks = GridBoxes(cuts);
    SCOPED_TRACE("case " + std::to_string(i) + " shape " + Describe(shape));
    ASSERT_TRUE(ChunkIndex(chunks).is_grid());
    CheckIndexAgainstScan(rng, shape, chunks, 100);
    CheckIndexAgainstScan(rng, shape, chunks, 100, /*sweep_only=*/true);
  }
}

TEST(ChunkIndexTest, IrregularLayoutsMatchBruteForce) {
  Rng rng(EnvOr("DCKPT_PLAN_SEED", kDefaultSeed) ^ 0x2222);
  int sweeps = 0;
  for (int i = 0; i < 60; ++i) {
    const uint32_t ndim = static_cast<uint32_t>(Uniform(rng, 1, 4));
    std::vector<uint64_t> shape(ndim);
    for (uint32_t d = 0; d < ndim; ++d) shape[d] = Uniform(rng, 64, 4096);
    std::vector<Box> chunks;
    SplitRandomly(rng, Box::Whole(shape).value(), static_cast<int>(Uniform(rng, 4, 14)), &chunks);
    SCOPED_TRACE("case " + std::to_string(i) + " shape " + Describe(shape) + ", " + std::to_string(chunks.size()) +
                 " chunks");
    sweeps += !ChunkIndex(chunks).is_grid();
    CheckIndexAgainstScan(rng, shape, chunks, 100);
    CheckIndexAgainstScan(rng, shape, chunks, 100, /*sweep_only=*/true);
  }
  EXPECT_GT(sweeps, 10) << "irregular layouts should exercise the sweep fallback";
}

TEST(ChunkIndexTest, ScalarAndEmptyTensors) {
  std::vector<uint32_t> out;
  ChunkIndex scalar(std::vector<Box>{Box()});
  scalar.Query(Box(), &out);
  EXPECT_EQ(out, std::vector<uint32_t>{0});

  // A zero-size tensor: one empty chunk, and no query can intersect it.
  const std::vector<uint64_t> shape{4, 0, 3};
  ChunkIndex empty(std::vector<Box>{Box::Whole(shape).value()});
  out.clear();
  empty.Query(Box::Whole(shape).value(), &out);
  EXPECT_TRUE(out.empty());
}

TEST(PlanTensorReadTest, RejectsBadDestinationsNamingEntryAndBox) {
  const std::vector<uint64_t> shape{8, 4};
  const std::vector<Box> chunks{Box::Whole(shape).value()};
  FakeEntry entry(shape, chunks, DType::kF32);
  entry.view.name = "layers.0.weight";
  const ChunkIndex index(chunks);

  auto outside =
      PlanTensorRead(entry.view, index, {Box::Make(std::vector<uint64_t>{6, 0}, std::vector<uint64_t>{4, 4}).value()});
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(outside.status().message().find("layers.0.weight"), std::string::npos);
  EXPECT_NE(outside.status().message().find("[6:10, 0:4]"), std::string::npos) << outside.status().message();

  auto wrong_rank = PlanTensorRead(entry.view, index, {Box::Whole(std::vector<uint64_t>{8}).value()});
  ASSERT_FALSE(wrong_rank.ok());
  EXPECT_EQ(wrong_rank.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_rank.status().message().find("layers.0.weight"), std::string::npos);
}

}  // namespace
}  // namespace distckpt
