// The shared communicator suite over Gloo: every rank is a forked process talking over loopback TCP, the group
// formed through a FileStore directory or a real redis-server. Built twice (BUILD.bazel): over the Gloo code linked in,
// and through the Gloo plugin (gloo_plugin_conformance_test).
#include <memory>
#include <string>

#include "core/base/testing/temp_dir.h"
#include "core/comm/comm_conformance.h"
#include "core/comm/gloo/gloo_test_util.h"
#include "core/comm/gloo/gloo_under_test.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace {

using comm_testing::RunRanks;

// Runs the conformance suite on `n` ranks joined through `rendezvous`.
void RunSuite(int n, const std::string& rendezvous, const std::string& prefix) {
  auto outcomes = RunRanks(n, std::chrono::seconds(60), [&](int rank) {
    auto comm =
        gloo_testing::NewGlooForTest(gloo_testing::Loopback(rank, n, rendezvous, std::chrono::seconds(20), prefix));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    return comm_testing::ReportInChild(rank, comm_testing::RunConformance(comm->get()));
  });
  EXPECT_TRUE(comm_testing::AllExitedZero(outcomes)) << comm_testing::Describe(outcomes);
}

class GlooFileStoreConformance : public ::testing::TestWithParam<int> {};

TEST_P(GlooFileStoreConformance, Passes) {
  RunSuite(GetParam(), "file://" + testing_util::MakeTempDir("gloo-file-"), "");
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooFileStoreConformance, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "n" + std::to_string(info.param); });

class GlooRedisConformance : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    server_ = new gloo_testing::RedisServer();
    skip_reason_ = new std::string(server_->Start());
  }
  static void TearDownTestSuite() {
    delete server_;
    delete skip_reason_;
    server_ = nullptr;
    skip_reason_ = nullptr;
  }
  static gloo_testing::RedisServer* server_;
  static std::string* skip_reason_;
};
gloo_testing::RedisServer* GlooRedisConformance::server_ = nullptr;
std::string* GlooRedisConformance::skip_reason_ = nullptr;

TEST_P(GlooRedisConformance, Passes) {
  if (!skip_reason_->empty()) GTEST_SKIP() << *skip_reason_;
  // One server, one prefix per group.
  RunSuite(GetParam(), server_->uri(), "conformance-n" + std::to_string(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooRedisConformance, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace distckpt
