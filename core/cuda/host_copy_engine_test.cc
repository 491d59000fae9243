#include "core/cuda/host_copy_engine.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

namespace distckpt {
namespace {

const MemoryLocation kFakeDevice{MemoryKind::kCuda, 0, nullptr};

TEST(HostCopyEngineTest, CopiesRunInIssueOrderAndFencesReportCompletion) {
  HostCopyEngine engine;
  std::mutex mu;
  std::vector<uint64_t> order;
  engine.set_before_copy([&](uint64_t i) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(i);
    return OkStatus();
  });
  std::vector<std::vector<char>> src(8, std::vector<char>(1000)), dst(8, std::vector<char>(1000, 0));
  std::vector<std::unique_ptr<CopyFence>> fences;
  for (int i = 0; i < 8; ++i) {
    std::fill(src[i].begin(), src[i].end(), char('a' + i));
    fences.push_back(engine.CopyToHostAsync(dst[i].data(), src[i].data(), 1000, kFakeDevice).value());
  }
  for (int i = 7; i >= 0; --i) {
    ASSERT_TRUE(fences[i]->Wait().ok());
    ASSERT_TRUE(fences[i]->Wait().ok()) << "a second Wait returns the same outcome";
    EXPECT_EQ(dst[i], src[i]);
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(engine.copies_issued(), 8u);
}

TEST(HostCopyEngineTest, AnInjectedFailureFailsOnlyThatCopy) {
  HostCopyEngine engine;
  engine.set_before_copy([](uint64_t i) {
    return i == 1 ? Status(StatusCode::kUnknown, "injected copy failure") : OkStatus();
  });
  char src[3][64] = {{1}, {2}, {3}}, dst[3][64] = {};
  std::vector<std::unique_ptr<CopyFence>> fences;
  for (int i = 0; i < 3; ++i) fences.push_back(engine.CopyToHostAsync(dst[i], src[i], 64, kFakeDevice).value());
  EXPECT_TRUE(fences[0]->Wait().ok());
  Status st = fences[1]->Wait();
  EXPECT_EQ(st.code(), StatusCode::kUnknown);
  EXPECT_NE(st.message().find("injected"), std::string::npos);
  EXPECT_EQ(dst[1][0], 0) << "a failed copy writes nothing";
  EXPECT_TRUE(fences[2]->Wait().ok());
  EXPECT_EQ(dst[2][0], 3);
}

}  // namespace
}  // namespace distckpt
