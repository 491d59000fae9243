// One rank of the multi-host manager test (netns_test.sh), C ABI only. Each "host" is a network namespace with its
// own tier directory.
//
//   manager_worker --mode save --local DIR --node ID --steps N --persistent DIR --ready PREFIX
//       saves steps 1..N (replicas=1, every 2nd step persisted), waits until each is complete, then writes its pid to
//       PREFIX.<rank> and sleeps until killed: the job is running when a host is removed.
//   manager_worker --mode restore --local DIR --node ID --steps N --persistent DIR [--expect-peers 1]
//       restores and checks that step N came back with every value exact and nothing from persistent storage (and,
//       with --expect-peers 1, that this rank's bytes came from peers: its host's tier was empty).
// Rank and world size come from the environment (DCKPT_RANK, DCKPT_WORLD_SIZE, DCKPT_RENDEZVOUS).
// Exit codes: 0 ok, 2 wrong values or a wrong restore, 3 a dckpt call failed (the error is printed).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"

namespace {

constexpr uint64_t kRowsPerRank = 64, kCols = 1024;  // 256 KiB of u32 per rank and step

int g_rank = 0;

uint32_t Value(uint64_t step, uint64_t row, uint64_t col) {
  return static_cast<uint32_t>(step * 1000003u + row * kCols + col);
}

int Fail(const char* what, int rc) {
  std::fprintf(stderr, "rank %d: error: %s: %s (%s)\n", g_rank, what, dckpt_error_last(), dckpt_status_name(rc));
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, local, node, persistent, ready;
  uint64_t steps = 0;
  bool expect_peers = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") mode = v;
    else if (k == "--local") local = v;
    else if (k == "--node") node = v;
    else if (k == "--steps") steps = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--persistent") persistent = v;
    else if (k == "--ready") ready = v;
    else if (k == "--expect-peers") expect_peers = v == "1";
  }
  if ((mode != "save" && mode != "restore") || local.empty() || node.empty() || steps == 0 ||
      (mode == "save" && ready.empty())) {
    std::fprintf(stderr,
                 "usage: %s --mode save|restore --local DIR --node ID --steps N --persistent DIR "
                 "[--ready PREFIX] [--expect-peers 1]\n",
                 argv[0]);
    return 64;
  }
  dckpt_gloo_options gopts;
  dckpt_gloo_options_init(&gopts, DCKPT_GLOO_OPTIONS_VERSION);
  gopts.timeout_ms = 120000;
  dckpt_comm* comm = nullptr;
  int rc = dckpt_comm_new_gloo(&comm, &gopts);
  if (rc != DCKPT_OK) return Fail("dckpt_comm_new_gloo", rc);
  int world = 1;
  dckpt_comm_rank(&g_rank, comm);
  dckpt_comm_size(&world, comm);

  dckpt_manager_options o;
  dckpt_manager_options_init(&o, DCKPT_MANAGER_OPTIONS_VERSION);
  o.local_dir = local.c_str();
  o.node_id = node.c_str();
  o.replicas = 1;
  o.persistent_path = persistent.c_str();
  o.persist_every = 2;
  o.timeout_ms = 120000;
  dckpt_manager* m = nullptr;
  rc = dckpt_manager_new(&m, comm, &o);
  if (rc != DCKPT_OK) return Fail("dckpt_manager_new", rc);

  // Rows [rank * kRowsPerRank, ...) of "w" (u32, world * kRowsPerRank x kCols), and the step as a bytes entry.
  std::vector<uint32_t> w(kRowsPerRank * kCols);
  uint64_t step_value = 0;
  const uint64_t shape[2] = {static_cast<uint64_t>(world) * kRowsPerRank, kCols};
  const uint64_t off[2] = {static_cast<uint64_t>(g_rank) * kRowsPerRank, 0}, len[2] = {kRowsPerRank, kCols};
  dckpt_state* state = nullptr;
  dckpt_state_new(&state);
  std::unique_ptr<dckpt_state, decltype(&dckpt_state_free)> state_owner(state, &dckpt_state_free);
  rc = dckpt_state_add_tensor(state, "w", DCKPT_DTYPE_U32, 2, shape);
  if (rc == DCKPT_OK) rc = dckpt_state_add_piece(state, "w", off, len, w.data());
  if (rc == DCKPT_OK) rc = dckpt_state_add_bytes(state, "step", &step_value, sizeof step_value);
  if (rc != DCKPT_OK) return Fail("building the state", rc);

  if (mode == "save") {
    for (uint64_t s = 1; s <= steps; ++s) {
      for (uint64_t i = 0; i < w.size(); ++i) w[i] = Value(s, off[0] + i / kCols, i % kCols);
      step_value = s;
      rc = dckpt_manager_save(m, s, state, 0);
      if (rc == DCKPT_OK) rc = dckpt_manager_wait(m, DCKPT_WAIT_FOREVER);
      if (rc != DCKPT_OK) return Fail("saving a step", rc);
    }
    uint64_t latest = 0;
    int found = 0;
    dckpt_manager_latest_step(&latest, &found, m);
    if (!found || latest != steps) {
      std::fprintf(stderr, "rank %d: latest complete step %llu, want %llu\n", g_rank,
                   static_cast<unsigned long long>(latest), static_cast<unsigned long long>(steps));
      return 2;
    }
    std::printf("rank %d/%d on %s: saved steps 1..%llu\n", g_rank, world, node.c_str(),
                static_cast<unsigned long long>(steps));
    std::fflush(stdout);
    const std::string path = ready + "." + std::to_string(g_rank);
    FILE* f = std::fopen((path + ".tmp").c_str(), "w");
    if (f == nullptr || std::fprintf(f, "%d\n", static_cast<int>(getpid())) < 0 || std::fclose(f) != 0 ||
        std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
      std::perror(path.c_str());
      return 3;
    }
    for (;;) pause();  // the job runs on until its host is removed (SIGKILL)
  }

  std::fill(w.begin(), w.end(), 0xCDCDCDCDu);
  dckpt_restore_info info = DCKPT_RESTORE_INFO_INIT;
  rc = dckpt_manager_restore(&info, m, state, nullptr);
  const std::string report = dckpt_manager_restore_report(m);
  if (rc != DCKPT_OK) {
    std::fprintf(stderr, "rank %d: restore report:\n%s\n", g_rank, report.c_str());
    return Fail("dckpt_manager_restore", rc);
  }
  int bad = 0;
  if (!info.found || info.step != steps || step_value != steps) {
    std::fprintf(stderr, "rank %d: restored step %llu (bytes entry %llu), want %llu\n", g_rank,
                 static_cast<unsigned long long>(info.step), static_cast<unsigned long long>(step_value),
                 static_cast<unsigned long long>(steps));
    ++bad;
  }
  for (uint64_t i = 0; i < w.size() && !bad; ++i) {
    if (w[i] != Value(steps, off[0] + i / kCols, i % kCols)) {
      std::fprintf(stderr, "rank %d: w[%llu, %llu] = %u, want %u\n", g_rank,
                   static_cast<unsigned long long>(off[0] + i / kCols), static_cast<unsigned long long>(i % kCols),
                   w[i], Value(steps, off[0] + i / kCols, i % kCols));
      ++bad;
    }
  }
  if (info.bytes_from_persistent != 0) {
    std::fprintf(stderr, "rank %d: %llu bytes came from persistent storage, want 0\n", g_rank,
                 static_cast<unsigned long long>(info.bytes_from_persistent));
    ++bad;
  }
  if (expect_peers && (info.bytes_from_peers == 0 || info.tier != DCKPT_TIER_PEER)) {
    std::fprintf(stderr, "rank %d: its host's tier was empty, yet %llu bytes came from peers (tier %d)\n", g_rank,
                 static_cast<unsigned long long>(info.bytes_from_peers), info.tier);
    ++bad;
  }
  std::printf("rank %d/%d on %s: restored step %llu: %llu bytes local, %llu from peers, %llu from persistent\n", g_rank,
              world, node.c_str(), static_cast<unsigned long long>(info.step),
              static_cast<unsigned long long>(info.bytes_local), static_cast<unsigned long long>(info.bytes_from_peers),
              static_cast<unsigned long long>(info.bytes_from_persistent));
  if (bad) std::fprintf(stderr, "rank %d: restore report:\n%s\n", g_rank, report.c_str());
  dckpt_manager_free(m);
  dckpt_comm_free(comm);
  return bad ? 2 : 0;
}
