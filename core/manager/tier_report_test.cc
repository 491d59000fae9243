// DescribeTier and PruneAbandonedTier on a tier a real CheckpointManager wrote, with what operators find beside it:
// a staging directory of a writer that exited, one of a live writer and one of a writer on another host idle for
// hours, an old step nobody marked complete, a damaged part, symbolic links named like a step, a part, a staging
// directory and a marker, and a later run's step below an earlier run's complete ones.
#include "core/manager/tier_report.h"

#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "core/base/testing/temp_dir.h"
#include "core/engine/state.h"
#include "core/foreign/json.h"
#include "core/manager/manager.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace {

void Write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

long ExitedPid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

std::string Marker(long pid, const std::string& final_path, std::string host = "") {
  if (host.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    host = name;
  }
  return "distckpt staging directory (not committed)\nhost: " + host + "\npid: " + std::to_string(pid) +
         "\nstarted_utc: 2026-11-28T10:00:00Z\nfinal_path: " + final_path + "\n";
}

// Sets the modification time of `path` to `hours` ago.
void Age(const std::string& path, int hours) {
  struct timeval now;
  ::gettimeofday(&now, nullptr);
  now.tv_sec -= hours * 3600;
  const struct timeval times[2] = {now, now};
  ASSERT_EQ(::utimes(path.c_str(), times), 0) << path;
}

// Steps first..last saved by one rank in one run (a CheckpointManager of its own), keep_local 2: the newest two are
// kept.
void SaveSteps(const std::string& tier, uint64_t first, uint64_t last) {
  ManagerOptions o;
  o.node_id = "a";
  o.local_dir = tier;
  o.replicas = 0;
  auto m = CheckpointManager::Create(nullptr, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  static std::vector<float> data(1000);
  for (uint64_t step = first; step <= last; ++step) {
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(step * 1000 + i);
    State state;
    EXPECT_TRUE(state.AddTensor("w", DType::kF32, {1000}).ok());
    EXPECT_TRUE(state.AddPiece("w", {0}, {1000}, data.data()).ok());
    EXPECT_TRUE(m.value()->Save(step, state, false).ok());
    EXPECT_TRUE(m.value()->Wait(std::chrono::seconds(30)).ok());
  }
}

// Steps 1..3 saved by one rank, keep_local 2: steps 2 and 3 are kept.
std::string MakeTier() {
  const std::string tier = testing_util::MakeTempDir("tiers-") + "/tier";
  SaveSteps(tier, 1, 3);
  return tier;
}

Result<JsonValue> Describe(const std::string& tier, std::string* json) {
  auto report = DescribeTier(DefaultStorage(), tier);
  if (!report.ok()) return report.status();
  *json = TierReportJson(report.value());
  return ParseJson(*json, "tiers");
}

uint64_t Num(const JsonValue& v, const char* name) { return v.Find(name)->AsU64().value_or(UINT64_MAX); }
std::string Str(const JsonValue& v, const char* name) { return v.Find(name)->text; }
bool Bool(const JsonValue& v, const char* name) { return v.Find(name)->boolean; }

const JsonValue* Step(const JsonValue& doc, uint64_t step) {
  for (const JsonValue& s : doc.Find("steps")->items) {
    if (Num(s, "step") == step) return &s;
  }
  return nullptr;
}

const JsonValue* PartNamed(const JsonValue& step, const std::string& name) {
  for (const JsonValue& p : step.Find("parts")->items) {
    if (Str(p, "name") == name) return &p;
  }
  return nullptr;
}

TEST(TierReport, DescribesWhatAManagerWroteAndWhatIsLeftBesideIt) {
  const std::string tier = MakeTier();
  const std::string elsewhere = testing_util::MakeTempDir("tiers-elsewhere-");
  Write(elsewhere + "/keep.txt", "not the manager's");
  // Step 1, marked complete by no one: a copy of step 2's part renamed, as a run that died mid-step leaves it.
  ASSERT_EQ(std::system(("mkdir -p '" + tier + "/step-0000000001' && cp -r '" + tier +
                         "/step-0000000002/part-00000' '" + tier + "/step-0000000001/part-00000'")
                            .c_str()),
            0);
  // Step 3: a replica being received by a live writer, one whose writer exited, one whose writer on another host
  // has been idle for two hours and one of another host active now; links named like a part, a staging directory
  // and a marker.
  const std::string step3 = tier + "/step-0000000003";
  const std::string live = StagingPath(step3 + "/part-00001", "00000000000000aa");
  const std::string dead = StagingPath(step3 + "/part-00002", "00000000000000bb");
  const std::string foreign_idle = StagingPath(step3 + "/part-00003", "00000000000000cc");
  const std::string foreign_busy = StagingPath(step3 + "/part-00004", "00000000000000dd");
  for (const std::string& d : {live, dead, foreign_idle, foreign_busy}) ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  Write(live + "/STAGING", Marker(::getpid(), step3 + "/part-00001"));
  Write(dead + "/STAGING", Marker(ExitedPid(), step3 + "/part-00002"));
  Write(dead + "/data-00000.bin", std::string(5000, 'x'));
  Write(foreign_idle + "/STAGING", Marker(42, step3 + "/part-00003", "another-host"));
  Write(foreign_busy + "/STAGING", Marker(42, step3 + "/part-00004", "another-host"));
  Age(foreign_idle + "/STAGING", 2);
  Age(foreign_idle, 2);
  ASSERT_EQ(::symlink(elsewhere.c_str(), (step3 + "/part-00009").c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), StagingPath(step3 + "/part-00008", "00000000000000ee").c_str()), 0);
  ASSERT_EQ(::symlink((elsewhere + "/keep.txt").c_str(), (step3 + "/complete-00005").c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), (tier + "/step-0000000004").c_str()), 0);
  // Step 2's part: damaged metadata.
  {
    std::fstream f(tier + "/step-0000000002/part-00000/metadata.dckpt",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x7f');
  }

  std::string json;
  auto doc = Describe(tier, &json);
  ASSERT_TRUE(doc.ok()) << doc.status().ToString() << "\n" << json;

  const JsonValue* s3 = Step(doc.value(), 3);
  ASSERT_NE(s3, nullptr) << json;
  EXPECT_TRUE(Bool(*s3, "complete")) << json;
  EXPECT_TRUE(Bool(*s3, "restorable_here")) << json;
  const JsonValue* own = PartNamed(*s3, "part-00000");
  ASSERT_NE(own, nullptr) << json;
  EXPECT_EQ(Str(*own, "state"), "complete");
  EXPECT_EQ(Num(*own, "rank"), 0);
  EXPECT_EQ(Num(*own, "ranks"), 1);
  EXPECT_GT(Num(*own, "bytes"), 4000);
  EXPECT_FALSE(Bool(*own, "replica")) << json;  // rank 0 marked the step here: its own part
  auto name_of = [](const std::string& path) { return path.substr(path.rfind('/') + 1); };
  const JsonValue* live_part = PartNamed(*s3, name_of(live));
  const JsonValue* dead_part = PartNamed(*s3, name_of(dead));
  ASSERT_TRUE(live_part && dead_part) << json;
  EXPECT_EQ(Str(*live_part, "state"), "in progress") << json;
  EXPECT_NE(Str(*live_part, "why").find("is running"), std::string::npos) << json;
  EXPECT_TRUE(Bool(*live_part, "replica")) << json;  // rank 1 marked nothing here: another node's rank
  EXPECT_EQ(Str(*dead_part, "state"), "abandoned") << json;
  EXPECT_EQ(Str(*dead_part, "why").find("writer pid"), 0) << json;
  EXPECT_NE(Str(*dead_part, "why").find("has exited"), std::string::npos) << json;
  EXPECT_EQ(Num(*dead_part, "rank"), 2) << json;
  EXPECT_GE(Num(*dead_part, "bytes"), 5000) << json;
  EXPECT_EQ(Str(*PartNamed(*s3, name_of(foreign_idle)), "state"), "abandoned") << json;
  EXPECT_NE(Str(*PartNamed(*s3, name_of(foreign_idle)), "why").find("another-host"), std::string::npos) << json;
  EXPECT_EQ(Str(*PartNamed(*s3, name_of(foreign_busy)), "state"), "in progress") << json;
  EXPECT_NE(Str(*PartNamed(*s3, name_of(foreign_busy)), "why").find("grace period"), std::string::npos) << json;
  const JsonValue* link_part = PartNamed(*s3, "part-00009");
  ASSERT_NE(link_part, nullptr) << json;
  EXPECT_EQ(Str(*link_part, "state"), "damaged") << json;
  EXPECT_NE(Str(*link_part, "why").find("left alone"), std::string::npos) << json;
  EXPECT_EQ(s3->Find("markers")->items.size(), 1u) << json;  // the link named like a marker is not one

  const JsonValue* s2 = Step(doc.value(), 2);
  ASSERT_NE(s2, nullptr);
  EXPECT_EQ(Str(*PartNamed(*s2, "part-00000"), "state"), "damaged") << json;
  EXPECT_FALSE(Bool(*s2, "restorable_here")) << json;
  EXPECT_FALSE(Bool(*s2, "abandoned")) << json;  // marked complete: a person decides

  const JsonValue* s1 = Step(doc.value(), 1);
  ASSERT_NE(s1, nullptr);
  EXPECT_FALSE(Bool(*s1, "complete"));
  EXPECT_TRUE(Bool(*s1, "abandoned")) << json;
  std::set<std::string> other;
  for (const JsonValue& o : doc.value().Find("other")->items) other.insert(o.text);
  EXPECT_EQ(other, (std::set<std::string>{"step-0000000003/complete-00005",
                                          "step-0000000003/" + name_of(StagingPath("part-00008", "00000000000000ee")),
                                          "step-0000000004"}))
      << json;

  // The prune: a dry run says what would go, then it goes; nothing else is touched.
  std::vector<std::string> said;
  ASSERT_TRUE(PruneAbandonedTier(DefaultStorage(), tier, true, [&](const std::string& p) {
                said.push_back(p);
                return OkStatus();
              }).ok());
  EXPECT_EQ(said, (std::vector<std::string>{tier + "/step-0000000001/part-00000", dead, foreign_idle}));
  EXPECT_TRUE(Exists(dead));
  ASSERT_TRUE(PruneAbandonedTier(DefaultStorage(), tier, false, nullptr).ok());
  EXPECT_FALSE(Exists(dead));
  EXPECT_FALSE(Exists(foreign_idle));
  EXPECT_FALSE(Exists(tier + "/step-0000000001"));
  for (const std::string& kept :
       {live, foreign_busy, step3 + "/part-00000", step3 + "/part-00009", step3 + "/complete-00000",
        step3 + "/complete-00005", StagingPath(step3 + "/part-00008", "00000000000000ee"),
        tier + "/step-0000000002/part-00000", tier + "/step-0000000004", elsewhere + "/keep.txt"}) {
    EXPECT_TRUE(Exists(kept)) << kept;
  }
}

// A job restored from an older step writes steps below the ones an earlier run completed: such a step, not yet
// marked (its replicas still on the way), is not abandoned until its own run has marked a newer one.
TEST(TierReport, AnotherRunsNewerStepDoesNotMakeAStepAbandoned) {
  const std::string tier = testing_util::MakeTempDir("tiers-runs-") + "/tier";
  SaveSteps(tier, 1, 3);                                                       // run A: steps 2 and 3 kept, complete
  SaveSteps(tier, 1, 1);                                                       // run B: step 1, complete ...
  ASSERT_EQ(::unlink((tier + "/step-0000000001/complete-00000").c_str()), 0);  // ... not yet marked
  std::string json;
  auto doc = Describe(tier, &json);
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  const JsonValue* s1 = Step(doc.value(), 1);
  const JsonValue* s3 = Step(doc.value(), 3);
  ASSERT_TRUE(s1 && s3) << json;
  const std::string run_a = Str(s3->Find("markers")->items.at(0), "run");
  const std::string run_b = Str(*PartNamed(*s1, "part-00000"), "run");
  ASSERT_FALSE(run_b.empty()) << json;
  ASSERT_NE(run_a, run_b) << json;
  EXPECT_FALSE(Bool(*s1, "complete")) << json;
  EXPECT_FALSE(Bool(*s1, "abandoned")) << json;
  // No marker: whose node this is cannot be told.
  EXPECT_EQ(PartNamed(*s1, "part-00000")->Find("replica")->kind, JsonValue::Kind::kNull) << json;
  std::vector<std::string> said;
  ASSERT_TRUE(PruneAbandonedTier(DefaultStorage(), tier, false, [&](const std::string& p) {
                said.push_back(p);
                return OkStatus();
              }).ok());
  EXPECT_TRUE(said.empty()) << said.front();
  EXPECT_TRUE(Exists(tier + "/step-0000000001/part-00000/metadata.dckpt"));
  // Once run B marks a newer step complete here, its unmarked step 1 is what its manager would have removed.
  Write(tier + "/step-0000000002/complete-00001", run_b);
  doc = Describe(tier, &json);
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_TRUE(Bool(*Step(doc.value(), 1), "abandoned")) << json;
  ASSERT_TRUE(PruneAbandonedTier(DefaultStorage(), tier, false, nullptr).ok());
  EXPECT_FALSE(Exists(tier + "/step-0000000001"));
  EXPECT_TRUE(Exists(tier + "/step-0000000002/part-00000/metadata.dckpt"));
}

TEST(TierReport, RefusesWhatIsNotATier) {
  const std::string dir = testing_util::MakeTempDir("tiers-not-");
  Write(dir + "/notes.txt", "x");
  auto r = DescribeTier(DefaultStorage(), dir);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a checkpoint manager's local tier"), std::string::npos);
  EXPECT_EQ(DescribeTier(DefaultStorage(), dir + "/missing").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace distckpt
