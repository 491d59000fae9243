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

#include <memory>

#include "core/base/status.h"
#include "core/comm/communicator.h"
#include "core/comm/gloo/gloo_options.h"

namespace distckpt {

/// Joins the group described by `options` (collective: every rank calls it) and returns a connected communicator.
/// Fails with kInvalidArgument for bad options, kIo when the store cannot be used, kExists when this rank's key is
/// already in the store (a prefix in use), kTimeout naming the ranks that never arrived, and kIo/kTimeout naming the
/// peer a connection to failed. The communicator is not thread-safe: one collective at a time. Thread: blocks
/// SIGPIPE in the threads that write to sockets, so a peer that dies cannot kill this process.
Result<std::unique_ptr<Communicator>> NewGlooCommunicator(const GlooOptions& options);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_GLOO_GLOO_H_
