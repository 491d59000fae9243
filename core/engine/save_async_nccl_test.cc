// An asynchronous save over distckpt's NCCL communicator is refused at once, saying why and what to pass instead (its
// collectives would run on the save's background thread, launching NCCL kernels beside the application's own), while
// a synchronous save over it works. The communicator is the real one, over the stand-in NCCL and CUDA driver
// (//core/comm/nccl:libfake_nccl.so, //core/cuda:libfake_cuda.so: a one-rank group needs no GPU).
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/base/testing/temp_dir.h"
#include "core/comm/nccl/nccl.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/engine/save_async.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace {

std::string Runfile(const std::string& package, const std::string& name) {
  const char* dir = std::getenv("TEST_SRCDIR");
  if (dir == nullptr) return "";
  const std::string path = std::string(dir) + "/distckpt/" + package + "/" + name;
  return ::access(path.c_str(), R_OK) == 0 ? path : "";
}

TEST(SaveAsyncOverNccl, IsRefusedSayingWhatToPassInsteadAndSyncSaveWorks) {
  const std::string nccl = Runfile("core/comm/nccl", "libfake_nccl.so");
  const std::string cuda = Runfile("core/cuda", "libfake_cuda.so");
  if (nccl.empty() || cuda.empty()) GTEST_SKIP() << "no runfiles: the stand-in NCCL and driver are not here";
  // Read on the first load, which is below: nothing in this binary loaded NCCL or the driver before.
  setenv("DCKPT_NCCL_LIBRARY", nccl.c_str(), 1);
  setenv("DCKPT_CUDA_DRIVER_LIBRARY", cuda.c_str(), 1);
  void* fake = ::dlopen(nccl.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(fake, nullptr);
  auto collectives = [count = reinterpret_cast<long (*)(const char*)>(::dlsym(fake, "fake_nccl_count"))] {
    return count("ncclAllGather") + count("ncclBroadcast");
  };

  std::unique_ptr<Communicator> bootstrap = NewSingleProcessCommunicator();
  NcclOptions o;
  o.device = 0;
  o.timeout = std::chrono::seconds(30);
  auto comm = NewNcclCommunicator(bootstrap.get(), o);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();

  std::vector<float> w(1000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  State s;
  ASSERT_TRUE(s.AddTensor("w", DType::kF32, {1000}).ok());
  ASSERT_TRUE(s.AddPiece("w", {0}, {1000}, w.data()).ok());
  const std::string dir = testing_util::MakeTempDir();

  const long before = collectives();
  auto f = SaveAsync(dir + "/async", s, comm->get(), SaveOptions{});
  ASSERT_FALSE(f.ok()) << "an asynchronous save over the NCCL communicator was accepted";
  const Status& st = f.status();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.ToString();
  for (const char* says :
       {"asynchronous save of '", "NCCL", "background thread", "deadlock", "Gloo", "save synchronously"}) {
    EXPECT_NE(st.message().find(says), std::string::npos) << "no '" << says << "' in: " << st.message();
  }
  EXPECT_EQ(collectives(), before) << "the refused save ran collectives";
  EXPECT_NE(::access((dir + "/async").c_str(), F_OK), 0) << "the refused save left something at its path";

  // The same communicator, foreground: it works (the refusal did not break it), through NCCL's collectives.
  auto r = Save(dir + "/sync", s, comm->get(), SaveOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(collectives(), before);
  auto reader = Reader::Open(dir + "/sync", nullptr, ReadOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> back(w.size());
  ASSERT_TRUE(
      (*reader)
          ->ReadRegion("w", Box::Whole(std::vector<uint64_t>{1000}).value(), back.data(), back.size() * sizeof(float))
          .ok());
  EXPECT_EQ(back, w);
}

}  // namespace
}  // namespace distckpt
