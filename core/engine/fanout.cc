#include "core/engine/fanout.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "core/base/wire.h"

namespace distckpt {
namespace {

bool SameChunk(const ChunkRange& a, const ChunkRange& b) { return a.entry == b.entry && a.chunk == b.chunk; }
bool ByPlace(const ChunkRange& a, const ChunkRange& b) {
  return std::tie(a.entry, a.chunk, a.lo) < std::tie(b.entry, b.chunk, b.lo);
}

// A run of bytes of one chunk with the same set of ranks needing it.
struct Piece {
  ChunkRange range;
  std::shared_ptr<const std::vector<int>> needers;
};

// The union of every rank's needs, cut where the set of ranks needing the bytes changes.
std::vector<Piece> SharedPieces(const std::vector<std::vector<ChunkRange>>& needs) {
  struct Event {
    ChunkRange at;  // lo: position
    int rank;
    int delta;
  };
  std::vector<Event> events;
  for (size_t r = 0; r < needs.size(); ++r) {
    for (const ChunkRange& c : needs[r]) {
      if (c.hi <= c.lo) continue;
      events.push_back(Event{ChunkRange{c.entry, c.chunk, c.lo, 0}, static_cast<int>(r), +1});
      events.push_back(Event{ChunkRange{c.entry, c.chunk, c.hi, 0}, static_cast<int>(r), -1});
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.at.entry, a.at.chunk, a.at.lo, a.rank, a.delta) <
           std::tie(b.at.entry, b.at.chunk, b.at.lo, b.rank, b.delta);
  });
  std::vector<Piece> out;
  std::map<int, int> active;  // rank -> how many of its ranges cover the position (1 for well-formed needs)
  for (size_t i = 0; i < events.size();) {
    const ChunkRange at = events[i].at;
    for (; i < events.size() && SameChunk(events[i].at, at) && events[i].at.lo == at.lo; ++i) {
      if ((active[events[i].rank] += events[i].delta) == 0) active.erase(events[i].rank);
    }
    if (active.empty() || i == events.size() || !SameChunk(events[i].at, at)) continue;
    std::vector<int> needers;
    for (const auto& [rank, n] : active) needers.push_back(rank);
    const uint64_t hi = events[i].at.lo;
    if (!out.empty() && SameChunk(out.back().range, at) && out.back().range.hi == at.lo &&
        *out.back().needers == needers) {
      out.back().range.hi = hi;
    } else {
      out.push_back(Piece{ChunkRange{at.entry, at.chunk, at.lo, hi},
                          std::make_shared<const std::vector<int>>(std::move(needers))});
    }
  }
  return out;
}

}  // namespace

std::vector<FanoutPart> AssignFanout(const std::vector<std::vector<ChunkRange>>& needs, uint64_t block) {
  block = std::max<uint64_t>(block, 1);
  std::vector<Piece> pieces = SharedPieces(needs);
  std::vector<uint64_t> load(needs.size(), 0);
  std::vector<FanoutPart> out;
  for (const Piece& p : pieces) {
    if (p.needers->size() == 1) load[p.needers->front()] += p.range.hi - p.range.lo;
  }
  for (Piece& p : pieces) {
    const ChunkRange& r = p.range;
    if (p.needers->size() == 1) {
      out.push_back(FanoutPart{r, p.needers->front(), p.needers});
      continue;
    }
    // Water-filling: the piece's bytes go to the needers that have read least so far, so that their totals end up
    // as equal as the piece allows; each share is a contiguous run cut at the chunk-relative
    // multiple of `block` nearest to its ideal end, so a reader hashes whole checksum blocks.
    const uint64_t size = r.hi - r.lo;
    std::vector<int> by_load = *p.needers;
    std::stable_sort(by_load.begin(), by_load.end(), [&](int a, int b) { return load[a] < load[b]; });
    size_t filled = by_load.size();
    long double level = 0, sum = 0;
    for (size_t j = 0; j < by_load.size(); ++j) {
      sum += load[by_load[j]];
      level = (static_cast<long double>(size) + sum) / static_cast<long double>(j + 1);
      if (j + 1 == by_load.size() || level <= load[by_load[j + 1]]) {
        filled = j + 1;
        break;
      }
    }
    // The most loaded first: the last share, which takes what rounding leaves (all of a piece shorter than a block),
    // goes to the least loaded.
    uint64_t at = r.lo;
    long double ideal = r.lo;
    for (size_t j = filled; j-- > 0 && at < r.hi;) {
      const int rank = by_load[j];
      ideal += level - load[rank];
      uint64_t end = r.hi;
      if (j > 0) {
        const uint64_t want = static_cast<uint64_t>(std::min<long double>(ideal, r.hi) + 0.5L);
        end = std::min(r.hi, (want + block / 2) / block * block);  // nearest block boundary
        if (end <= at) continue;                                   // less than half a block: nothing for this rank
      }
      out.push_back(FanoutPart{ChunkRange{r.entry, r.chunk, at, end}, rank, p.needers});
      load[rank] += end - at;
      at = end;
    }
  }
  return out;
}

FanoutRounds ScheduleFanoutRounds(const std::vector<FanoutPart>& parts, int ranks, uint64_t round_bytes,
                                  uint64_t block) {
  block = std::max<uint64_t>(block, 1);
  const uint64_t cap = std::max(block, round_bytes / block * block);
  // Each rank's pieces, in the parts' order, then packed into rounds of at most round_bytes (or one piece).
  std::vector<std::vector<std::vector<FanoutPiece>>> per_rank(ranks);  // [rank][round]
  std::vector<uint64_t> filled(ranks, 0);
  for (size_t i = 0; i < parts.size(); ++i) {
    const FanoutPart& p = parts[i];
    if (p.needers->size() < 2 || p.reader < 0 || p.reader >= ranks) continue;
    for (uint64_t lo = p.range.lo; lo < p.range.hi;) {
      const uint64_t hi = std::min(p.range.hi, lo / block * block + cap);
      auto& rounds = per_rank[p.reader];
      uint64_t& used = filled[p.reader];
      if (rounds.empty() || (used + (hi - lo) > round_bytes && !rounds.back().empty())) {
        rounds.emplace_back();
        used = 0;
      }
      rounds.back().push_back(FanoutPiece{ChunkRange{p.range.entry, p.range.chunk, lo, hi}, p.reader, i});
      used += hi - lo;
      lo = hi;
    }
  }
  size_t n = 0;
  for (const auto& r : per_rank) n = std::max(n, r.size());
  FanoutRounds out(n, std::vector<std::vector<FanoutPiece>>(ranks));
  for (int r = 0; r < ranks; ++r) {
    for (size_t k = 0; k < per_rank[r].size(); ++k) out[k][r] = std::move(per_rank[r][k]);
  }
  return out;
}

std::string EncodeFanoutNeeds(const FanoutNeeds& n) {
  WireWriter w;
  w.U8(static_cast<uint8_t>((n.take_part ? 1 : 0) | (n.verify ? 2 : 0) | (n.always ? 4 : 0)));
  w.Var(n.round_bytes);
  w.Var(n.identities.size());
  for (const auto& [file, id] : n.identities) {
    w.Var(file);
    w.U64(id);
  }
  w.Var(n.ranges.size());
  for (const ChunkRange& r : n.ranges) {
    w.Var(r.entry);
    w.Var(r.chunk);
    w.Var(r.lo);
    w.Var(r.hi - r.lo);
  }
  return w.Take();
}

bool DecodeFanoutNeeds(const std::string& msg, FanoutNeeds* n) {
  WireReader in(msg);
  uint8_t flags;
  uint64_t count;
  if (!in.U8(&flags) || flags > 7 || !in.Var(&n->round_bytes) || !in.Count(&count, 9)) return false;
  n->take_part = flags & 1;
  n->verify = flags & 2;
  n->always = flags & 4;
  n->identities.resize(count);
  for (auto& [file, id] : n->identities) {
    uint64_t f;
    if (!in.Var(&f) || f > UINT32_MAX || !in.U64(&id)) return false;
    file = static_cast<uint32_t>(f);
  }
  if (!in.Count(&count, 4)) return false;
  n->ranges.resize(count);
  for (ChunkRange& r : n->ranges) {
    uint64_t entry, chunk, lo, len;
    if (!in.Var(&entry) || entry > UINT32_MAX || !in.Var(&chunk) || chunk > UINT32_MAX || !in.Var(&lo) ||
        !in.Var(&len) || len > UINT64_MAX - lo) {
      return false;
    }
    r = ChunkRange{static_cast<uint32_t>(entry), static_cast<uint32_t>(chunk), lo, lo + len};
  }
  return in.done();
}

uint64_t DecideFanout(const std::vector<FanoutNeeds>& wants) {
  // Ranks fan out together only if they agree on verification: a rank that verifies never takes bytes from one that
  // does not. Under kAuto, only if the participants do not all read through one page cache.
  bool any = false, always = false, agree = true, verify = true, separate_caches = false;
  uint64_t round_bytes = UINT64_MAX;
  std::map<uint32_t, uint64_t> cache_of_file;
  for (const FanoutNeeds& f : wants) {
    if (!f.take_part) continue;
    if (any && f.verify != verify) agree = false;
    verify = f.verify;
    any = true;
    always = always || f.always;
    round_bytes = std::min(round_bytes, std::max<uint64_t>(f.round_bytes, 1));
    for (const auto& [file, id] : f.identities) {
      auto [it, added] = cache_of_file.emplace(file, id);
      if (id == 0 || (!added && it->second != id)) separate_caches = true;
    }
  }
  return any && agree && (always || separate_caches) ? round_bytes : 0;
}

Result<CollectiveLoadPlan> ExchangeLoadPlans(Communicator* comm, const Status& local, const VerifyClaim& claim,
                                             const FanoutNeeds& needs, uint64_t block,
                                             std::chrono::milliseconds timeout) {
  std::string mine = EncodeFanoutNeeds(needs);
  const size_t cap = std::max<size_t>(kMinFanoutNeedsBytes, kMaxFanoutPlanBytes / std::max(1, comm->size()));
  if (mine.size() > cap) {
    FanoutNeeds none;
    none.verify = needs.verify;
    none.round_bytes = needs.round_bytes;
    mine = EncodeFanoutNeeds(none);
  }
  WireWriter w;
  w.Str(VerifyClaimMessage(local, claim));
  w.Str(mine);
  std::vector<std::string> all;
  DCKPT_RETURN_IF_ERROR(comm->AllGather(w.Take(), &all, timeout));
  if (!local.ok()) return local;
  const int n = static_cast<int>(all.size());
  std::vector<VerifyClaim> claims(n);
  std::vector<FanoutNeeds> wants(n);
  for (int r = 0; r < n; ++r) {
    WireReader in(all[r]);
    std::string claim_msg, needs_msg;
    Status peer;
    if (!in.Str(&claim_msg) || !in.Str(&needs_msg) || !in.done() || !DecodeVerifyClaim(claim_msg, &peer, &claims[r]) ||
        !DecodeFanoutNeeds(needs_msg, &wants[r])) {
      return Internal("rank " + std::to_string(r) + " sent a malformed load plan");
    }
    if (!peer.ok()) return Status(StatusCode::kPeer, "rank " + std::to_string(r) + " failed: " + peer.message());
  }
  CollectiveLoadPlan plan;
  plan.filter = MakeVerifyFilter(claims, comm->rank());
  const uint64_t round_bytes = DecideFanout(wants);
  if (round_bytes == 0) return plan;
  std::vector<std::vector<ChunkRange>> by_rank(n);
  for (int r = 0; r < n; ++r) {
    if (wants[r].take_part) by_rank[r] = std::move(wants[r].ranges);
  }
  plan.parts = AssignFanout(by_rank, block);
  plan.fanout =
      std::any_of(plan.parts.begin(), plan.parts.end(), [](const FanoutPart& p) { return p.needers->size() > 1; });
  if (!plan.fanout) {
    plan.parts.clear();
    return plan;
  }
  plan.participant = wants[comm->rank()].take_part;
  // A participant reads disjoint parts and verifies all of them; the others share verification among themselves.
  for (int r = 0; r < n; ++r) {
    if (wants[r].take_part) claims[r] = VerifyClaim{};
  }
  plan.filter = plan.participant ? nullptr : MakeVerifyFilter(claims, comm->rank());
  // The round's budget is what each rank receives: shared evenly among the ranks that contribute.
  std::vector<bool> contributes(n, false);
  for (const FanoutPart& p : plan.parts) {
    if (p.needers->size() > 1) contributes[p.reader] = true;
  }
  const uint64_t contributors = std::max<uint64_t>(1, std::count(contributes.begin(), contributes.end(), true));
  plan.rounds = ScheduleFanoutRounds(plan.parts, n, std::max<uint64_t>(1, round_bytes / contributors), block);
  return plan;
}

Status RunFanoutLoad(Communicator* comm, ReadBatch* batch, const CollectiveLoadPlan& plan, Status st,
                     const ProgressFn& progress, std::chrono::milliseconds timeout, bool* comm_failed) {
  *comm_failed = false;
  const int me = comm->rank();
  if (st.ok()) {
    if (!plan.participant) {
      st = batch->Run(progress);
    } else {
      std::vector<ChunkRange> own;  // what only this rank needs
      for (const FanoutPart& p : plan.parts) {
        if (p.reader == me && p.needers->size() == 1) own.push_back(p.range);
      }
      st = batch->RunRanges(own, progress, nullptr);
    }
  }
  // An OK status on the wire is these two bytes (PutStatus: code 0, empty message); the payload follows.
  const std::string ok_header = [] {
    WireWriter w;
    PutStatus(&w, OkStatus());
    return w.Take();
  }();
  auto bytes_of = [](const std::vector<FanoutPiece>& pieces) {
    uint64_t n = 0;
    for (const FanoutPiece& p : pieces) n += p.range.hi - p.range.lo;
    return n;
  };
  for (size_t k = 0; k < plan.rounds.size(); ++k) {
    const std::vector<FanoutPiece>& mine = plan.rounds[k][me];
    std::string msg;
    if (st.ok()) {
      std::vector<uint64_t> at(mine.size());
      std::vector<ChunkRange> ranges(mine.size());
      uint64_t size = ok_header.size();
      for (size_t i = 0; i < mine.size(); ++i) {
        at[i] = size;
        ranges[i] = mine[i].range;
        size += mine[i].range.hi - mine[i].range.lo;
      }
      msg.resize(size);
      std::memcpy(&msg[0], ok_header.data(), ok_header.size());
      // The executor hands over verified segments of the ranges asked for (mine is sorted by place): each is copied
      // to its place in the message.
      auto sink = [&](const ChunkRange& got, const char* data) {
        auto it = std::upper_bound(ranges.begin(), ranges.end(), got, ByPlace);
        if (it == ranges.begin()) return;
        const size_t i = static_cast<size_t>(std::prev(it) - ranges.begin());
        if (!SameChunk(ranges[i], got) || got.hi > ranges[i].hi) return;
        std::memcpy(&msg[at[i] + (got.lo - ranges[i].lo)], data, got.hi - got.lo);
      };
      if (!mine.empty()) st = batch->RunRanges(ranges, progress, sink);
    }
    if (!st.ok()) {
      WireWriter w;
      PutStatus(&w, st);
      msg = w.Take();
    }
    std::vector<std::string> all;
    Status sent = comm->AllGather(msg, &all, timeout);
    msg.clear();
    msg.shrink_to_fit();
    if (!sent.ok()) {
      *comm_failed = true;
      return st.ok() ? sent.WithContext("fan-out round " + std::to_string(k + 1) + " of " +
                                        std::to_string(plan.rounds.size()))
                     : st;
    }
    // Every rank sees the same contributions, so every rank stops at the same round (and the collectives stay
    // matched): the load's final status exchange follows.
    if (!st.ok()) return st;
    for (size_t r = 0; r < all.size(); ++r) {
      WireReader in(all[r]);
      Status peer;
      if (!GetStatus(&in, &peer)) return Internal("rank " + std::to_string(r) + " sent a malformed fan-out round");
      if (!peer.ok()) return Status(StatusCode::kPeer, "rank " + std::to_string(r) + " failed: " + peer.message());
      const uint64_t want = bytes_of(plan.rounds[k][r]);
      if (in.remaining() != want) {
        return Internal("rank " + std::to_string(r) + " sent " + std::to_string(in.remaining()) +
                        " bytes in fan-out round " + std::to_string(k + 1) + ", expected " + std::to_string(want));
      }
    }
    for (size_t r = 0; r < all.size() && st.ok(); ++r) {
      if (static_cast<int>(r) == me) continue;
      const char* data = all[r].data() + ok_header.size();
      for (const FanoutPiece& p : plan.rounds[k][r]) {
        const std::vector<int>& needers = *plan.parts[p.part].needers;
        if (std::binary_search(needers.begin(), needers.end(), me)) {
          st = batch->DeliverFromPeer(p.range, data, progress);
          if (!st.ok()) break;
        }
        data += p.range.hi - p.range.lo;
      }
    }
  }
  return st;
}

}  // namespace distckpt
