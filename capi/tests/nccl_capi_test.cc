// The NCCL communicator through the C ABI only (linked against libdistckpt.so as an application would): options,
// argument checks, and DCKPT_EUNSUPPORTED naming what is missing on a machine without NCCL, a driver or a GPU. Where
// a GPU is usable the single-rank communicator is created and runs a barrier and a broadcast instead.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"

extern char** environ;

namespace {

// A single-rank bootstrap made of external callbacks: the C ABI has no single-process communicator.
int CopyAllGather(const void* send, size_t send_size, void* recv, uint64_t, void*) {
  std::memcpy(recv, send, send_size);
  return 0;
}
int NoBroadcast(void*, size_t, int, uint64_t, void*) { return 0; }

dckpt_comm* SingleRankBootstrap() {
  dckpt_comm_callbacks cb = DCKPT_COMM_CALLBACKS_INIT;
  cb.rank = 0;
  cb.size = 1;
  cb.allgather = CopyAllGather;
  cb.broadcast = NoBroadcast;
  dckpt_comm* comm = nullptr;
  EXPECT_EQ(dckpt_comm_new_external(&comm, &cb), DCKPT_OK) << dckpt_error_last();
  return comm;
}

TEST(NcclCapiTest, OptionsInit) {
  dckpt_nccl_options o;
  std::memset(&o, 0x5a, sizeof(o));
  ASSERT_EQ(dckpt_nccl_options_init(&o, DCKPT_NCCL_OPTIONS_VERSION), DCKPT_OK);
  const dckpt_nccl_options expected = DCKPT_NCCL_OPTIONS_INIT;
  EXPECT_EQ(o.version, expected.version);
  EXPECT_EQ(o.device, -1);
  EXPECT_EQ(o.timeout_ms, 0u);
  EXPECT_EQ(dckpt_nccl_options_init(nullptr, DCKPT_NCCL_OPTIONS_VERSION), DCKPT_EINVAL);
  EXPECT_EQ(dckpt_nccl_options_init(&o, 0), DCKPT_EINVAL);
  EXPECT_EQ(dckpt_nccl_options_init(&o, DCKPT_NCCL_OPTIONS_VERSION + 1), DCKPT_EVERSION);
}

TEST(NcclCapiTest, BadArgumentsAreEinval) {
  dckpt_comm* bootstrap = SingleRankBootstrap();
  ASSERT_NE(bootstrap, nullptr);
  dckpt_comm* comm = reinterpret_cast<dckpt_comm*>(0x1);  // must be reset to NULL on failure
  EXPECT_EQ(dckpt_comm_new_nccl(&comm, nullptr, nullptr), DCKPT_EINVAL);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(dckpt_error_last()).find("bootstrap"), std::string::npos) << dckpt_error_last();
  EXPECT_EQ(dckpt_comm_new_nccl(nullptr, bootstrap, nullptr), DCKPT_EINVAL);

  dckpt_nccl_options o = DCKPT_NCCL_OPTIONS_INIT;
  o.version = 0;
  comm = reinterpret_cast<dckpt_comm*>(0x1);
  EXPECT_EQ(dckpt_comm_new_nccl(&comm, bootstrap, &o), DCKPT_EINVAL);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(dckpt_error_last()).find("dckpt_nccl_options"), std::string::npos) << dckpt_error_last();
  o.version = DCKPT_NCCL_OPTIONS_VERSION + 1;
  EXPECT_EQ(dckpt_comm_new_nccl(&comm, bootstrap, &o), DCKPT_EVERSION);
  o.version = DCKPT_NCCL_OPTIONS_VERSION;
  o.device = -2;
  EXPECT_EQ(dckpt_comm_new_nccl(&comm, bootstrap, &o), DCKPT_EINVAL);
  dckpt_comm_free(bootstrap);
}

// The real environment: on a machine without a usable GPU DCKPT_EUNSUPPORTED naming what is missing; with one, a
// working single-rank communicator.
TEST(NcclCapiTest, WithoutAGpuIsUnsupportedNamingWhatIsMissing) {
  dckpt_comm* bootstrap = SingleRankBootstrap();
  ASSERT_NE(bootstrap, nullptr);
  dckpt_nccl_options o = DCKPT_NCCL_OPTIONS_INIT;
  o.timeout_ms = 60000;
  dckpt_comm* comm = nullptr;
  const int rc = dckpt_comm_new_nccl(&comm, bootstrap, &o);
  dckpt_comm_free(bootstrap);  // used only during the call
  if (rc == DCKPT_OK) {
    int rank = -1, size = -1;
    EXPECT_EQ(dckpt_comm_rank(&rank, comm), DCKPT_OK);
    EXPECT_EQ(dckpt_comm_size(&size, comm), DCKPT_OK);
    EXPECT_EQ(rank, 0);
    EXPECT_EQ(size, 1);
    EXPECT_EQ(dckpt_comm_barrier(comm, 30000), DCKPT_OK) << dckpt_error_last();
    dckpt_comm_free(comm);
    GTEST_SKIP() << "a GPU is usable here: the communicator was created and ran a barrier";
  }
  const std::string message = dckpt_error_last();
  EXPECT_EQ(rc, DCKPT_EUNSUPPORTED) << message;
  EXPECT_EQ(dckpt_error_last_code(), DCKPT_EUNSUPPORTED);
  EXPECT_EQ(comm, nullptr);
  EXPECT_TRUE(message.find("libcuda.so.1") != std::string::npos ||
              message.find("libnccl.so.2") != std::string::npos ||
              message.find("no CUDA device") != std::string::npos)
      << message;
  std::printf("without a GPU: %s\n", message.c_str());
}

// Runs this binary again with `env` added, on the child test below only: the loaders read their variables once per
// process, so the override needs a fresh one. Returns the child's exit status.
int RunChild(const std::vector<std::string>& env) {
  std::vector<std::string> vars = env;
  vars.push_back("DCKPT_NCCL_CAPI_CHILD=1");
  for (char** e = environ; *e != nullptr; ++e) vars.push_back(*e);
  std::vector<char*> envp;
  for (auto& v : vars) envp.push_back(&v[0]);
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", filter = "--gtest_filter=NcclCapiChild.*";
  char* argv[] = {&self[0], &filter[0], nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(NcclCapiTest, MissingNcclLibraryIsUnsupportedNamingIt) {
  EXPECT_EQ(RunChild({"DCKPT_NCCL_LIBRARY=/nonexistent/dir/libnccl.so.2",
                      "DCKPT_NCCL_CAPI_EXPECT=/nonexistent/dir/libnccl.so.2 not found"}),
            0);
}

TEST(NcclCapiTest, MissingDriverIsUnsupportedNamingIt) {
  EXPECT_EQ(RunChild({"DCKPT_CUDA_DRIVER_LIBRARY=/nonexistent/dir/libcuda.so.1",
                      "DCKPT_NCCL_CAPI_EXPECT=/nonexistent/dir/libcuda.so.1 not found",
                      "DCKPT_NCCL_CAPI_SKIP_WITHOUT_NCCL=1"}),
            0);
}

// Runs only inside RunChild's process.
TEST(NcclCapiChild, FailsWithTheExpectedMessage) {
  if (std::getenv("DCKPT_NCCL_CAPI_CHILD") == nullptr) GTEST_SKIP() << "runs in a child of the tests above";
  const std::string expect = std::getenv("DCKPT_NCCL_CAPI_EXPECT");
  dckpt_comm* bootstrap = SingleRankBootstrap();
  ASSERT_NE(bootstrap, nullptr);
  dckpt_comm* comm = nullptr;
  const int rc = dckpt_comm_new_nccl(&comm, bootstrap, nullptr);
  dckpt_comm_free(bootstrap);
  const std::string message = dckpt_error_last();
  std::printf("child: %d %s\n", rc, message.c_str());
  if (std::getenv("DCKPT_NCCL_CAPI_SKIP_WITHOUT_NCCL") != nullptr &&
      message.find("libnccl.so.2 not found") != std::string::npos) {
    GTEST_SKIP() << "no NCCL here: the driver is never reached";
  }
  EXPECT_EQ(rc, DCKPT_EUNSUPPORTED);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(message.find(expect), std::string::npos) << message;
}

}  // namespace
