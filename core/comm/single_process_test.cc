#include <memory>

#include "core/comm/comm_conformance.h"
#include "core/comm/communicator.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace {

TEST(SingleProcessCommunicator, PassesConformance) {
  std::unique_ptr<Communicator> comm = NewSingleProcessCommunicator();
  Status st = comm_testing::RunConformance(comm.get());
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(SingleProcessCommunicator, PassesConformanceInAChildProcess) {
  auto outcomes = comm_testing::RunRanks(1, std::chrono::seconds(30), [](int rank) {
    std::unique_ptr<Communicator> comm = NewSingleProcessCommunicator();
    return comm_testing::ReportInChild(rank, comm_testing::RunConformance(comm.get()));
  });
  EXPECT_TRUE(comm_testing::AllExitedZero(outcomes)) << comm_testing::Describe(outcomes);
}

}  // namespace
}  // namespace distckpt
