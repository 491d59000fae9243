// One rank of the fault-injection and crash-consistency suites: saves or loads a reproducible state through the
// engine, with FaultStorage (core/storage/fault) on the rank the faults are meant for. One process, or several ranks
// over Gloo when started by tools/launcher (DCKPT_RANK, DCKPT_WORLD_SIZE, DCKPT_RENDEZVOUS).
//
//   fault_worker --mode save|load|remove --path CKPT [--variant V] [--mb MIB] [--overwrite 1] [--async 1]
//                [--base NAME] [--compression 1] [--faults SPEC --fault-rank R] [--timeout-ms T] [--sync 0]
//
// `remove` removes the checkpoint (RemoveCheckpoint, through the faults); `--base` makes `save` incremental.
//
// The state is test_state.h's, about MIB MiB in all (default 2), saved in 64 KiB checksum blocks; `load` checks every
// value and the bytes entry against the variant. Exit codes: 0 done (and exact, for load); 2 wrong values; 3 an
// error, printed as "rank R: error: <message>".
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/gloo/gloo.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/engine/save_async.h"
#include "core/storage/fault/fault_storage.h"
#include "core/tools/leftovers.h"
#include "tests/faults/test_state.h"

namespace distckpt {
namespace {

int Error(int rank, const Status& st) {
  std::fprintf(stderr, "rank %d: error: %s\n", rank, st.ToString().c_str());
  std::fflush(stderr);
  return 3;
}

int Main(int argc, char** argv) {
  std::string mode, path, faults, base;
  uint64_t variant = 0, mib = 2, timeout_ms = 0;
  int fault_rank = 0;
  bool overwrite = false, async = false, sync = true, compression = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") mode = v;
    else if (k == "--path") path = v;
    else if (k == "--variant") variant = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--mb") mib = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--overwrite") overwrite = v == "1";
    else if (k == "--async") async = v == "1";
    else if (k == "--sync") sync = v != "0";
    else if (k == "--faults") faults = v;
    else if (k == "--base") base = v;
    else if (k == "--compression") compression = v == "1";
    else if (k == "--fault-rank") fault_rank = std::atoi(v.c_str());
    else if (k == "--timeout-ms") timeout_ms = std::strtoull(v.c_str(), nullptr, 10);
  }
  if ((mode != "save" && mode != "load" && mode != "remove") || path.empty()) {
    std::fprintf(stderr, "usage: %s --mode save|load|remove --path CKPT [options]\n", argv[0]);
    return 64;
  }
  const char* world_env = std::getenv("DCKPT_WORLD_SIZE");
  std::unique_ptr<Communicator> comm;
  int rank = 0, world = 1;
  if (world_env != nullptr && std::atoi(world_env) > 1) {
    GlooOptions go;
    if (timeout_ms) go.timeout = std::chrono::milliseconds(timeout_ms);
    auto env = GlooOptionsFromEnv(go);
    if (!env.ok()) return Error(-1, env.status());
    auto made = NewGlooCommunicator(*env);
    if (!made.ok()) return Error(-1, made.status());
    comm = std::move(made).value();
    rank = comm->rank();
    world = comm->size();
  }
  std::unique_ptr<FaultStorage> fault_storage;
  if (!faults.empty() && rank == fault_rank) {
    auto rules = ParseFaultRules(faults);
    if (!rules.ok()) return Error(rank, rules.status());
    fault_storage = std::make_unique<FaultStorage>(DefaultStorage(), std::move(rules).value());
  }
  const std::chrono::milliseconds timeout =
      timeout_ms ? std::chrono::milliseconds(timeout_ms) : kDefaultCollectiveTimeout;
  if (mode == "remove") {
    Status removed =
        RemoveCheckpoint(fault_storage ? static_cast<Storage*>(fault_storage.get()) : DefaultStorage(), path);
    if (!removed.ok()) return Error(rank, removed);
    std::printf("rank %d: removed\n", rank);
    return 0;
  }
  testing_util::TestState state(mode == "save", rank, world, variant, mib);
  if (!state.status().ok()) return Error(rank, state.status());

  if (mode == "save") {
    SaveOptions so;
    so.overwrite = overwrite;
    so.sync = sync;
    so.timeout = timeout;
    so.checksum_block_size = 64 << 10;
    so.storage = fault_storage.get();
    so.base = base;
    if (compression) so.compression = Codec::kZstdGrouped;
    if (async) {
      auto future = SaveAsync(path, state.state(), comm.get(), so);
      if (!future.ok()) return Error(rank, future.status());
      state.DropBuffers();  // the caller's memory is free once SaveAsync returns
      auto done = (*future)->Wait(std::chrono::hours(1));
      if (!done.ok()) return Error(rank, done.status());
    } else {
      auto done = Save(path, state.state(), comm.get(), so);
      if (!done.ok()) return Error(rank, done.status());
    }
    std::printf("rank %d: saved\n", rank);
    // How many storage operations the save took here: the crash suite kills saves at each of them.
    if (fault_storage)
      std::printf("rank %d: operations: %llu\n", rank, static_cast<unsigned long long>(fault_storage->operations()));
    return 0;
  }
  ReadOptions ro;
  ro.timeout = timeout;
  ro.storage = fault_storage.get();
  auto loaded = Load(path, state.state(), comm.get(), ro);
  if (!loaded.ok()) return Error(rank, loaded.status());
  const std::string wrong = state.Mismatch();
  if (!wrong.empty()) {
    std::fprintf(stderr, "rank %d: WRONG: %s\n", rank, wrong.c_str());
    return 2;
  }
  std::printf("rank %d: loaded exactly\n", rank);
  return 0;
}

}  // namespace
}  // namespace distckpt

int main(int argc, char** argv) { return distckpt::Main(argc, argv); }
