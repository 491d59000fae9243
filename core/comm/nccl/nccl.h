// The NCCL backend (CUDA build only: bazel build --config=cuda). Byte collectives run as NCCL collectives on device
// buffers, staged through pinned host memory, on a stream of the communicator's own. The default build compiles
// this header to nothing, so nothing outside the CUDA build depends on CUDA.
//
// Layering, as in the external backend: AllGather and Gather allgather a 24-byte header (sequence, collective,
// root, size) and then the contributions padded to the largest one; Broadcast broadcasts the header then the payload;
// Barrier is the header allgather alone. The header catches ranks that are in different collectives.
//
// Timeouts. The communicator is created non-blocking; every call polls NCCL and the stream (sleeping between polls)
// until its deadline, and on expiry aborts the communicator (ncclCommAbort), which unblocks the device work. NCCL
// cannot tell which rank is missing, so a timeout names only this rank; use the Gloo backend (or a Gloo barrier
// before NCCL work) where naming the culprit matters. After any failure every later call fails fast with kState.
#ifndef DISTCKPT_CORE_COMM_NCCL_NCCL_H_
#define DISTCKPT_CORE_COMM_NCCL_NCCL_H_

#ifdef DISTCKPT_WITH_CUDA

#include <chrono>
#include <memory>

#include "core/base/status.h"
#include "core/comm/communicator.h"

namespace distckpt {

struct NcclOptions {
  int device = -1;  ///< CUDA device of this rank; -1 keeps the calling thread's current device.
  /// Limit for creating the communicator (the unique id broadcast and NCCL's own initialisation).
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
};

/// Creates an NCCL communicator over the ranks of `bootstrap` (collective over `bootstrap`, e.g. a Gloo group, which
/// is used only during this call to broadcast rank 0's ncclUniqueId). One rank per GPU. Not thread-safe: one
/// collective at a time; each call makes the communicator's device current on the calling thread.
Result<std::unique_ptr<Communicator>> NewNcclCommunicator(Communicator* bootstrap, const NcclOptions& options);

}  // namespace distckpt

#endif  // DISTCKPT_WITH_CUDA

#endif  // DISTCKPT_CORE_COMM_NCCL_NCCL_H_
