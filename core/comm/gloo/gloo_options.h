// How a rank joins a Gloo group: the options, filled from the environment and checked. No Gloo here: the core (the
// C ABI) checks the options before it loads the Gloo plugin (plugin_loader.h), so bad options fail the same way with
// or without the plugin, and the plugin (gloo.cc) checks them with the same code.
#ifndef DISTCKPT_CORE_COMM_GLOO_GLOO_OPTIONS_H_
#define DISTCKPT_CORE_COMM_GLOO_GLOO_OPTIONS_H_

#include <chrono>
#include <string>

#include "core/base/status.h"
#include "core/comm/communicator.h"

namespace distckpt {

/// How a rank joins a Gloo group. Every rank of the group uses the same rendezvous, prefix and world size.
struct GlooOptions {
  int rank = -1;        ///< This rank, in [0, world_size).
  int world_size = -1;  ///< Number of ranks in the group.
  /// Where ranks publish their addresses: "file:///shared/dir" (a directory every rank can see; created if
  /// missing) or "redis://host:port" (port defaults to 6379).
  std::string rendezvous;
  /// Namespaces several groups in one store (e.g. a job id plus a restart count). A group removes its keys once
  /// every rank is connected, so a prefix may be reused by a later group, but never by two groups at once.
  std::string prefix;
  std::string iface;     ///< Network interface to bind (e.g. "eth0"). Empty: use `hostname`.
  std::string hostname;  ///< Address or host name to bind. Empty (and no iface): this host's name, as Gloo does.
  /// Limit for forming the group (rendezvous, connecting, a first barrier). Collectives take their own timeout.
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
};

/// Fills the fields of `base` that are unset from the environment and returns the result:
///   rank        (if < 0)       DCKPT_RANK, else RANK
///   world_size  (if < 0)       DCKPT_WORLD_SIZE, else WORLD_SIZE
///   rendezvous  (if empty)     DCKPT_RENDEZVOUS
///   iface       (if empty)     DCKPT_GLOO_IFACE
///   hostname    (if empty)     DCKPT_GLOO_HOSTNAME
///   timeout     (if left at kDefaultCollectiveTimeout, or <= 0)  DCKPT_TIMEOUT_MS, else kDefaultCollectiveTimeout
/// The prefix is never taken from the environment. Fails with kInvalidArgument naming the variable when a required
/// value (rank, world size, rendezvous) is missing or a variable does not parse.
Result<GlooOptions> GlooOptionsFromEnv(GlooOptions base);

/// kInvalidArgument, saying what is wrong, unless the world size is positive, the rank within it, the timeout
/// positive and the rendezvous a URI ParseRendezvous accepts. NewGlooCommunicator checks this first.
Status CheckGlooOptions(const GlooOptions& options);

namespace internal_gloo {

/// Where the ranks meet, parsed from GlooOptions::rendezvous.
struct Target {
  enum Kind { kFile, kRedis } kind = kFile;
  std::string path;  // kFile
  std::string host;  // kRedis
  int port = 6379;   // kRedis
};

/// Parses "file:///abs/dir" or "redis://host[:port]" (IPv6 hosts in brackets); kInvalidArgument naming the URI.
Result<Target> ParseRendezvous(const std::string& uri);

}  // namespace internal_gloo
}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_GLOO_GLOO_OPTIONS_H_
