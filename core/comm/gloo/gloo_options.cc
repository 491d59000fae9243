// The Gloo options without Gloo: the rendezvous URI, the environment, and the checks (gloo_options.h).
#include "core/comm/gloo/gloo_options.h"

#include <errno.h>

#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <string>

namespace distckpt {
namespace internal_gloo {

Result<Target> ParseRendezvous(const std::string& uri) {
  const std::string expected = "expected file:///shared/dir or redis://host:port";
  Target t;
  if (uri.rfind("file://", 0) == 0) {
    t.kind = Target::kFile;
    t.path = uri.substr(7);
    if (t.path.empty() || t.path[0] != '/') {
      return InvalidArgument("gloo: rendezvous '" + uri + "' must name an absolute directory (" + expected + ")");
    }
    return t;
  }
  if (uri.rfind("redis://", 0) == 0) {
    t.kind = Target::kRedis;
    std::string rest = uri.substr(8);
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    std::string port;
    if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
      size_t close = rest.find(']');
      if (close == std::string::npos) return InvalidArgument("gloo: rendezvous '" + uri + "': unclosed '['");
      t.host = rest.substr(1, close - 1);
      if (close + 1 < rest.size()) {
        if (rest[close + 1] != ':') return InvalidArgument("gloo: rendezvous '" + uri + "': " + expected);
        port = rest.substr(close + 2);
      }
    } else {
      size_t colon = rest.rfind(':');
      t.host = rest.substr(0, colon);
      if (colon != std::string::npos) port = rest.substr(colon + 1);
    }
    if (t.host.empty()) return InvalidArgument("gloo: rendezvous '" + uri + "' names no host (" + expected + ")");
    if (!port.empty()) {
      char* end = nullptr;
      errno = 0;
      long v = std::strtol(port.c_str(), &end, 10);
      if (errno != 0 || *end != '\0' || v < 1 || v > 65535) {
        return InvalidArgument("gloo: rendezvous '" + uri + "': port '" + port + "' is not in 1..65535");
      }
      t.port = static_cast<int>(v);
    }
    return t;
  }
  return InvalidArgument("gloo: unsupported rendezvous '" + uri + "' (" + expected + ")");
}

namespace {

// Environment parsing.

Result<long long> ParseEnvInt(const char* var, const char* value, long long min, long long max) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < min || v > max) {
    return InvalidArgument(std::string("gloo: environment variable ") + var + "='" + value + "' is not an integer in " +
                           std::to_string(min) + ".." + std::to_string(max));
  }
  return v;
}

// The first of `vars` that is set (and not empty), or nullptr.
const char* FirstSet(std::initializer_list<const char*> vars, const char** which) {
  for (const char* v : vars) {
    const char* value = std::getenv(v);
    if (value != nullptr && value[0] != '\0') {
      *which = v;
      return value;
    }
  }
  return nullptr;
}

}  // namespace
}  // namespace internal_gloo

Result<GlooOptions> GlooOptionsFromEnv(GlooOptions o) {
  using internal_gloo::FirstSet;
  using internal_gloo::ParseEnvInt;
  const char* var = nullptr;
  if (o.rank < 0) {
    const char* v = FirstSet({"DCKPT_RANK", "RANK"}, &var);
    if (v == nullptr) {
      return InvalidArgument(
          "gloo: the rank is not set: set GlooOptions::rank or the environment variable "
          "DCKPT_RANK (or RANK)");
    }
    DCKPT_ASSIGN_OR_RETURN(long long r, ParseEnvInt(var, v, 0, INT_MAX - 1));
    o.rank = static_cast<int>(r);
  }
  if (o.world_size < 0) {
    const char* v = FirstSet({"DCKPT_WORLD_SIZE", "WORLD_SIZE"}, &var);
    if (v == nullptr) {
      return InvalidArgument(
          "gloo: the world size is not set: set GlooOptions::world_size or the environment "
          "variable DCKPT_WORLD_SIZE (or WORLD_SIZE)");
    }
    DCKPT_ASSIGN_OR_RETURN(long long n, ParseEnvInt(var, v, 1, INT_MAX));
    o.world_size = static_cast<int>(n);
  }
  if (o.rendezvous.empty()) {
    const char* v = FirstSet({"DCKPT_RENDEZVOUS"}, &var);
    if (v == nullptr) {
      return InvalidArgument(
          "gloo: no rendezvous: set GlooOptions::rendezvous or the environment variable "
          "DCKPT_RENDEZVOUS (file:///shared/dir or redis://host:port)");
    }
    o.rendezvous = v;
  }
  if (o.iface.empty()) {
    if (const char* v = FirstSet({"DCKPT_GLOO_IFACE"}, &var)) o.iface = v;
  }
  if (o.hostname.empty()) {
    if (const char* v = FirstSet({"DCKPT_GLOO_HOSTNAME"}, &var)) o.hostname = v;
  }
  if (o.timeout == kDefaultCollectiveTimeout || o.timeout.count() <= 0) {
    o.timeout = kDefaultCollectiveTimeout;
    if (const char* v = FirstSet({"DCKPT_TIMEOUT_MS"}, &var)) {
      DCKPT_ASSIGN_OR_RETURN(long long ms, ParseEnvInt(var, v, 1, 1000LL * 60 * 60 * 24 * 365));
      o.timeout = std::chrono::milliseconds(ms);
    }
  }
  return o;
}

Status CheckGlooOptions(const GlooOptions& options) {
  if (options.world_size < 1) {
    return InvalidArgument("gloo: world size " + std::to_string(options.world_size) + " is not positive");
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgument("gloo: rank " + std::to_string(options.rank) + " is not in [0, " +
                           std::to_string(options.world_size) + ")");
  }
  if (options.timeout.count() <= 0) {
    return InvalidArgument("gloo: the rendezvous timeout must be positive, not " +
                           std::to_string(options.timeout.count()) + " ms");
  }
  return internal_gloo::ParseRendezvous(options.rendezvous).status();
}

}  // namespace distckpt
