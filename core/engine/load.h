// Load: fill a State's buffers in place from a checkpoint, resharding as needed. No collective is needed to plan.
#ifndef DISTCKPT_CORE_ENGINE_LOAD_H_
#define DISTCKPT_CORE_ENGINE_LOAD_H_

#include <string>

#include "core/base/status.h"
#include "core/comm/communicator.h"
#include "core/engine/reader.h"
#include "core/engine/state.h"

namespace distckpt {

// Fan-out (ReadOptions::fanout; core/engine/fanout.h). In a collective load, bytes that several ranks need
// (replicated weights on every data-parallel rank, or blocks every rank needs a slice of) are read from storage by
// one of them only and passed to the others through the communicator. By default (kAuto) only where the ranks do not
// all read through one page cache: ranks on several hosts, or storage whose cache identity is unknown.
//  - Planning: each rank's planned reads (ReadBatch::NeededRanges) travel in the one AllGather that precedes every
//    collective load (the one that also carries shared-verification claims); every rank then computes the same
//    assignment: bytes only one rank needs stay its own, bytes several need are split among them (balancing the
//    bytes each rank reads, cut on checksum blocks). No extra storage read, no extra collective.
//  - Trust: the rank that reads a part verifies every checksum block of it before delivering or sending it;
//    receivers trust those bytes. Verification is never skipped for bytes that reach a caller buffer.
//  - Exchange: AllGather rounds in which a rank receives at most ReadOptions::fanout_round_bytes (256 MiB, shared
//    among the contributing ranks, each at least one checksum block), each contribution carrying its sender's
//    status. A failure (a checksum mismatch, an I/O error, a progress abort) reaches every rank in the same round:
//    all stop, and every rank fails with the failing rank's message (checkpoint, entry, file). A rank that dies
//    mid-exchange makes the others fail promptly, naming it.
//  - Stats: IoStats::bytes_read stays storage reads only; bytes_received_from_peers / bytes_sent_to_peers count
//    the exchange.
//  - When it pays: shared storage (a parallel filesystem, NFS, an object store) read from several hosts, where
//    storage bandwidth is the limit: bytes read drop by the replica factor. Ranks on one host already share the
//    page cache, so there kAuto does not fan out (bench/fanout with kAlways on one 2-core host: 3.7x fewer bytes
//    read, but 3-7x slower through loopback TCP). kAuto sees one cache when every file some participants read has
//    the same non-empty ReadableFile::CacheIdentity on all of them. Ranks fan out together only if they agree on
//    verification; a rank with kOff reads everything itself (and still joins the rounds).
//  - Not fanned out: bytes entries (each rank reads its own), and loads through a single-rank communicator.

struct LoadSummary {
  IoStats io;
  uint32_t entries = 0;  ///< entries this rank loaded
  double seconds = 0;
};

/// Loads every tensor piece and bytes entry of `state` from the checkpoint at `path`. Tensors must exist with the
/// same dtype and global shape; each rank reads only the byte ranges its pieces need. Collective when `comm` has
/// several ranks (the metadata is read once and broadcast; at the end every rank learns whether all succeeded, so a
/// failure on one rank fails all of them).
Result<LoadSummary> Load(const std::string& path, State& state, Communicator* comm, const ReadOptions& options);

/// The same through an open reader: from the checkpoint it opened, with its options (verify, mapping, shared
/// verification, timeout), without reading the metadata again. Collective when `comm` has several ranks; `comm` must
/// be the communicator the reader was opened with (every rank opened it). A binding that reads the structure and
/// bytes entries through a reader loads its tensors this way, so that everything comes from one checkpoint.
Result<LoadSummary> Load(Reader* reader, State& state, Communicator* comm, const ProgressFn& progress);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_LOAD_H_
