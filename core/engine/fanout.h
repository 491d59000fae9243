// Fan-out load: ranks of a collective load that need the same saved bytes (replicas) each read a disjoint part of
// them from storage and exchange the parts over the communicator, so the bytes read from storage drop by the replica
// factor.
//
// Planning costs no storage read and one collective: every rank already knows the byte ranges its plan reads
// (ReadBatch::NeededRanges); they travel in the same AllGather that shares the verification claims
// (shared_verify.h), and every rank then computes the same assignment (AssignFanout) from what it received.
// Exchange: AllGather in bounded rounds (ScheduleFanoutRounds: ReadOptions::fanout_round_bytes received per round,
// shared among the contributing ranks),
// each rank contributing the bytes it read for others, prefixed by its status. A rank that fails (a checksum mismatch,
// an I/O error) sends its error instead; every rank sees it in the same round, stops, and fails with that rank's
// message, which names the checkpoint, the entry and the file.
// Trust: a part is verified (checksum blocks, when verification is on) by the rank that reads it, before it is
// delivered or sent; cuts fall on checksum blocks of the chunk, so that rank hashes every block it reads in full.
// Receivers trust the bytes (the verified reader's and the transport's), as ranks sharing verification trust each
// other's hashing.
#ifndef DISTCKPT_CORE_ENGINE_FANOUT_H_
#define DISTCKPT_CORE_ENGINE_FANOUT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/comm/communicator.h"
#include "core/engine/reader.h"
#include "core/engine/shared_verify.h"

namespace distckpt {

/// Bytes of one saved chunk and who reads them: `reader` reads [range.lo, range.hi) of the chunk from storage; every
/// rank in `needers` (sorted, includes `reader`) needs them. Parts cut from one run of bytes share their needers
/// (with thousands of ranks, a copy per part would not scale).
struct FanoutPart {
  ChunkRange range;
  int reader = -1;
  std::shared_ptr<const std::vector<int>> needers;
};

/// Deterministic assignment of every byte some rank needs to one rank that reads it. `needs[r]`: rank r's needed
/// ranges (sorted by chunk then lo, disjoint within a chunk). Returns disjoint parts, sorted by (entry, chunk, lo),
/// covering exactly the union of the needs; each part's reader needs it; bytes only one rank needs are that rank's.
/// Bytes several ranks need are split among them, cut only at chunk-relative multiples of `block` (so a reader hashes
/// whole checksum blocks), balancing the total bytes each rank reads. Same input, same output, on every rank.
std::vector<FanoutPart> AssignFanout(const std::vector<std::vector<ChunkRange>>& needs, uint64_t block);

/// The rounds of the exchange: rounds[k][r] lists the pieces (parts with more than one needer, cut block-aligned to
/// at most max(round_bytes, block) bytes) rank r contributes in round k, at most `round_bytes` in all (or a single
/// piece). Every rank computes the same schedule, hence the same number of collectives.
struct FanoutPiece {
  ChunkRange range;
  int reader = -1;
  size_t part = 0;  ///< index of the part (in the schedule's input) it belongs to
};
using FanoutRounds = std::vector<std::vector<std::vector<FanoutPiece>>>;
FanoutRounds ScheduleFanoutRounds(const std::vector<FanoutPart>& parts, int ranks, uint64_t round_bytes,
                                  uint64_t block);

/// What a rank tells the others before a collective load reads anything.
struct FanoutNeeds {
  bool take_part = false;  ///< fan-out asked for (and this rank's needs fit the cap below)
  bool always = false;     ///< FanoutMode::kAlways (else kAuto)
  bool verify = true;      ///< this rank verifies checksums (ranks fan out together only if all agree)
  /// The files this rank reads: (file index, IdentityDigest(CacheIdentity)); 0: unknown. Under kAuto the group fans
  /// out only if two ranks read a file through different caches (or an unknown one).
  std::vector<std::pair<uint32_t, uint64_t>> identities;
  uint64_t round_bytes = 0;        ///< this rank's cap on what it receives per round (the group uses the smallest)
  std::vector<ChunkRange> ranges;  ///< sorted by (entry, chunk, lo), merged
};

/// A rank whose needed ranges encode larger than max(kMinFanoutNeedsBytes, kMaxFanoutPlanBytes / ranks) does not
/// take part (it reads everything itself), which bounds what every rank receives in the planning exchange at about
/// kMaxFanoutPlanBytes whatever the checkpoint's layout and the number of ranks.
constexpr size_t kMaxFanoutPlanBytes = 64 << 20;
constexpr size_t kMinFanoutNeedsBytes = 16 << 10;

std::string EncodeFanoutNeeds(const FanoutNeeds& needs);
bool DecodeFanoutNeeds(const std::string& msg, FanoutNeeds* needs);

/// Whether the group fans out, from every rank's needs (indexed by rank): the round size (the smallest asked for: what
/// a rank receives per round, all contributions together), or 0
/// for no fan-out. Only ranks that take part count: the group fans out if they agree on verification and some asks
/// kAlways or, under kAuto, two of them read a file through different caches (or one through an unknown cache).
uint64_t DecideFanout(const std::vector<FanoutNeeds>& wants);

/// The outcome of the planning exchange, the same on every rank (but `filter`, which is this rank's).
struct CollectiveLoadPlan {
  /// Shared verification among the ranks that do not fan out (null for a participant: it verifies all it reads).
  VerifyFilter filter;
  bool fanout = false;       ///< some bytes are exchanged (then `rounds` is not empty)
  bool participant = false;  ///< this rank reads only what `parts` gives it
  std::vector<FanoutPart> parts;
  FanoutRounds rounds;
};

/// Collective: one AllGather of every rank's status, verification claim and needs. If a rank is missing or reports
/// a failure, every rank returns an error and no rank starts reading. `block`: the checkpoint's checksum block size.
/// The group fans out if some rank takes part with `always`, or with kAuto when the participants do not all read
/// through one page cache; and only if all participants agree on verification.
Result<CollectiveLoadPlan> ExchangeLoadPlans(Communicator* comm, const Status& local, const VerifyClaim& claim,
                                             const FanoutNeeds& needs, uint64_t block,
                                             std::chrono::milliseconds timeout);

/// Collective: reads this rank's part of `plan` through `batch` (everything it needs, if not a participant) and runs
/// the exchange rounds. `local`: this rank's status so far (an error is sent in the first round, and `batch` may then
/// be null). Sets *comm_failed when a collective failed (the communicator is then unusable). Every rank returns an
/// error if any rank failed.
Status RunFanoutLoad(Communicator* comm, ReadBatch* batch, const CollectiveLoadPlan& plan, Status local,
                     const ProgressFn& progress, std::chrono::milliseconds timeout, bool* comm_failed);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_FANOUT_H_
