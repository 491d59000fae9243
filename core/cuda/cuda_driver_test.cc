#include "core/cuda/cuda_driver.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include "core/cuda/copy_engine.h"

namespace distckpt {
namespace {

bool DriverPresent() {
  void* h = ::dlopen(cuda::CudaDriverLibraryName().c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return false;
  ::dlclose(h);
  return true;
}

TEST(CudaDriverTest, MissingDriverIsUnsupportedNamingLibcuda) {
  if (DriverPresent()) GTEST_SKIP() << "libcuda.so.1 is present on this machine";
  auto d = cuda::LoadCudaDriver();
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(d.status().message().find("libcuda.so.1 not found"), std::string::npos) << d.status().message();
  // Every later use reports the same thing, without trying again.
  auto e = DefaultCopyEngine(MemoryKind::kCuda);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kUnsupported);
  Status c = CheckDeviceBuffer(MemoryLocation{MemoryKind::kCuda, 0, nullptr}, reinterpret_cast<void*>(0x1000));
  EXPECT_EQ(c.code(), StatusCode::kUnsupported);
  EXPECT_NE(c.message().find("libcuda.so.1"), std::string::npos);
}

TEST(CudaDriverTest, HostMemoryNeedsNoDriver) {
  int x = 0;
  EXPECT_TRUE(CheckDeviceBuffer(MemoryLocation{}, &x).ok());
  EXPECT_TRUE(DefaultCopyEngine(MemoryKind::kHost).ok());
}

TEST(CudaDriverTest, PresentDriverLoads) {
  if (!DriverPresent()) GTEST_SKIP() << "no libcuda.so.1 on this machine";
  auto d = cuda::LoadCudaDriver();
  if (!d.ok() && d.status().message().find("cuInit failed") != std::string::npos) {
    GTEST_SKIP() << d.status().message();  // a driver without a usable GPU (a container without devices)
  }
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_TRUE(DefaultCopyEngine(MemoryKind::kCuda).ok());
}

}  // namespace
}  // namespace distckpt
