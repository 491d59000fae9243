#include "core/comm/gloo/gloo_test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>
#include <vector>

namespace distckpt {
namespace gloo_testing {

GlooOptions Loopback(int rank, int n, const std::string& rendezvous, std::chrono::milliseconds timeout,
                     const std::string& prefix) {
  GlooOptions o;
  o.rank = rank;
  o.world_size = n;
  o.rendezvous = rendezvous;
  o.prefix = prefix;
  o.hostname = "127.0.0.1";
  o.timeout = timeout;
  return o;
}

int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

namespace {

std::string FindRedisServer() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    size_t start = 0;
    while (start <= p.size()) {
      size_t end = p.find(':', start);
      if (end == std::string::npos) end = p.size();
      if (end > start) dirs.push_back(p.substr(start, end - start));
      start = end + 1;
    }
  }
  // Bazel's strict test environment has a short PATH; the Debian package installs here.
  for (const char* d : {"/usr/bin", "/usr/sbin", "/usr/local/bin"}) dirs.push_back(d);
  for (const std::string& d : dirs) {
    std::string candidate = d + "/redis-server";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

bool Accepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

std::string RedisServer::Start() {
  const std::string binary = FindRedisServer();
  if (binary.empty()) return "redis-server is not installed (Debian package redis-server); skipping the Redis tests";
  for (int attempt = 0; attempt < 3; ++attempt) {
    port_ = FreeLoopbackPort();
    const std::string port = std::to_string(port_);
    pid_ = fork();
    if (pid_ < 0) return "fork failed";
    if (pid_ == 0) {
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, 1);
      execl(binary.c_str(), binary.c_str(), "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning", static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 250; ++i) {  // Up to 5 s.
      if (Accepts(port_)) return "";
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {  // Exited: the port was taken after all; try another.
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Stop();
  }
  return "redis-server did not start on a loopback port";
}

void RedisServer::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

}  // namespace gloo_testing
}  // namespace distckpt
