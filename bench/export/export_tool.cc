// Runs the core's safetensors exporter once and prints one line of figures: what export_bench.py measures without a
// Python interpreter around it.
//   export_tool --ckpt DIR --out DIR [--shard BYTES] [--buffer BYTES] [--threads N] [--no-verify]
//               [--rank R --world N --rendezvous file:///dir]   (collective over Gloo on loopback)
// Prints: EXPORT_STATS seconds=S bytes=B files=F maxrss_kib=K rank=R
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "core/comm/gloo/gloo.h"
#include "core/tools/safetensors_export.h"

int main(int argc, char** argv) {
  using namespace distckpt;
  std::string ckpt, out, rendezvous;
  SafetensorsExportOptions o;
  int rank = 0, world = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ckpt") {
      ckpt = next();
    } else if (a == "--out") {
      out = next();
    } else if (a == "--shard") {
      o.max_shard_bytes = std::stoull(next());
    } else if (a == "--buffer") {
      o.buffer_bytes = std::stoull(next());
    } else if (a == "--threads") {
      o.io_threads = std::stoul(next());
    } else if (a == "--no-verify") {
      o.verify = false;
    } else if (a == "--rank") {
      rank = std::stoi(next());
    } else if (a == "--world") {
      world = std::stoi(next());
    } else if (a == "--rendezvous") {
      rendezvous = next();
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  std::unique_ptr<Communicator> comm;
  if (world > 1) {
    GlooOptions g;
    g.rank = rank;
    g.world_size = world;
    g.rendezvous = rendezvous;
    g.hostname = "127.0.0.1";
    auto c = NewGlooCommunicator(g);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      return 1;
    }
    comm = std::move(*c);
    o.comm = comm.get();
    if (Status st = comm->Barrier(std::chrono::minutes(5)); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ExportSafetensors(ckpt, out, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    return 1;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  std::printf("EXPORT_STATS seconds=%.4f bytes=%llu files=%zu maxrss_kib=%ld rank=%d user_s=%.3f sys_s=%.3f\n", s,
              static_cast<unsigned long long>(r->bytes_written_here), r->files_written_here, ru.ru_maxrss, rank,
              ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6, ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
  return 0;
}
