#include "tools/launcher/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/base/testing/temp_dir.h"

namespace distckpt {
namespace launcher {

std::string Runfile(const std::string& rel) {
  const char* src = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(src ? src : ".") + "/" + (ws ? ws : "distckpt") + "/" + rel;
}

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

std::vector<RankResult> Launch(const LaunchSpec& spec) {
  const int n = spec.world_size;
  std::string rendezvous = spec.rendezvous_dir.empty() ? testing_util::MakeTempDir("rdzv-") : spec.rendezvous_dir;
  std::vector<pid_t> pids(n, -1);
  std::vector<RankResult> results(n);
  const auto start = std::chrono::steady_clock::now();

  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv_s{spec.program};
    argv_s.insert(argv_s.end(), spec.args.begin(), spec.args.end());
    if (spec.rank_args) {
      auto extra = spec.rank_args(spec.rank_offset + r);
      argv_s.insert(argv_s.end(), extra.begin(), extra.end());
    }
    std::string log = spec.log_dir.empty() ? "" : spec.log_dir + "/rank-" + std::to_string(r) + ".log";
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      std::abort();
    }
    if (pid == 0) {
      setenv("DCKPT_RANK", std::to_string(spec.rank_offset + r).c_str(), 1);
      setenv("DCKPT_WORLD_SIZE", std::to_string(spec.group_size ? spec.group_size : n).c_str(), 1);
      setenv("DCKPT_RENDEZVOUS", ("file://" + rendezvous).c_str(), 1);
      // The spec's environment (and so an explicit DCKPT_RENDEZVOUS) wins over the defaults above.
      for (const auto& kv : spec.env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
      if (!log.empty()) {
        int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
          dup2(fd, 1);
          dup2(fd, 2);
        }
      }
      std::vector<char*> argv;
      for (auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      std::fprintf(stderr, "exec %s: %s\n", argv[0], std::strerror(errno));
      _exit(127);
    }
    pids[r] = pid;
  }

  // Each launch reaps only its own children (never waitpid(-1)): several launches may run at once in one process,
  // from different threads.
  int remaining = n;
  while (remaining > 0) {
    const auto now = std::chrono::steady_clock::now();
    for (int r = 0; r < n; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      const pid_t pid = waitpid(pids[r], &status, WNOHANG);
      if (pid != pids[r]) continue;
      results[r].seconds = std::chrono::duration<double>(now - start).count();
      if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) results[r].signal = WTERMSIG(status);
      pids[r] = -1;
      --remaining;
    }
    if (remaining == 0) break;
    if (now - start > spec.timeout) {
      for (int r = 0; r < n; ++r) {
        if (pids[r] > 0) {
          results[r].timed_out = true;
          kill(pids[r], SIGKILL);
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!spec.log_dir.empty()) {
    for (int r = 0; r < n; ++r) {
      std::ifstream f(spec.log_dir + "/rank-" + std::to_string(r) + ".log");
      std::stringstream ss;
      ss << f.rdbuf();
      results[r].log = ss.str();
    }
  }
  return results;
}

}  // namespace launcher
}  // namespace distckpt
