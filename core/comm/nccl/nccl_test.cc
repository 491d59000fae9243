#include "core/comm/nccl/nccl.h"

#include "gtest/gtest.h"

#ifdef DISTCKPT_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>

#include "core/comm/comm_conformance.h"
#include "core/comm/gloo/gloo.h"
#include "core/comm/gloo/gloo_test_util.h"

namespace distckpt {
namespace {

using comm_testing::AllExitedZero;
using comm_testing::Describe;
using comm_testing::RunRanks;

// CUDA does not survive fork(), so the test process itself never touches CUDA: the device count comes from a child.
int DeviceCount() {
  auto outcomes = RunRanks(1, std::chrono::seconds(60), [](int) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return std::min(n, 100);
  });
  return outcomes[0].exit_code < 0 ? 0 : outcomes[0].exit_code;
}

TEST(Nccl, SingleRankPassesConformance) {
  if (DeviceCount() < 1) GTEST_SKIP() << "no CUDA device here; the NCCL backend is only built";
  auto outcomes = RunRanks(1, std::chrono::seconds(120), [](int rank) {
    std::unique_ptr<Communicator> bootstrap = NewSingleProcessCommunicator();
    NcclOptions o;
    o.device = 0;
    o.timeout = std::chrono::seconds(60);
    auto comm = NewNcclCommunicator(bootstrap.get(), o);
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    return comm_testing::ReportInChild(rank, comm_testing::RunConformance(comm->get()));
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// One rank per GPU (NCCL refuses two ranks of one communicator on one device).
TEST(Nccl, OneRankPerGpuPassesConformance) {
  const int n = std::min(DeviceCount(), 4);
  if (n < 2) GTEST_SKIP() << "needs 2 or more CUDA devices, found " << n;
  const std::string store = "file://" + comm_testing::MakeTempDir("nccl-");
  auto outcomes = RunRanks(n, std::chrono::seconds(120), [&](int rank) {
    auto bootstrap = NewGlooCommunicator(gloo_testing::Loopback(rank, n, store));
    if (!bootstrap.ok()) return comm_testing::ReportInChild(rank, bootstrap.status());
    NcclOptions o;
    o.device = rank;
    o.timeout = std::chrono::seconds(60);
    auto comm = NewNcclCommunicator(bootstrap->get(), o);
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    return comm_testing::ReportInChild(rank, comm_testing::RunConformance(comm->get()));
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

}  // namespace
}  // namespace distckpt

#else  // !DISTCKPT_WITH_CUDA

TEST(Nccl, NotBuilt) { GTEST_SKIP() << "built without CUDA; bazel test --config=cuda builds and runs the NCCL backend"; }

#endif  // DISTCKPT_WITH_CUDA
