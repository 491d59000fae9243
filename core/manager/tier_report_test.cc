// DescribeTier and PruneAbandonedTier on a tier a real CheckpointManager wrote, with what operators find beside it:
// a staging directory of a writer that exited and one of a live writer, an old step nobody marked complete, a damaged
// part, symbolic links named like a step and like a part.
#include "core/manager/tier_report.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

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

std::string Marker(long pid, const std::string& final_path) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return "distckpt staging directory (not committed)\nhost: " + std::string(host) + "\npid: " + std::to_string(pid) +
         "\nstarted_utc: 2026-11-28T10:00:00Z\nfinal_path: " + final_path + "\n";
}

// Steps 1..3 saved by one rank, keep_local 2: steps 2 and 3 are kept.
std::string MakeTier() {
  const std::string base = testing_util::MakeTempDir("tiers-");
  ManagerOptions o;
  o.node_id = "a";
  o.local_dir = base + "/tier";
  o.replicas = 0;
  auto m = CheckpointManager::Create(nullptr, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  static std::vector<float> data(1000);
  for (uint64_t step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(step * 1000 + i);
    State state;
    EXPECT_TRUE(state.AddTensor("w", DType::kF32, {1000}).ok());
    EXPECT_TRUE(state.AddPiece("w", {0}, {1000}, data.data()).ok());
    EXPECT_TRUE(m.value()->Save(step, state, false).ok());
    EXPECT_TRUE(m.value()->Wait(std::chrono::seconds(30)).ok());
  }
  return o.local_dir;
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
  // Step 3: a replica being received by a live writer, one whose writer exited, a link named like a part.
  const std::string step3 = tier + "/step-0000000003";
  const std::string live = StagingPath(step3 + "/part-00001", "00000000000000aa");
  const std::string dead = StagingPath(step3 + "/part-00002", "00000000000000bb");
  ASSERT_EQ(::mkdir(live.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(dead.c_str(), 0755), 0);
  Write(live + "/STAGING", Marker(::getpid(), step3 + "/part-00001"));
  Write(dead + "/STAGING", Marker(ExitedPid(), step3 + "/part-00002"));
  Write(dead + "/data-00000.bin", std::string(5000, 'x'));
  ASSERT_EQ(::symlink(elsewhere.c_str(), (step3 + "/part-00009").c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), (tier + "/step-0000000004").c_str()), 0);
  // Step 2's part: damaged metadata.
  {
    std::fstream f(tier + "/step-0000000002/part-00000/metadata.dckpt",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x7f');
  }

  auto report = DescribeTier(DefaultStorage(), tier);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::string json = TierReportJson(report.value());
  auto doc = ParseJson(json, "tiers");
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
  const std::string live_name = live.substr(live.rfind('/') + 1), dead_name = dead.substr(dead.rfind('/') + 1);
  EXPECT_EQ(Str(*PartNamed(*s3, live_name), "state"), "in progress") << json;
  EXPECT_EQ(Str(*PartNamed(*s3, dead_name), "state"), "abandoned") << json;
  EXPECT_NE(Str(*PartNamed(*s3, dead_name), "why").find("has exited"), std::string::npos) << json;
  EXPECT_EQ(Num(*PartNamed(*s3, dead_name), "rank"), 2) << json;
  EXPECT_EQ(Str(*PartNamed(*s3, "part-00009"), "state"), "damaged") << json;

  const JsonValue* s2 = Step(doc.value(), 2);
  ASSERT_NE(s2, nullptr);
  EXPECT_EQ(Str(*PartNamed(*s2, "part-00000"), "state"), "damaged") << json;
  EXPECT_FALSE(Bool(*s2, "restorable_here")) << json;
  EXPECT_FALSE(Bool(*s2, "abandoned")) << json;  // marked complete: a person decides

  const JsonValue* s1 = Step(doc.value(), 1);
  ASSERT_NE(s1, nullptr);
  EXPECT_FALSE(Bool(*s1, "complete"));
  EXPECT_TRUE(Bool(*s1, "abandoned")) << json;
  bool link_named = false;
  for (const JsonValue& o : doc.value().Find("other")->items) link_named |= o.text == "step-0000000004";
  EXPECT_TRUE(link_named) << json;

  // The prune: a dry run says what would go, then it goes; nothing else is touched.
  std::vector<std::string> said;
  ASSERT_TRUE(PruneAbandonedTier(DefaultStorage(), tier, true, [&](const std::string& p) {
                said.push_back(p);
                return OkStatus();
              }).ok());
  EXPECT_EQ(said, (std::vector<std::string>{tier + "/step-0000000001/part-00000", dead}));
  EXPECT_TRUE(Exists(dead));
  ASSERT_TRUE(PruneAbandonedTier(DefaultStorage(), tier, false, nullptr).ok());
  EXPECT_FALSE(Exists(dead));
  EXPECT_FALSE(Exists(tier + "/step-0000000001"));
  for (const std::string& kept :
       {live, step3 + "/part-00000", step3 + "/part-00009", step3 + "/complete-00000",
        tier + "/step-0000000002/part-00000", tier + "/step-0000000004", elsewhere + "/keep.txt"}) {
    EXPECT_TRUE(Exists(kept)) << kept;
  }
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
