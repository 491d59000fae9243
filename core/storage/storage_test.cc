// Backend-independent pieces of storage.h: staging names and nonces. The protocol itself is covered by the
// conformance suite (storage_conformance.cc), run against every backend.
#include "core/storage/storage.h"

#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace distckpt {
namespace {

TEST(StagingNamesTest, StagingPathIsASiblingOfTheFinalPath) {
  EXPECT_EQ(StagingPath("/data/run/step-10", "00ff"), "/data/run/step-10.dckpt-staging-00ff");
  EXPECT_EQ(StagingPath("/data/run/step-10//", "00ff"), "/data/run/step-10.dckpt-staging-00ff");
  EXPECT_EQ(StagingPath("relative", "ab"), "relative.dckpt-staging-ab");
  EXPECT_EQ(ReplacedPath("/data/run/step-10/", "ab"), "/data/run/step-10.dckpt-old-ab");
}

TEST(StagingNamesTest, ParseStagingNameAcceptsWhatStagingPathMakes) {
  const std::string nonce = NewNonce();
  std::string final_name;
  EXPECT_TRUE(ParseStagingName("step-10.dckpt-staging-" + nonce, &final_name));
  EXPECT_EQ(final_name, "step-10");
  // The last infix wins, so a checkpoint may itself be named like one.
  EXPECT_TRUE(ParseStagingName("a.dckpt-staging-1.dckpt-staging-2", &final_name));
  EXPECT_EQ(final_name, "a.dckpt-staging-1");
  EXPECT_TRUE(ParseStagingName("x.dckpt-staging-0", nullptr));
}

TEST(StagingNamesTest, ParseStagingNameRejectsLookalikes) {
  std::string final_name = "untouched";
  for (const char* name :
       {"step-10", ".dckpt-staging-00ff", "step.dckpt-staging-", "step.dckpt-staging-00FF", "step.dckpt-staging-00fg",
        "dir/step.dckpt-staging-00ff", "step.dckpt-old-00ff", "step.dckpt-staging-00ff/"}) {
    EXPECT_FALSE(ParseStagingName(name, &final_name)) << name;
  }
  EXPECT_EQ(final_name, "untouched");
}

TEST(StagingNamesTest, ParseReplacedName) {
  std::string final_name;
  EXPECT_TRUE(ParseReplacedName("step-10.dckpt-old-0123456789abcdef", &final_name));
  EXPECT_EQ(final_name, "step-10");
  EXPECT_FALSE(ParseReplacedName("step-10.dckpt-staging-0123456789abcdef", &final_name));
  EXPECT_FALSE(ParseReplacedName("step-10", &final_name));
}

TEST(NonceTest, SixteenLowerCaseHexDigits) {
  for (int i = 0; i < 100; ++i) {
    const std::string nonce = NewNonce();
    ASSERT_EQ(nonce.size(), 16u) << nonce;
    EXPECT_EQ(nonce.find_first_not_of("0123456789abcdef"), std::string::npos) << nonce;
  }
}

TEST(NonceTest, UniqueAcrossThreads) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 5000;
  std::mutex mu;
  std::set<std::string> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::vector<std::string> mine;
      for (int i = 0; i < kPerThread; ++i) mine.push_back(NewNonce());
      std::lock_guard<std::mutex> lock(mu);
      seen.insert(mine.begin(), mine.end());
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(seen.size(), size_t{kThreads * kPerThread});
}

TEST(BackendsTest, FactoriesAndDefault) {
  EXPECT_EQ(NewPosixStorage()->name(), "posix");
  EXPECT_EQ(NewMemoryStorage()->name(), "memory");
  ASSERT_NE(DefaultStorage(), nullptr);
  EXPECT_EQ(DefaultStorage(), DefaultStorage());
  EXPECT_EQ(DefaultStorage()->name(), "posix");
}

}  // namespace
}  // namespace distckpt
