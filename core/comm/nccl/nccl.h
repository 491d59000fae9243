// The NCCL backend. Built in every build and linked against nothing from CUDA: NCCL (libnccl.so.2) and the CUDA
// driver (libcuda.so.1) are loaded with dlopen the first time NewNcclCommunicator is called, so one libdistckpt.so
// serves machines with and without GPUs. Without them that call fails with kUnsupported naming what is missing.
// Byte collectives run as NCCL collectives on device buffers, staged through pinned host memory, on a stream of the
// communicator's own, in the primary context of its device. See README.md.
//
// Layering, as in the external backend: AllGather and Gather allgather a 24-byte header (sequence, collective,
// root, size) and then the contributions padded to the largest one; Broadcast broadcasts the header then the payload;
// Barrier is the header allgather alone. The header catches ranks that are in different collectives.
//
// Timeouts. The communicator is created non-blocking; every call polls NCCL and the stream (sleeping between polls)
// until its deadline, and on expiry aborts the communicator (ncclCommAbort), which unblocks the device work. NCCL
// cannot tell which rank is missing, so a timeout names only this rank; use the Gloo backend (or a Gloo barrier
// before NCCL work) where naming the culprit matters. After any failure every later call fails fast with kState.
// Destruction finalizes a healthy communicator (bounded by NcclOptions::timeout) and aborts a failed one.
//
// Not for background threads: an asynchronous save over this communicator is refused (CheckBackgroundUse,
// kUnsupported), since its NCCL kernels would run beside the application's own in a rank-dependent order. Pass a Gloo
// communicator (e.g. the bootstrap) to asynchronous saves.
#ifndef DISTCKPT_CORE_COMM_NCCL_NCCL_H_
#define DISTCKPT_CORE_COMM_NCCL_NCCL_H_

#include <chrono>
#include <memory>

#include "core/base/status.h"
#include "core/comm/communicator.h"

namespace distckpt {

struct NcclOptions {
  /// CUDA device of this rank; -1: the device of the calling thread's current CUDA context if it has one, else
  /// DCKPT_LOCAL_RANK's or LOCAL_RANK's, else the only visible device (with several, an error saying what to set).
  int device = -1;
  /// Limit for creating the communicator (the unique id exchange and NCCL's own initialisation), and for finalizing
  /// it when it is destroyed: a healthy communicator is finalized (ncclCommFinalize, which waits for every rank to
  /// finalize too) then destroyed; past this limit, or after any failure, it is aborted instead (ncclCommAbort, which
  /// waits on no peer). So destroying the communicator on a rank whose peers never do returns after this long.
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
};

/// Creates an NCCL communicator over the ranks of `bootstrap` (collective over `bootstrap`, e.g. a Gloo group, which
/// is used only during this call to exchange rank 0's ncclUniqueId and every rank's readiness: a rank that cannot
/// load NCCL or the driver makes every rank fail, naming it). One rank per GPU. kUnsupported without libnccl.so.2
/// (or DCKPT_NCCL_LIBRARY), without libcuda.so.1 (or DCKPT_CUDA_DRIVER_LIBRARY), or without a usable device. Not
/// thread-safe: one collective at a time; each call makes the device's primary context current on the calling thread
/// for its duration and restores the previous one.
Result<std::unique_ptr<Communicator>> NewNcclCommunicator(Communicator* bootstrap, const NcclOptions& options);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_COMM_NCCL_NCCL_H_
