// launch: runs N ranks of a program on this machine over loopback, with a fresh file:// rendezvous.
//   launch -n 4 [--timeout SECONDS] [--rank-offset K --group-size W] -- PROGRAM [ARGS...]
// With --rank-offset/--group-size, this launcher starts ranks K..K+n-1 of a W-rank group whose other ranks run
// elsewhere (another host or network namespace); pass a shared DCKPT_RENDEZVOUS (e.g. redis://host:port).
// Exits 0 if every rank exited 0; otherwise prints each failing rank and exits 1.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/launcher/launcher.h"

int main(int argc, char** argv) {
  distckpt::launcher::LaunchSpec spec;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-n" && i + 1 < argc) spec.world_size = std::atoi(argv[++i]);
    else if (a == "--rank-offset" && i + 1 < argc) spec.rank_offset = std::atoi(argv[++i]);
    else if (a == "--group-size" && i + 1 < argc) spec.group_size = std::atoi(argv[++i]);
    else if (a == "--timeout" && i + 1 < argc) spec.timeout = std::chrono::milliseconds(1000 * std::atol(argv[++i]));
    else if (a == "--") {
      ++i;
      break;
    } else {
      break;
    }
  }
  if (i >= argc || spec.world_size < 1) {
    std::fprintf(stderr, "usage: %s -n N [--timeout SECONDS] -- PROGRAM [ARGS...]\n", argv[0]);
    return 2;
  }
  spec.program = argv[i];
  if (const char* rdzv = std::getenv("DCKPT_RENDEZVOUS")) spec.env["DCKPT_RENDEZVOUS"] = rdzv;
  for (++i; i < argc; ++i) spec.args.push_back(argv[i]);
  auto results = distckpt::launcher::Launch(spec);
  int bad = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].exit_code == 0) continue;
    ++bad;
    std::fprintf(stderr, "launch: rank %zu %s (exit %d, signal %d) after %.1f s\n", r + spec.rank_offset,
                 results[r].timed_out ? "timed out" : "failed", results[r].exit_code, results[r].signal,
                 results[r].seconds);
  }
  return bad ? 1 : 0;
}
