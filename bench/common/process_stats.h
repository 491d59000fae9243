// Wall clock and memory figures of the current process, shared by the C++ benchmarks.
#ifndef DISTCKPT_BENCH_COMMON_PROCESS_STATS_H_
#define DISTCKPT_BENCH_COMMON_PROCESS_STATS_H_

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace distckpt {
namespace bench {

/// Seconds on the steady clock.
inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Resident set size now, from /proc (ru_maxrss only gives the peak).
inline uint64_t CurrentRssBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<uint64_t>(resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

/// Peak resident set size of the process so far.
inline uint64_t PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

}  // namespace bench
}  // namespace distckpt

#endif  // DISTCKPT_BENCH_COMMON_PROCESS_STATS_H_
