// The Gloo backend: byte collectives between processes over TCP (Gloo's point-to-point transport), with the group
// formed through a rendezvous store (a shared directory or a Redis server).
//
// Failure model. Every collective runs against one deadline (its `timeout`). A rank that died (its sockets closed)
// makes the ranks waiting on it fail with kPeer within ~100 ms, even mid-transfer; a rank that stalled or never
// called the collective makes them fail with kTimeout when the deadline passes. Either way the message names the
// rank that was missing, e.g. "gloo: barrier #3 timed out after 2000 ms on rank 0 of 4 waiting for rank 3 (...)".
// A rank only names the peers it waits on: the root and the relays of a broadcast tree, the root of a gather, every
// rank in an allgather or barrier. After any failure the communicator closes its connections (so peers still waiting
// on this rank fail promptly instead of waiting out their own timeouts) and every later call fails fast with kState
// quoting the first error.
//
// Algorithms (each message is a 32-byte header followed by the payload, on a slot unique to the collective):
//   AllGather, Barrier  direct exchange: every rank sends to and receives from every other rank, so every rank
//                       observes a missing peer itself. Bandwidth per rank = its share times (N - 1) out, the total
//                       in; no root bottleneck. O(N^2) messages per call, fine for the control-plane sizes and group
//                       sizes a checkpoint needs (Gloo's full mesh is O(N^2) connections already).
//   Gather              every rank sends to the root; the root receives from all ranks under one deadline.
//   Broadcast           binomial tree rooted at `root` (log2 N steps; the root sends log2 N copies). A relay that
//                       fails forwards its error to its subtree, so ranks below a dead or stalled rank still name it;
//                       relays give up slightly before their children so the forwarded error arrives in time.
//                       Store-and-forward: a relay sends on once it holds the whole payload (no chunk pipelining).
#ifndef DISTCKPT_CORE_COMM_GLOO_GLOO_H_
#define DISTCKPT_CORE_COMM_GLOO_GLOO_H_

#include <chrono>
#include <memory>
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

/// Joins the group described by `options` (collective: every rank calls it) and returns a connected communicator.
/// Fails with kInvalidArgument for bad options, kIo when the store cannot be used, kExists when this rank's key is
/// already in the store (a prefix in use), kTimeout naming the ranks that never arrived, and kIo/kTimeout naming the
/// peer a connection to failed. The communicator is not thread-safe: one collective at a time. Thread: blocks
/// SIGPIPE in the threads that write to sockets, so a peer that dies cannot kill this process.
Result<std::unique_ptr<Communicator>> NewGlooCommunicator(const GlooOptions& options);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_GLOO_GLOO_H_
