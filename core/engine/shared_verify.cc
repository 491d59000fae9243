#include "core/engine/shared_verify.h"

#include <algorithm>
#include <map>
#include <memory>

#include "core/base/wire.h"
#include "core/format/checksum.h"

namespace distckpt {
namespace {

// splitmix64: spreads neighbouring blocks over the ranks that share them.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool Contains(const std::vector<FileRange>& sorted, uint64_t offset) {
  auto it = std::upper_bound(sorted.begin(), sorted.end(), offset,
                             [](uint64_t off, const FileRange& r) { return off < r.lo; });
  return it != sorted.begin() && offset < std::prev(it)->hi;
}

}  // namespace

uint64_t IdentityDigest(const std::string& identity) {
  if (identity.empty()) return 0;
  const uint64_t h = Xxh3(identity.data(), identity.size());
  return h == 0 ? 1 : h;
}

std::string EncodeVerifyClaim(const Status& local, const VerifyClaim& c) {
  WireWriter w;
  PutStatus(&w, local);
  w.Var(c.identities.size());
  for (const auto& [file, id] : c.identities) {
    w.Var(file);
    w.U64(id);
  }
  w.Var(c.ranges.size());
  for (const FileRange& r : c.ranges) {
    w.Var(r.file);
    w.Var(r.lo);
    w.Var(r.hi - r.lo);
  }
  return w.Take();
}

bool DecodeVerifyClaim(const std::string& msg, Status* st, VerifyClaim* c) {
  WireReader in(msg);
  if (!GetStatus(&in, st)) return false;
  uint64_t n;
  if (!in.Count(&n, 9)) return false;
  c->identities.resize(n);
  for (auto& [file, id] : c->identities) {
    uint64_t f;
    if (!in.Var(&f) || f > UINT32_MAX || !in.U64(&id)) return false;
    file = static_cast<uint32_t>(f);
  }
  if (!in.Count(&n, 3)) return false;
  c->ranges.resize(n);
  for (FileRange& r : c->ranges) {
    uint64_t f, lo, len;
    if (!in.Var(&f) || f > UINT32_MAX || !in.Var(&lo) || !in.Var(&len) || len > UINT64_MAX - lo) return false;
    r = FileRange{static_cast<uint32_t>(f), lo, lo + len};
  }
  return in.done();
}

std::string VerifyClaimMessage(const Status& local, const VerifyClaim& claim) {
  std::string msg = EncodeVerifyClaim(local, claim);
  if (msg.size() > kMaxVerifyClaimBytes) msg = EncodeVerifyClaim(local, VerifyClaim{});
  return msg;
}

VerifyFilter MakeVerifyFilter(const std::vector<VerifyClaim>& claims, int me) {
  if (me < 0 || static_cast<size_t>(me) >= claims.size()) return nullptr;
  // For each of my files: the other ranks reading the same bytes, with their ranges of that file.
  struct Peer {
    int rank;
    std::vector<FileRange> ranges;
  };
  auto sharing = std::make_shared<std::map<uint32_t, std::vector<Peer>>>();
  for (const auto& identity : claims[me].identities) {
    // Named copies, not structured bindings: a lambda may not capture those before C++20 (clang refuses).
    const auto& file = identity.first;
    const auto id = identity.second;
    if (id == 0) continue;
    std::vector<Peer> peers;
    for (size_t r = 0; r < claims.size(); ++r) {
      if (static_cast<int>(r) == me) continue;
      const VerifyClaim& c = claims[r];
      const bool same = std::any_of(c.identities.begin(), c.identities.end(),
                                    [&](const auto& fi) { return fi.first == file && fi.second == id; });
      if (!same) continue;
      Peer p{static_cast<int>(r), {}};
      for (const FileRange& fr : c.ranges) {
        if (fr.file == file) p.ranges.push_back(fr);
      }
      std::sort(p.ranges.begin(), p.ranges.end(), [](const FileRange& a, const FileRange& b) { return a.lo < b.lo; });
      if (!p.ranges.empty()) peers.push_back(std::move(p));
    }
    if (!peers.empty()) (*sharing)[file] = std::move(peers);
  }
  if (sharing->empty()) return nullptr;
  return [sharing, me](uint32_t file, uint64_t offset) {
    auto it = sharing->find(file);
    if (it == sharing->end()) return true;
    // The candidates in rank order: me and every peer that also hashes this block.
    std::vector<int> candidates;
    bool placed = false;
    for (const Peer& p : it->second) {
      if (!placed && p.rank > me) {
        candidates.push_back(me);
        placed = true;
      }
      if (Contains(p.ranges, offset)) candidates.push_back(p.rank);
    }
    if (!placed) candidates.push_back(me);
    if (candidates.size() == 1) return true;
    return candidates[Mix((static_cast<uint64_t>(file) << 44) ^ offset) % candidates.size()] == me;
  };
}

Result<VerifyFilter> ShareVerification(Communicator* comm, const Status& local, const VerifyClaim& mine,
                                       std::chrono::milliseconds timeout) {
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm->AllGather(VerifyClaimMessage(local, mine), &all, timeout));
  if (!local.ok()) return local;
  std::vector<VerifyClaim> claims(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    Status peer;
    if (!DecodeVerifyClaim(all[r], &peer, &claims[r])) {
      return Internal("rank " + std::to_string(r) + " sent a malformed verification claim");
    }
    if (!peer.ok()) return Status(StatusCode::kPeer, "rank " + std::to_string(r) + " failed: " + peer.message());
  }
  return MakeVerifyFilter(claims, comm->rank());
}

}  // namespace distckpt
