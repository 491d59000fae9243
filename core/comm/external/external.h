// The external backend: the host application (torch.distributed, mpi4py, a JAX client, a custom trainer) supplies
// its own collectives as C callbacks, and distckpt layers its variable-size collectives on top of them.
//
// The callbacks are fixed-size byte collectives; the C ABI's dckpt_comm_callbacks mirrors ExternalCallbacks field
// for field. How the layering works, so a host can size its buffers:
//   AllGather  one allgather of a 24-byte header (sequence number, collective, size) from every rank, then, unless
//              every contribution is empty, one allgather of every contribution padded to the largest one: each rank
//              receives size x max bytes.
//   Gather     the same as AllGather (the host has no gather callback); non-roots drop the result.
//   Broadcast  a broadcast of the 24-byte header from the root, then of the payload (skipped when it is empty).
//   Barrier    the barrier callback, or an allgather of one byte when it is NULL.
// The header lets every rank check that all ranks are in the same collective; a mismatch fails with
// kInvalidArgument instead of silently exchanging the wrong data.
#ifndef DISTCKPT_CORE_COMM_EXTERNAL_EXTERNAL_H_
#define DISTCKPT_CORE_COMM_EXTERNAL_EXTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/base/status.h"
#include "core/comm/communicator.h"

namespace distckpt {

/// Collectives supplied by the host. Each callback returns 0 on success; any other value aborts the distckpt
/// operation with kUser ("external allgather callback returned 3"), and the communicator then refuses further calls.
/// `timeout_ms` is what is left of the distckpt call's timeout, at least 1; the host should honour it. Callbacks are
/// called from the thread that called the collective, one at a time.
struct ExternalCallbacks {
  int rank = 0;  ///< This rank, in [0, size).
  int size = 1;  ///< Number of ranks.
  /// Every rank passes `send_size` bytes (the same on every rank for one call); `recv` has room for size * send_size
  /// bytes and receives every rank's bytes in rank order. Required.
  int (*allgather)(const void* send, size_t send_size, void* recv, uint64_t timeout_ms, void* user_data) = nullptr;
  /// `buf` holds `size` bytes: root's are sent, every other rank's are overwritten. Required.
  int (*broadcast)(void* buf, size_t size, int root, uint64_t timeout_ms, void* user_data) = nullptr;
  /// Optional: NULL means an allgather of one byte.
  int (*barrier)(uint64_t timeout_ms, void* user_data) = nullptr;
  void* user_data = nullptr;  ///< Passed to every callback; must stay valid as long as the communicator.
};

/// Wraps the host's callbacks. Fails with kInvalidArgument when rank/size are out of range or a required callback is
/// NULL. Not thread-safe: one collective at a time.
Result<std::unique_ptr<Communicator>> NewExternalCommunicator(const ExternalCallbacks& callbacks);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_EXTERNAL_EXTERNAL_H_
