// Splitting checksum verification between the ranks of one host.
//
// In a resharded load several ranks often need bytes of the same checksum blocks (a tensor saved by rows and loaded
// by columns: every rank needs a slice of every row). Each of them would read and hash every such block in full. When
// those ranks read the same file through the same page cache, hashing a block once proves the bytes all of them copy
// out of that cache, so each shared block is hashed by exactly one of the ranks that need it. A mismatch fails that
// rank's read, and the load's final status exchange fails every rank with its message (checkpoint, entry, file).
#ifndef DISTCKPT_CORE_ENGINE_SHARED_VERIFY_H_
#define DISTCKPT_CORE_ENGINE_SHARED_VERIFY_H_

#include <chrono>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/comm/communicator.h"
#include "core/engine/reader.h"

namespace distckpt {

/// What one rank tells the others: the files it verifies (by index, with a digest of their cache identities) and the
/// block-aligned ranges of each that it will hash.
struct VerifyClaim {
  std::vector<std::pair<uint32_t, uint64_t>> identities;  ///< (file index, IdentityDigest(CacheIdentity)); 0: unknown
  std::vector<FileRange> ranges;                          ///< merged, sorted by (file, lo)
};

/// 64-bit digest of a ReadableFile::CacheIdentity (0 for an empty identity: nothing to share).
uint64_t IdentityDigest(const std::string& identity);

/// A claim that encodes larger than this is not sent (the rank sends an empty claim and hashes everything it reads
/// itself), which bounds the exchange at this many bytes per rank whatever the checkpoint's layout.
constexpr size_t kMaxVerifyClaimBytes = 16 << 10;

/// The filter for rank `me` given every rank's claim (indexed by rank). A block (file, offset) is hashed by one of
/// the ranks whose ranges contain `offset` of that file and whose identity of that file equals this rank's (and is
/// not 0); the choice depends only on (file, offset, those ranks), so every rank makes the same one. Returns
/// nullptr (verify everything) when no other rank shares a file with this one.
VerifyFilter MakeVerifyFilter(const std::vector<VerifyClaim>& claims, int me);

/// A claim with the sender's status on the wire, and back (false for malformed input, which never crashes).
std::string EncodeVerifyClaim(const Status& local, const VerifyClaim& claim);
bool DecodeVerifyClaim(const std::string& msg, Status* local, VerifyClaim* claim);
/// What ShareVerification sends: EncodeVerifyClaim, or the encoding of an empty claim past kMaxVerifyClaimBytes.
std::string VerifyClaimMessage(const Status& local, const VerifyClaim& claim);

/// Collective: every rank sends its status so far and its claim (an empty one if `mine` encodes larger than
/// kMaxVerifyClaimBytes); returns this rank's filter, computed from the claims as every rank received them. If a rank
/// is missing or reports a failure, every rank returns an error (as AgreeOnStatus does), and no rank starts reading.
Result<VerifyFilter> ShareVerification(Communicator* comm, const Status& local, const VerifyClaim& mine,
                                       std::chrono::milliseconds timeout);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_ENGINE_SHARED_VERIFY_H_
