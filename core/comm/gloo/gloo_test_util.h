// Helpers for the Gloo tests: loopback options and a real redis-server started on a free port.
#ifndef DISTCKPT_CORE_COMM_GLOO_GLOO_TEST_UTIL_H_
#define DISTCKPT_CORE_COMM_GLOO_GLOO_TEST_UTIL_H_

#include <sys/types.h>

#include <chrono>
#include <string>

#include "core/comm/gloo/gloo_options.h"

namespace distckpt {
namespace gloo_testing {

/// Options for rank `rank` of `n` bound to 127.0.0.1.
GlooOptions Loopback(int rank, int n, const std::string& rendezvous,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
                     const std::string& prefix = "");

/// A loopback TCP port nobody listens on right now.
int FreeLoopbackPort();

/// A redis-server child process on a free loopback port, without persistence. Start it before forking ranks.
class RedisServer {
 public:
  RedisServer() = default;
  ~RedisServer() { Stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  /// Starts the server and waits until it accepts connections. Returns "" on success, else why it could not
  /// (e.g. redis-server is not installed), for GTEST_SKIP.
  std::string Start();
  void Stop();
  std::string uri() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace gloo_testing
}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_GLOO_GLOO_TEST_UTIL_H_
