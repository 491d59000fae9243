// Persisting steps (core/manager/persist.h): replicated boxes written once, incremental persisted steps that refer to
// the previous one, compression, retention that keeps what a kept step refers to, and a damaged part never persisted.
#include "core/manager/persist.h"

#include <set>

#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/format/checksum.h"
#include "core/manager/manager_test_util.h"

namespace distckpt {
namespace {

using namespace manager_testing;  // NOLINT: the package's test helpers

std::string Listing(const std::string& dir) {
  FILE* p = popen(("cd '" + dir + "' && ls | sort").c_str(), "r");
  std::string out;
  char line[512];
  while (p && std::fgets(line, sizeof line, p)) out += line;
  if (p) pclose(p);
  return out;
}

std::unique_ptr<Reader> OpenOrDie(const std::string& path) {
  ReadOptions ro;
  ro.map_files = false;
  auto r = Reader::Open(path, nullptr, ro);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Every data file of the checkpoint's own holds its chunks back to back (each at the next aligned offset) and
// nothing else: no box was written twice, no byte is unaccounted for.
void ExpectDense(const MetadataView& meta, const std::string& what) {
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> extents(meta.num_files());
  for (size_t e = 0; e < meta.num_entries(); ++e) {
    const EntryView v = meta.entry(e);
    for (uint32_t c = 0; c < v.num_chunks; ++c) {
      const ChunkLocation loc = v.chunk(c);
      if (meta.file_base(loc.file) != 0 || loc.length == 0) continue;
      const ChunkCoding coding = v.coding(c);
      extents[loc.file].emplace_back(loc.offset, coding.raw() ? loc.length : coding.stored_length);
    }
  }
  for (size_t f = 0; f < meta.num_files(); ++f) {
    if (meta.file_base(f) != 0) continue;
    auto& x = extents[f];
    std::sort(x.begin(), x.end());
    uint64_t end = 0;
    for (const auto& [offset, extent] : x) {
      EXPECT_EQ(offset, (end + meta.alignment() - 1) / meta.alignment() * meta.alignment())
          << what << ": file " << meta.file_name(f) << " has bytes no chunk owns before offset " << offset;
      end = offset + extent;
    }
    EXPECT_EQ(meta.file_size(f), end) << what << ": file " << meta.file_name(f);
  }
}

Job PersistingJob(bool incremental, Codec compression) {
  Job job;
  job.base = testing_util::MakeTempDir("persist-");
  job.persistent = job.base + "/persistent";
  ::mkdir(job.persistent.c_str(), 0755);
  job.persist_every = 1;
  job.configure = [=](ManagerOptions* o) {
    o->persist_incremental = incremental;
    o->persist_compression = compression;
  };
  return job;
}

TEST(Persist, IncrementalCompressedStepsReferToTheFirstAndRestoreExactlyOnOtherRanks) {
  Job job = PersistingJob(true, Codec::kZstdGrouped);
  RunJob(job, 4, [](CheckpointManager* m, int rank) -> Status {
    for (uint64_t s = 1; s <= 4; ++s) {
      RankState st(rank, 4, s, true, /*with_frozen=*/true);
      DCKPT_RETURN_IF_ERROR(m->Save(s, st.state, false));
    }
    DCKPT_RETURN_IF_ERROR(m->Wait(std::chrono::seconds(60)));
    const ManagerStats stats = m->stats();
    if (rank == 0) {
      // Steps 2..4 refer to step 1 for all of "frozen".
      DCKPT_RETURN_IF_ERROR(Expect(stats.bytes_persist_reused == 3 * kRows * kFrozenCols * sizeof(float),
                                   "reused " + std::to_string(stats.bytes_persist_reused)));
    }
    return OkStatus();
  });
  for (uint64_t s = 1; s <= 4; ++s) {
    const std::string path = job.persistent + "/step-000000000" + std::to_string(s);
    auto reader = OpenOrDie(path);
    ASSERT_NE(reader, nullptr);
    const MetadataView& meta = reader->metadata();
    if (s == 1) {
      EXPECT_EQ(meta.num_bases(), 0u);
      const EntryView frozen = meta.entry(*meta.Find("frozen"));
      size_t coded = 0;
      for (uint32_t c = 0; c < frozen.num_chunks; ++c) coded += frozen.coding(c).raw() ? 0 : 1;
      EXPECT_EQ(coded, frozen.num_chunks) << "step 1's frozen chunks are not compressed";
    } else {
      ASSERT_EQ(meta.num_bases(), 1u) << path;
      EXPECT_EQ(meta.base_name(0), "step-0000000001");  // one hop: where the bytes lie
      EXPECT_EQ(meta.chain_length(), s - 1);
    }
    ExpectDense(meta, path);
    RankState one(0, 1, s, false, true);
    auto loaded = Load(path, one.state, nullptr, ReadOptions());
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_TRUE(one.Check(0, 1, s).ok()) << one.Check(0, 1, s).ToString();
  }
  // Every node lost: three ranks restore step 4 from persistent storage.
  ASSERT_EQ(std::system(("rm -rf '" + job.base + "/node-a' '" + job.base + "/node-b'").c_str()), 0);
  job.node = [](int rank, int) { return std::string(1, static_cast<char>('a' + rank)); };
  RunJob(job, 3, [](CheckpointManager* m, int rank) -> Status {
    RankState st(rank, 3, 4, false, true);
    DCKPT_ASSIGN_OR_RETURN(RestoreSummary s, m->Restore(st.state, RestoreOptions()));
    DCKPT_RETURN_IF_ERROR(Expect(s.found && s.step == 4 && s.tier == Tier::kPersistent, m->restore_report()));
    return st.Check(rank, 3, 4);
  });
}

TEST(Persist, AReplicatedBoxIsWrittenOnceAndTheWritersShareTheWork) {
  Job job = PersistingJob(false, Codec::kRaw);
  job.configure = [](ManagerOptions*) {};
  // Every rank holds all of "r0".."r3" (data parallel): each writes one of them.
  RunJob(job, 4, [](CheckpointManager* m, int rank) -> Status {
    std::vector<std::vector<float>> data(4, std::vector<float>(4096));
    State st;
    for (int t = 0; t < 4; ++t) {
      for (size_t i = 0; i < data[t].size(); ++i) data[t][i] = static_cast<float>(t * 100000 + i);
      const std::string name = "r" + std::to_string(t);
      DCKPT_RETURN_IF_ERROR(st.AddTensor(name, DType::kF32, {4096}));
      DCKPT_RETURN_IF_ERROR(st.AddPiece(name, {0}, {4096}, data[t].data()));
    }
    DCKPT_RETURN_IF_ERROR(m->Save(1, st, false));
    DCKPT_RETURN_IF_ERROR(m->Wait(std::chrono::seconds(60)));
    return Expect(m->stats().bytes_persisted == 4096 * sizeof(float),
                  "rank " + std::to_string(rank) + " persisted " + std::to_string(m->stats().bytes_persisted));
  });
  auto reader = OpenOrDie(job.persistent + "/step-0000000001");
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->metadata().num_files(), 4u);
  ExpectDense(reader->metadata(), "step 1");
}

// Every persisted step that exists loads with its own values.
void ExpectEveryPersistedStepExact(const std::string& dir) {
  for (uint64_t s = 1; s <= 9; ++s) {
    const std::string path = dir + "/step-000000000" + std::to_string(s);
    struct stat sb;
    if (::stat((path + "/metadata.dckpt").c_str(), &sb) != 0) continue;
    RankState one(0, 1, s, false, true);
    auto loaded = Load(path, one.state, nullptr, ReadOptions());
    ASSERT_TRUE(loaded.ok()) << path << ": " << loaded.status().ToString();
    ASSERT_TRUE(one.Check(0, 1, s).ok()) << path << ": " << one.Check(0, 1, s).ToString();
  }
}

// kill -9 of rank 1 at its k-th operation on persistent storage while incremental, compressed steps are persisted:
// every persisted step there is loads exactly, and the next run persists again over what the kill left.
class KillWhilePersisting : public ::testing::TestWithParam<int> {};

TEST_P(KillWhilePersisting, LeavesOnlyStepsThatLoadExactly) {
  Job job = PersistingJob(true, Codec::kZstdGrouped);
  const int k = GetParam();
  job.persistent_faults = [k](int rank) { return rank == 1 ? "any:*:nth=" + std::to_string(k) + ":kill" : ""; };
  auto save = [](uint64_t first, uint64_t last) {
    return [=](CheckpointManager* m, int rank) -> Status {
      for (uint64_t s = first; s <= last; ++s) {
        RankState st(rank, 4, s, true, true);
        DCKPT_RETURN_IF_ERROR(m->Save(s, st.state, false));
      }
      return m->Wait(std::chrono::seconds(60));
    };
  };
  RunJob(
      job, 4, [&](CheckpointManager* m, int rank) { return save(1, 4)(m, rank).ok() ? OkStatus() : OkStatus(); }, -2);
  ExpectEveryPersistedStepExact(job.persistent);
  struct stat sb;
  // Rank 1's operations for step 4 all come before rank 0 commits it: the kill happened if step 4 is not there.
  ASSERT_NE(::stat((job.persistent + "/step-0000000004/metadata.dckpt").c_str(), &sb), 0) << "no kill at " << k;
  job.persistent_faults = [](int) { return std::string(); };
  RunJob(job, 4, save(5, 6));
  ExpectEveryPersistedStepExact(job.persistent);
  EXPECT_EQ(::stat((job.persistent + "/step-0000000006/metadata.dckpt").c_str(), &sb), 0);
}

INSTANTIATE_TEST_SUITE_P(Operations, KillWhilePersisting, ::testing::Range(1, 21));

ManagerOptions OneProcess(const std::string& base) {
  ManagerOptions o = OneNode(base);
  o.persistent_path = base + "/persistent";
  o.persist_every = 1;
  o.persist_incremental = true;
  return o;
}

Status SaveFrozenSteps(CheckpointManager* m, uint64_t first, uint64_t last) {
  for (uint64_t s = first; s <= last; ++s) {
    RankState st(0, 1, s, true, true);
    DCKPT_RETURN_IF_ERROR(m->Save(s, st.state, false));
  }
  return m->Wait(std::chrono::seconds(60));
}

TEST(Persist, RetentionKeepsEveryStepAKeptOneRefersTo) {
  for (uint32_t full_every : {0u, 3u}) {
    const std::string base = testing_util::MakeTempDir("persist-");
    ManagerOptions o = OneProcess(base);
    o.keep_persistent = 2;
    o.persist_full_every = full_every;
    auto m = CheckpointManager::Create(nullptr, o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_TRUE(SaveFrozenSteps(m.value().get(), 1, 5).ok());
    // Without a bound, steps 4 and 5 refer to step 1, which stays; with full_every=3, step 4 is whole (the third
    // save of step 1's chain would be the bound) and step 5 refers to it: nothing older is needed.
    EXPECT_EQ(Listing(o.persistent_path), full_every == 0 ? "step-0000000001\nstep-0000000004\nstep-0000000005\n"
                                                          : "step-0000000004\nstep-0000000005\n");
    for (uint64_t s : {4, 5}) {
      const std::string path = o.persistent_path + "/step-000000000" + std::to_string(s);
      RankState one(0, 1, s, false, true);
      auto loaded = Load(path, one.state, nullptr, ReadOptions());
      ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
      EXPECT_TRUE(one.Check(0, 1, s).ok()) << one.Check(0, 1, s).ToString();
    }
    auto five = OpenOrDie(o.persistent_path + "/step-0000000005");
    ASSERT_EQ(five->metadata().num_bases(), 1u);
    EXPECT_EQ(five->metadata().base_name(0), full_every == 0 ? "step-0000000001" : "step-0000000004");
  }
}

TEST(Persist, PersistingAgainAStepALaterOneRefersToIsRefused) {
  const std::string base = testing_util::MakeTempDir("persist-");
  {
    auto m = CheckpointManager::Create(nullptr, OneProcess(base));
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(SaveFrozenSteps(m.value().get(), 1, 2).ok());
  }
  auto m = CheckpointManager::Create(nullptr, OneProcess(base));  // a later run saves step 1 again
  ASSERT_TRUE(m.ok());
  Status st = SaveFrozenSteps(m.value().get(), 1, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("step-0000000002"), std::string::npos) << st.ToString();
  auto two = OpenOrDie(base + "/persistent/step-0000000002");
  ASSERT_NE(two, nullptr);
  RankState one(0, 1, 2, false, true);
  ASSERT_TRUE(Load(base + "/persistent/step-0000000002", one.state, nullptr, ReadOptions()).ok());
  EXPECT_TRUE(one.Check(0, 1, 2).ok());
}

// A part damaged in the local tier is never copied into persistent storage: the copy checks every byte.
TEST(Persist, ADamagedPartIsRefusedNamingThePartTheEntryAndTheFile) {
  const std::string base = testing_util::MakeTempDir("persist-");
  ManagerOptions o = OneProcess(base);
  o.persistent_path.clear();
  auto m = CheckpointManager::Create(nullptr, o);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(SaveFrozenSteps(m.value().get(), 1, 1).ok());
  const std::string part_dir = o.local_dir + "/step-0000000001/part-00000";
  auto meta = DefaultStorage()->ReadFile(part_dir + "/metadata.dckpt", kMaxMetadataBytes);
  ASSERT_TRUE(meta.ok());
  auto part = ParsePart(meta.value(), part_dir);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  // The chunk of "frozen" and a byte in its middle.
  std::vector<uint32_t> all;
  uint32_t flat = 0;
  std::string damaged_file;
  for (const EntryRecord& e : part->record.entries) {
    for (const ChunkLocation& loc : e.chunks) {
      all.push_back(flat++);
      if (e.name.rfind("frozen", 0) == 0) {
        damaged_file = part_dir + "/" + part->record.files[loc.file].name;
        FlipByte(damaged_file, loc.offset + loc.length / 2);
      }
    }
  }
  ASSERT_FALSE(damaged_file.empty());
  ThreadPool pool(2);
  for (Codec codec : {Codec::kRaw, Codec::kZstdGrouped}) {
    const std::string out_path = base + "/out-" + std::to_string(static_cast<int>(codec));
    auto out = DefaultStorage()->CreateFile(out_path);
    ASSERT_TRUE(out.ok());
    PersistWriteOptions wo;
    wo.compression = codec;
    wo.pool = &pool;
    uint64_t stored = 0;
    auto written = WritePersistedChunks(DefaultStorage(), part_dir, part.value(), all, out.value().get(), wo, &stored);
    ASSERT_FALSE(written.ok());
    EXPECT_EQ(written.status().code(), StatusCode::kCorrupt);
    for (const std::string& name : {part_dir, std::string("'frozen#"), damaged_file}) {
      EXPECT_NE(written.status().message().find(name), std::string::npos) << written.status().ToString();
    }
    (void)out.value()->Close();
  }
}

// A hostile plan or report from "rank 0" is refused, never followed.
TEST(Persist, MalformedPlansAndReportsAreRefused) {
  PersistPlan plan;
  plan.writes = {{0, 2, 5}, {}, {1}};
  const std::string encoded = EncodePlan(plan);
  auto back = DecodePlan(encoded, 3);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->writes, plan.writes);
  EXPECT_FALSE(DecodePlan(encoded, 2).ok());
  for (size_t cut = 0; cut < encoded.size(); ++cut) EXPECT_FALSE(DecodePlan(encoded.substr(0, cut), 3).ok()) << cut;
  EXPECT_FALSE(DecodePlan(encoded + "x", 3).ok());
}

}  // namespace
}  // namespace distckpt
