// Throughput of Communicator::SendRecv over Gloo on loopback, as the checkpoint manager's replication uses it: two
// forked ranks each send `mib` MiB to the other per round into buffers kept across rounds; beside it the
// communicator's default SendRecv (AllGather + Gathers, what backends without point-to-point get), one Gather and one
// AllGather.
//   bazel run -c opt //bench/manager:exchange_bench -- [mib] [rounds]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "core/base/testing/temp_dir.h"
#include "core/comm/comm_conformance.h"
#include "core/comm/gloo/gloo.h"
#include "core/comm/gloo/gloo_test_util.h"

using namespace distckpt;  // NOLINT

int main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 4;
  const std::string rdv = "file://" + testing_util::MakeTempDir("exchange-bench-");
  auto outcomes = comm_testing::RunRanks(2, std::chrono::seconds(600), [&](int rank) {
    auto comm = NewGlooCommunicator(gloo_testing::Loopback(rank, 2, rdv, std::chrono::seconds(60)));
    if (!comm.ok()) return comm_testing::ReportInChild(rank, comm.status());
    Communicator* c = comm.value().get();
    const std::string payload(mib << 20, static_cast<char>('a' + rank));
    auto seconds = [](auto t0) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    (void)c->Barrier(std::chrono::seconds(60));
    std::string in;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r) {
      Status st = c->SendRecv({{1 - rank, payload}}, {{1 - rank, &in}}, std::chrono::seconds(60));
      if (!st.ok() || in.size() != payload.size()) return comm_testing::ReportInChild(rank, st);
    }
    const double ex = seconds(t0);
    // Into a buffer of the message's size (as the manager receives into a file's mapping): no copy on arrival.
    std::string place(payload.size(), '\0');
    (void)c->Barrier(std::chrono::seconds(60));
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r) {
      Status st =
          c->SendRecvInto({{1 - rank, payload}}, {{1 - rank, place.data(), place.size()}}, std::chrono::seconds(60));
      if (!st.ok()) return comm_testing::ReportInChild(rank, st);
    }
    const double into = seconds(t0);
    // One direction only: rank 0 sends, rank 1 receives into place (a restore's server and requester).
    (void)c->Barrier(std::chrono::seconds(60));
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r) {
      Status st = rank == 0 ? c->SendRecvInto({{1, payload}}, {}, std::chrono::seconds(60))
                            : c->SendRecvInto({}, {{0, place.data(), place.size()}}, std::chrono::seconds(60));
      if (!st.ok()) return comm_testing::ReportInChild(rank, st);
    }
    const double one_way = seconds(t0);
    (void)c->Barrier(std::chrono::seconds(60));
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r) {
      Status st = c->Communicator::SendRecv({{1 - rank, payload}}, {{1 - rank, &in}}, std::chrono::seconds(60));
      if (!st.ok() || in.size() != payload.size()) return comm_testing::ReportInChild(rank, st);
    }
    const double dflt = seconds(t0);
    (void)c->Barrier(std::chrono::seconds(60));
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r) {
      std::vector<std::string> all;
      (void)c->Gather(payload, 0, &all, std::chrono::seconds(60));
    }
    const double ga = seconds(t0);
    (void)c->Barrier(std::chrono::seconds(60));
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r) {
      std::vector<std::string> all;
      (void)c->AllGather(payload, &all, std::chrono::seconds(60));
    }
    const double ag = seconds(t0);
    if (rank == 0) {
      const double gb = static_cast<double>(mib << 20) * rounds / 1e9;
      std::printf("sendrecv (gloo): %d rounds of %llu MiB each way: %.3f s, %.2f GB/s per direction\n", rounds,
                  static_cast<unsigned long long>(mib), ex, gb / ex);
      std::printf("sendrecv_into (gloo, into place): %.3f s, %.2f GB/s per direction\n", into, gb / into);
      std::printf("sendrecv_into one way (rank 0 -> rank 1): %.3f s, %.2f GB/s\n", one_way, gb / one_way);
      std::printf("sendrecv (default, allgather + gathers): %.3f s, %.2f GB/s per direction\n", dflt, gb / dflt);
      std::printf("gather to rank 0 alone: %.3f s, %.2f GB/s\n", ga, gb / ga);
      std::printf("allgather: %.3f s, %.2f GB/s per direction\n", ag, gb / ag);
    }
    return 0;
  });
  return comm_testing::AllExitedZero(outcomes) ? 0 : 1;
}
