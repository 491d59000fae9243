// The NCCL communicator: kUnsupported naming what is missing (everywhere), and the conformance suite where GPUs are
// usable. Built twice from this file: nccl_test bootstraps multi-rank groups through files in a temporary directory
// and needs nothing but libc and libstdc++ at run time (copy the binary to a GPU machine and run it, see README.md);
// nccl_gloo_test (DCKPT_NCCL_TEST_GLOO) bootstraps them through Gloo on loopback, as applications do.
#include "core/comm/nccl/nccl.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/temp_dir.h"
#include "core/comm/comm_conformance.h"
#ifdef DCKPT_NCCL_TEST_GLOO
#include "core/comm/gloo/gloo.h"
#include "core/comm/gloo/gloo_test_util.h"
#endif
#include "core/comm/nccl/nccl_library.h"
#include "core/cuda/cuda_driver.h"
#include "gtest/gtest.h"

namespace distckpt {
namespace {

using comm_testing::AllExitedZero;
using comm_testing::Describe;
using comm_testing::RunRanks;

constexpr int kSkip = 77;  // a child's exit code for "this machine cannot run the check"

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

#ifdef DCKPT_NCCL_TEST_GLOO
Result<std::unique_ptr<Communicator>> NewBootstrap(int rank, int n, const std::string& dir) {
  return NewGlooCommunicator(gloo_testing::Loopback(rank, n, "file://" + dir));
}
#else
// A bootstrap group for ranks forked from one test process: every collective is an allgather through files in a
// shared directory (each rank writes "<seq>.<rank>" atomically and polls for the others). Enough for
// NewNcclCommunicator, which uses only AllGather, and needs no library beyond libc.
class FileBootstrap final : public Communicator {
 public:
  FileBootstrap(int rank, int size, std::string dir) : rank_(rank), size_(size), dir_(std::move(dir)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "file-bootstrap"; }

  Status AllGather(const std::string& mine, std::vector<std::string>* all, std::chrono::milliseconds timeout) override {
    const std::string prefix = dir_ + "/" + std::to_string(seq_++) + ".";
    const std::string tmp = prefix + std::to_string(rank_) + ".tmp";
    WriteFile(tmp, mine);
    if (::rename(tmp.c_str(), (prefix + std::to_string(rank_)).c_str()) != 0) return IoError("rename " + tmp);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    all->assign(size_, std::string());
    for (int r = 0; r < size_; ++r) {
      const std::string path = prefix + std::to_string(r);
      while (::access(path.c_str(), F_OK) != 0) {
        if (std::chrono::steady_clock::now() >= deadline) {
          return TimeoutError("file-bootstrap: rank " + std::to_string(r) + " did not arrive");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      (*all)[r] = testing_util::ReadFileToString(path);
    }
    return OkStatus();
  }
  Status Gather(const std::string& mine, int root, std::vector<std::string>* all,
                std::chrono::milliseconds timeout) override {
    std::vector<std::string> got;
    DCKPT_RETURN_IF_ERROR(AllGather(mine, &got, timeout));
    if (rank_ == root) *all = std::move(got);
    return OkStatus();
  }
  Status Broadcast(std::string* data, int root, std::chrono::milliseconds timeout) override {
    std::vector<std::string> got;
    DCKPT_RETURN_IF_ERROR(AllGather(rank_ == root ? *data : std::string(), &got, timeout));
    *data = got[root];
    return OkStatus();
  }
  Status Barrier(std::chrono::milliseconds timeout) override {
    std::vector<std::string> got;
    return AllGather(std::string(), &got, timeout);
  }

 private:
  const int rank_, size_;
  const std::string dir_;
  uint64_t seq_ = 0;
};

Result<std::unique_ptr<Communicator>> NewBootstrap(int rank, int n, const std::string& dir) {
  return std::unique_ptr<Communicator>(new FileBootstrap(rank, n, dir));
}
#endif

// How many GPUs the NCCL communicator can use here, and if none, why. CUDA does not survive fork(), so the test
// process itself never touches CUDA (nor NCCL): a child loads NCCL and the driver and counts the devices.
struct Gpus {
  int count = 0;
  std::string why_not;
};

Gpus UsableGpus() {
  const std::string file = testing_util::MakeTempDir("nccl-probe-") + "/gpus";
  auto outcomes = RunRanks(1, std::chrono::seconds(60), [&](int) {
    auto n = nccl::LoadNcclLibrary();
    if (!n.ok()) {
      WriteFile(file, "0 " + n.status().message());
      return 0;
    }
    auto d = cuda::LoadCudaDriver();
    if (!d.ok()) {
      WriteFile(file, "0 " + d.status().message());
      return 0;
    }
    int count = 0;
    Status st = (*d)->Check((*d)->cuDeviceGetCount(&count), "cuDeviceGetCount");
    WriteFile(file, st.ok() ? std::to_string(count) + " no CUDA device is visible" : "0 " + st.message());
    return 0;
  });
  Gpus out;
  if (!AllExitedZero(outcomes)) {
    out.why_not = "the probe failed: " + Describe(outcomes);
    return out;
  }
  std::istringstream in(testing_util::ReadFileToString(file));
  in >> out.count;
  std::getline(in >> std::ws, out.why_not);
  return out;
}

// In a child: NewNcclCommunicator over a single-process bootstrap, with `env` set first (the loaders read their
// variables once, on the first load). Exits 0 if it fails with kUnsupported and a message containing `expect`.
int ExpectUnsupported(int rank, const std::string& env, const std::string& value, const std::string& expect) {
  if (!env.empty()) setenv(env.c_str(), value.c_str(), 1);
  std::unique_ptr<Communicator> bootstrap = NewSingleProcessCommunicator();
  NcclOptions o;
  o.timeout = std::chrono::seconds(30);
  auto comm = NewNcclCommunicator(bootstrap.get(), o);
  if (comm.ok()) {
    std::fprintf(stderr, "[rank %d] NewNcclCommunicator succeeded; expected kUnsupported naming %s\n", rank,
                 expect.c_str());
    return 1;
  }
  std::fprintf(stderr, "[rank %d] %s\n", rank, comm.status().ToString().c_str());
  if (comm.status().message().find("libnccl.so.2 not found") != std::string::npos &&
      expect.find("libnccl") == std::string::npos) {
    return kSkip;  // no NCCL here: the driver is never reached
  }
  if (comm.status().code() != StatusCode::kUnsupported) return 2;
  if (comm.status().message().find(expect) == std::string::npos) return 4;
  return 0;
}

TEST(Nccl, MissingNcclIsUnsupportedNamingTheLibrary) {
  const std::string lib = "/nonexistent/dir/libnccl.so.2";
  auto outcomes = RunRanks(1, std::chrono::seconds(60), [&](int rank) {
    return ExpectUnsupported(rank, "DCKPT_NCCL_LIBRARY", lib, lib + " not found");
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(Nccl, MissingDriverIsUnsupportedNamingLibcuda) {
  // Deterministic on machines with and without a driver: the override names a driver that is not there.
  const std::string lib = "/nonexistent/dir/libcuda.so.1";
  auto outcomes = RunRanks(1, std::chrono::seconds(60), [&](int rank) {
    return ExpectUnsupported(rank, "DCKPT_CUDA_DRIVER_LIBRARY", lib, lib + " not found");
  });
  if (outcomes[0].exit_code == kSkip) GTEST_SKIP() << "libnccl.so.2 cannot be loaded here; the driver is not reached";
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// A stand-in built beside the test (`package`/`name` in the runfiles: testdata/fake_nccl.cc for libnccl.so.2,
// core/cuda/testdata/fake_cuda.cc for libcuda.so.1), or "" where the test runs without its runfiles (copied to
// another machine).
std::string Runfile(const std::string& package, const std::string& name) {
  const char* dir = std::getenv("TEST_SRCDIR");
  if (dir == nullptr) return "";
  const std::string path = std::string(dir) + "/distckpt/" + package + "/" + name;
  return ::access(path.c_str(), R_OK) == 0 ? path : "";
}
std::string FakeNccl(const std::string& name) { return Runfile("core/comm/nccl", name); }

// Defect: with device -1 and no current context every rank took GPU 0 (and NCCL failed on duplicate GPUs). Through
// the stand-in driver (4 GPUs, no context current) and the stand-in NCCL: with LOCAL_RANK the rank takes that GPU
// (and the one-rank communicator is made there); with nothing to go by the call fails saying what to set, taking no
// GPU.
TEST(Nccl, WithoutADeviceOrAContextTheLocalRankPicksTheGpu) {
  const std::string nccl = FakeNccl("libfake_nccl.so");
  const std::string cuda = Runfile("core/cuda", "libfake_cuda.so");
  if (nccl.empty() || cuda.empty()) GTEST_SKIP() << "no runfiles: the stand-in NCCL and driver are not here";
  for (const std::string local_rank : {"2", ""}) {
    auto outcomes = RunRanks(1, std::chrono::seconds(60), [&](int rank) {
      setenv("DCKPT_NCCL_LIBRARY", nccl.c_str(), 1);
      setenv("DCKPT_CUDA_DRIVER_LIBRARY", cuda.c_str(), 1);
      setenv("DCKPT_FAKE_CUDA_DEVICES", "4", 1);
      unsetenv("DCKPT_LOCAL_RANK");
      if (local_rank.empty()) {
        unsetenv("LOCAL_RANK");
      } else {
        setenv("LOCAL_RANK", local_rank.c_str(), 1);
      }
      std::unique_ptr<Communicator> bootstrap = NewSingleProcessCommunicator();
      NcclOptions o;
      o.timeout = std::chrono::seconds(30);
      auto comm = NewNcclCommunicator(bootstrap.get(), o);
      if (comm.ok() == local_rank.empty()) return 5;
      if (!comm.ok()) std::fprintf(stderr, "[rank %d] %s\n", rank, comm.status().ToString().c_str());
      void* lib = ::dlopen(cuda.c_str(), RTLD_NOW | RTLD_LOCAL);
      auto count = lib ? reinterpret_cast<long (*)(const char*)>(::dlsym(lib, "fake_cuda_count")) : nullptr;
      if (count == nullptr) return 6;
      std::fprintf(stderr, "[rank %d] retained: cuda:0 %ld, cuda:2 %ld\n", rank, count("retain:0"), count("retain:2"));
      if (!local_rank.empty()) return count("retain:2") == 1 && count("retain:0") == 0 ? 0 : 3;
      const bool says_what = comm.status().code() == StatusCode::kInvalidArgument &&
                             comm.status().message().find("LOCAL_RANK") != std::string::npos;
      return says_what && count("retain:0") == 0 ? 0 : 4;
    });
    EXPECT_TRUE(AllExitedZero(outcomes)) << "LOCAL_RANK='" << local_rank << "': " << Describe(outcomes);
  }
}

// With a stand-in NCCL the driver is reached on every machine, NCCL installed or not.
TEST(Nccl, MissingDriverAfterNcclLoadsIsUnsupportedNamingLibcuda) {
  const std::string fake = FakeNccl("libfake_nccl.so");
  if (fake.empty()) GTEST_SKIP() << "no runfiles: the stand-in NCCL is not here";
  const std::string lib = "/nonexistent/dir/libcuda.so.1";
  auto outcomes = RunRanks(1, std::chrono::seconds(60), [&](int rank) {
    setenv("DCKPT_NCCL_LIBRARY", fake.c_str(), 1);
    return ExpectUnsupported(rank, "DCKPT_CUDA_DRIVER_LIBRARY", lib, "needs the CUDA driver: " + lib + " not found");
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(Nccl, OldNcclIsUnsupportedNamingTheVersion) {
  const std::string fake = FakeNccl("libfake_nccl_old.so");
  if (fake.empty()) GTEST_SKIP() << "no runfiles: the stand-in NCCL is not here";
  auto outcomes = RunRanks(1, std::chrono::seconds(60), [&](int rank) {
    return ExpectUnsupported(rank, "DCKPT_NCCL_LIBRARY", fake,
                             fake + " is NCCL 2.16.3; the NCCL communicator needs NCCL 2.17.0 or later");
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(Nccl, MissingSymbolIsUnsupportedNamingIt) {
  const std::string fake = FakeNccl("libfake_nccl_partial.so");
  if (fake.empty()) GTEST_SKIP() << "no runfiles: the stand-in NCCL is not here";
  auto outcomes = RunRanks(1, std::chrono::seconds(60), [&](int rank) {
    return ExpectUnsupported(rank, "DCKPT_NCCL_LIBRARY", fake, fake + " has no symbol ncclCommInitRankConfig");
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// ---- Teardown, through the stand-in NCCL and driver (a one-rank communicator) -------------------------------------

// In a forked child: the stand-in NCCL `nccl_name` and the stand-in driver loaded by the communicator, and their
// controls and counters (fake_nccl_*, fake_cuda_*) reached through the same libraries.
struct StandIns {
  void* nccl = nullptr;
  void* cuda = nullptr;
  template <typename F>
  F* Nccl(const char* name) const {
    return reinterpret_cast<F*>(::dlsym(nccl, name));
  }
  long NcclCount(const char* what) const { return Nccl<long(const char*)>("fake_nccl_count")(what); }
  long CudaCount(const char* what) const {
    return reinterpret_cast<long (*)(const char*)>(::dlsym(cuda, "fake_cuda_count"))(what);
  }
  void Control(const char* name, int value) const { Nccl<void(int)>(name)(value); }
};

// Runs `body` in a child over a one-rank NCCL communicator made through the stand-ins (options.timeout = `timeout`).
// The child exits with body's code; 90+ where the setup failed. Skips the test without the runfiles.
std::vector<comm_testing::RankOutcome> WithStandIns(
    const std::string& nccl_name, std::chrono::milliseconds timeout,
    const std::function<int(const StandIns&, std::unique_ptr<Communicator>&)>& body) {
  const std::string nccl = FakeNccl(nccl_name);
  const std::string cuda = Runfile("core/cuda", "libfake_cuda.so");
  return RunRanks(1, std::chrono::seconds(60), [&](int rank) {
    setenv("DCKPT_NCCL_LIBRARY", nccl.c_str(), 1);
    setenv("DCKPT_CUDA_DRIVER_LIBRARY", cuda.c_str(), 1);
    StandIns fakes;
    fakes.nccl = ::dlopen(nccl.c_str(), RTLD_NOW | RTLD_LOCAL);
    fakes.cuda = ::dlopen(cuda.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (fakes.nccl == nullptr || fakes.cuda == nullptr) return 90;
    std::unique_ptr<Communicator> bootstrap = NewSingleProcessCommunicator();
    NcclOptions o;
    o.device = 0;
    o.timeout = timeout;
    auto comm = NewNcclCommunicator(bootstrap.get(), o);
    if (!comm.ok()) {
      (void)comm_testing::ReportInChild(rank, comm.status());
      return 91;
    }
    return body(fakes, *comm);
  });
}
#define DCKPT_NEEDS_STAND_INS()                                                               \
  if (FakeNccl("libfake_nccl.so").empty() || Runfile("core/cuda", "libfake_cuda.so").empty()) \
  GTEST_SKIP() << "no runfiles: the stand-in NCCL and driver are not here"

// Memory and stream handling every teardown must get right: the stream waited for (cuStreamSynchronize) before the
// staging it uses is freed and before it is destroyed, so no queued copy or kernel still uses freed memory.
int CheckStreamSynchronizedBeforeFreeing(const StandIns& fakes) {
  std::fprintf(stderr,
               "cuStreamSynchronize %ld, freed while queued %ld, destroyed while queued %ld, "
               "cuMemFree %ld, cuMemFreeHost %ld, cuStreamDestroy %ld\n",
               fakes.CudaCount("cuStreamSynchronize"), fakes.CudaCount("freed_while_queued"),
               fakes.CudaCount("destroyed_while_queued"), fakes.CudaCount("cuMemFree"),
               fakes.CudaCount("cuMemFreeHost"), fakes.CudaCount("cuStreamDestroy"));
  if (fakes.CudaCount("freed_while_queued") != 0 || fakes.CudaCount("destroyed_while_queued") != 0) return 20;
  if (fakes.CudaCount("cuMemFree") == 0 || fakes.CudaCount("cuMemFreeHost") == 0) return 21;  // staging was made
  if (fakes.CudaCount("cuStreamDestroy") != 1) return 22;
  return 0;
}

int CheckTeardownCalls(const StandIns& fakes, long finalize, long destroy, long abort) {
  std::fprintf(stderr, "ncclCommFinalize %ld, ncclCommDestroy %ld, ncclCommAbort %ld (expected %ld, %ld, %ld)\n",
               fakes.NcclCount("ncclCommFinalize"), fakes.NcclCount("ncclCommDestroy"),
               fakes.NcclCount("ncclCommAbort"), finalize, destroy, abort);
  if (fakes.NcclCount("ncclCommFinalize") != finalize) return 10;
  if (fakes.NcclCount("ncclCommDestroy") != destroy) return 11;
  if (fakes.NcclCount("ncclCommAbort") != abort) return 12;
  return 0;
}

// The communicator itself, end to end over the stand-ins (collectives are copies on its stream), and a healthy
// shutdown: finalized, then destroyed, never aborted (ncclCommAbort is one-sided, and in recent NCCL can block on
// peers). The old destructor aborted every communicator.
TEST(Nccl, HealthyDestroyFinalizesThenDestroysAndNeverAborts) {
  DCKPT_NEEDS_STAND_INS();
  auto outcomes = WithStandIns("libfake_nccl.so", std::chrono::seconds(30), [](const StandIns& fakes, auto& comm) {
    comm_testing::ConformanceOptions co;
    co.timeout = std::chrono::seconds(10);
    if (int rc = comm_testing::ReportInChild(0, comm_testing::RunConformance(comm.get(), co))) return rc;
    if (fakes.NcclCount("ncclAllGather") == 0 || fakes.NcclCount("ncclBroadcast") == 0) return 30;
    comm.reset();
    if (int rc = CheckTeardownCalls(fakes, 1, 1, 0)) return rc;
    return CheckStreamSynchronizedBeforeFreeing(fakes);
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// A peer that never finalizes (it died, or never tears down): destruction gives up at the deadline (the
// communicator's timeout, NcclOptions::timeout) and aborts, instead of waiting for ever.
TEST(Nccl, FinalizeThatNeverCompletesIsAbortedAtTheDeadline) {
  DCKPT_NEEDS_STAND_INS();
  constexpr auto kDeadline = std::chrono::milliseconds(1000);
  auto outcomes = WithStandIns("libfake_nccl.so", kDeadline, [&](const StandIns& fakes, auto& comm) {
    if (int rc = comm_testing::ReportInChild(0, comm->Barrier(std::chrono::seconds(10)))) return rc;
    fakes.Control("fake_nccl_finalize_never_completes", 1);
    const auto start = std::chrono::steady_clock::now();
    comm.reset();
    const auto took = std::chrono::steady_clock::now() - start;
    std::fprintf(stderr, "destruction took %lld ms (deadline %lld ms)\n",
                 static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
                 static_cast<long long>(kDeadline.count()));
    if (took < kDeadline) return 40;  // it gave the peers their time
    if (took > 2 * kDeadline) return 41;
    if (int rc = CheckTeardownCalls(fakes, 1, 0, 1)) return rc;
    return CheckStreamSynchronizedBeforeFreeing(fakes);
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// A finalize that ends in an error (NCCL reports it through ncclCommGetAsyncError): aborted, not destroyed.
TEST(Nccl, FinalizeThatFailsIsAborted) {
  DCKPT_NEEDS_STAND_INS();
  auto outcomes = WithStandIns("libfake_nccl.so", std::chrono::seconds(30), [](const StandIns& fakes, auto& comm) {
    if (int rc = comm_testing::ReportInChild(0, comm->Barrier(std::chrono::seconds(10)))) return rc;
    fakes.Control("fake_nccl_finalize_fails", 6);  // ncclRemoteError
    comm.reset();
    if (int rc = CheckTeardownCalls(fakes, 1, 0, 1)) return rc;
    return CheckStreamSynchronizedBeforeFreeing(fakes);
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// After a failed collective (a peer failed: ncclRemoteError, its kernel still waiting) the ranks may be at different
// steps, so the communicator is aborted without finalizing; the aborted kernel and the copy queued behind it are
// waited for before the staging they use is freed (the old destructor freed it at once).
TEST(Nccl, AfterAFailedCollectiveItIsAbortedAndItsStreamWaitedForBeforeFreeing) {
  DCKPT_NEEDS_STAND_INS();
  auto outcomes = WithStandIns("libfake_nccl.so", std::chrono::seconds(30), [](const StandIns& fakes, auto& comm) {
    if (int rc = comm_testing::ReportInChild(0, comm->Barrier(std::chrono::seconds(10)))) return rc;
    fakes.Control("fake_nccl_collectives_fail", 6);  // ncclRemoteError
    std::vector<std::string> all;
    Status st = comm->AllGather("payload", &all, std::chrono::seconds(10));
    std::fprintf(stderr, "allgather: %s\n", st.ToString().c_str());
    if (st.code() != StatusCode::kPeer) return 50;
    comm.reset();
    if (int rc = CheckTeardownCalls(fakes, 0, 0, 1)) return rc;
    return CheckStreamSynchronizedBeforeFreeing(fakes);
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// A collective whose peer never comes times out and aborts the communicator; destruction then waits for the
// stream (the aborted kernel and the copy behind it) before freeing the staging, and aborts nothing twice.
TEST(Nccl, AfterATimeoutTheStreamIsWaitedForBeforeFreeing) {
  DCKPT_NEEDS_STAND_INS();
  auto outcomes = WithStandIns("libfake_nccl.so", std::chrono::seconds(30), [](const StandIns& fakes, auto& comm) {
    if (int rc = comm_testing::ReportInChild(0, comm->Barrier(std::chrono::seconds(10)))) return rc;
    fakes.Control("fake_nccl_collectives_hang", 1);
    std::vector<std::string> all;
    Status st = comm->AllGather("payload", &all, std::chrono::milliseconds(300));
    std::fprintf(stderr, "allgather: %s\n", st.ToString().c_str());
    if (st.code() != StatusCode::kTimeout) return 50;
    comm.reset();
    if (int rc = CheckTeardownCalls(fakes, 0, 0, 1)) return rc;
    return CheckStreamSynchronizedBeforeFreeing(fakes);
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// A library without ncclCommFinalize/ncclCommDestroy still loads, and its communicators are aborted as before.
TEST(Nccl, WithoutFinalizeInTheLibraryTheCommunicatorIsAborted) {
  DCKPT_NEEDS_STAND_INS();
  if (FakeNccl("libfake_nccl_nofinalize.so").empty()) GTEST_SKIP() << "no runfiles";
  auto outcomes =
      WithStandIns("libfake_nccl_nofinalize.so", std::chrono::seconds(30), [](const StandIns& fakes, auto& comm) {
        if (int rc = comm_testing::ReportInChild(0, comm->Barrier(std::chrono::seconds(10)))) return rc;
        comm.reset();
        if (int rc = CheckTeardownCalls(fakes, 0, 0, 1)) return rc;
        return CheckStreamSynchronizedBeforeFreeing(fakes);
      });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(Nccl, VersionStrings) {
  EXPECT_EQ(nccl::VersionString(22809), "2.28.9");
  EXPECT_EQ(nccl::VersionString(nccl::Version(2, 17, 0)), "2.17.0");
  EXPECT_EQ(nccl::VersionString(2804), "2.8.4");
  EXPECT_EQ(nccl::Version(2, 8, 4), 2804);
}

TEST(Nccl, WithoutAGpuIsUnsupportedNamingWhatIsMissing) {
  Gpus gpus = UsableGpus();
  if (gpus.count > 0) GTEST_SKIP() << gpus.count << " usable GPU(s) here";
  auto outcomes = RunRanks(1, std::chrono::seconds(60), [&](int rank) {
    std::unique_ptr<Communicator> bootstrap = NewSingleProcessCommunicator();
    auto comm = NewNcclCommunicator(bootstrap.get(), NcclOptions());
    if (comm.ok()) return 1;
    const std::string& m = comm.status().message();
    std::fprintf(stderr, "[rank %d] %s\n", rank, comm.status().ToString().c_str());
    if (comm.status().code() != StatusCode::kUnsupported) return 2;
    const bool named = m.find("libcuda.so.1") != std::string::npos || m.find("libnccl.so.2") != std::string::npos ||
                       m.find("no CUDA device") != std::string::npos;
    return named ? 0 : 4;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(Nccl, BadArgumentsAreRejectedBeforeLoadingAnything) {
  auto outcomes = RunRanks(1, std::chrono::seconds(60), [&](int rank) {
    setenv("DCKPT_NCCL_LIBRARY", "/nonexistent/dir/libnccl.so.2", 1);
    auto none = NewNcclCommunicator(nullptr, NcclOptions());
    if (none.ok() || none.status().code() != StatusCode::kInvalidArgument) return 1;
    std::unique_ptr<Communicator> bootstrap = NewSingleProcessCommunicator();
    NcclOptions o;
    o.timeout = std::chrono::milliseconds(0);
    auto zero = NewNcclCommunicator(bootstrap.get(), o);
    if (zero.ok() || zero.status().code() != StatusCode::kInvalidArgument) return 2;
    return 0;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// Two ranks; rank 0 cannot load NCCL (its library does not exist). Rank 1 fails too, at once, not after
// the timeout: with kPeer naming rank 0 where it could run NCCL itself, else with its own kUnsupported.
TEST(Nccl, EveryRankFailsPromptlyWhenOneCannotLoadNccl) {
  const std::string store = testing_util::MakeTempDir("nccl-missing-");
  auto outcomes = RunRanks(2, std::chrono::seconds(60), [&](int rank) {
    if (rank == 0) setenv("DCKPT_NCCL_LIBRARY", "/nonexistent/dir/rank0/libnccl.so.2", 1);
    auto bootstrap = NewBootstrap(rank, 2, store);
    if (!bootstrap.ok()) return comm_testing::ReportInChild(rank, bootstrap.status());
    NcclOptions o;
    o.timeout = std::chrono::seconds(20);
    const auto start = std::chrono::steady_clock::now();
    auto comm = NewNcclCommunicator(bootstrap->get(), o);
    const auto took = std::chrono::steady_clock::now() - start;
    if (comm.ok()) return 1;
    std::fprintf(stderr, "[rank %d] %s\n", rank, comm.status().ToString().c_str());
    const std::string& m = comm.status().message();
    if (rank == 0) {
      if (comm.status().code() != StatusCode::kUnsupported) return 2;
      if (m.find("rank0/libnccl.so.2 not found") == std::string::npos) return 4;
    } else if (comm.status().code() == StatusCode::kPeer) {
      if (m.find("because rank 0 cannot: ") == std::string::npos || m.find("rank0/libnccl.so.2") == std::string::npos)
        return 6;
    } else if (comm.status().code() != StatusCode::kUnsupported) {
      return 7;
    }
    if (took > std::chrono::seconds(10)) return 5;
    return 0;
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

TEST(Nccl, SingleRankPassesConformance) {
  Gpus gpus = UsableGpus();
  if (gpus.count < 1) GTEST_SKIP() << "no usable GPU here (" << gpus.why_not << "); the NCCL backend is only built";
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

// device = -1 with no current context on the thread: device 0.
TEST(Nccl, DefaultDeviceIsTheOnlyGpuWithoutACurrentContext) {
  Gpus gpus = UsableGpus();
  if (gpus.count < 1) GTEST_SKIP() << "no usable GPU here (" << gpus.why_not << ")";
  // With one GPU visible and nothing else to go by, the device is that one; with several, an error saying what to
  // set (WithoutADeviceOrAContextTheLocalRankPicksTheGpu checks that through the stand-ins).
  const int visible = gpus.count;
  auto outcomes = RunRanks(1, std::chrono::seconds(120), [visible](int rank) {
    unsetenv("LOCAL_RANK");
    unsetenv("DCKPT_LOCAL_RANK");
    std::unique_ptr<Communicator> bootstrap = NewSingleProcessCommunicator();
    auto comm = NewNcclCommunicator(bootstrap.get(), NcclOptions());
    if (visible > 1) return comm.ok() || comm.status().code() != StatusCode::kInvalidArgument ? 7 : 0;
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    return comm_testing::ReportInChild(rank, (*comm)->Barrier(std::chrono::seconds(30)));
  });
  EXPECT_TRUE(AllExitedZero(outcomes)) << Describe(outcomes);
}

// One rank per GPU (NCCL refuses two ranks of one communicator on one device).
TEST(Nccl, OneRankPerGpuPassesConformance) {
  Gpus gpus = UsableGpus();
  const int n = std::min(gpus.count, 4);
  if (n < 2) GTEST_SKIP() << "needs 2 or more usable GPUs, found " << n << (n == 0 ? " (" + gpus.why_not + ")" : "");
  const std::string store = testing_util::MakeTempDir("nccl-");
  auto outcomes = RunRanks(n, std::chrono::seconds(120), [&](int rank) {
    auto bootstrap = NewBootstrap(rank, n, store);
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
