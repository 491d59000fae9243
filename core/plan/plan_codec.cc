#include "core/plan/plan_codec.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/base/wire.h"

namespace distckpt {
namespace {

// Layout (all integers LEB128 varints unless noted):
//   LocalPlan:      "DLP" u8(version=1) rank  ntensors { name dtype:u8 ndim dims[ndim] nboxes { ndim:u8 off[ndim]
//                   len[ndim] } }  nbytes { name size }  has_fingerprints:u8  [ ntensors { nfp { fp } }
//                   nbytes { fp } ]   where fp = known:u8 checksum:u64 hash_lo:u64 hash_hi:u64 (fixed 8 bytes)
//   RankAssignment: "DRA" u8(version=1) rank  ntasks { entry chunk local file offset length }
//                   ntensor { entry }  nbytes { entry }
// Strings are a varint length followed by the bytes. Counts are checked against the bytes left, so a hostile
// count cannot make the decoder reserve more than the message could describe.
constexpr char kLocalPlanMagic[3] = {'D', 'L', 'P'};
constexpr char kAssignmentMagic[3] = {'D', 'R', 'A'};
constexpr uint8_t kCodecVersion = 2;  // 2: the local plan's fingerprints (incremental saves)

void PutHeader(WireWriter* w, const char (&magic)[3]) {
  w->Raw(magic, 3);
  w->U8(kCodecVersion);
}

Status CheckHeader(WireReader* r, const char (&magic)[3], const char* what) {
  char m[3];
  uint8_t version = 0;
  if (!r->Raw(m, 3) || !r->U8(&version) || std::memcmp(m, magic, 3) != 0) {
    return Corrupt(std::string(what) + " message has a bad header");
  }
  if (version != kCodecVersion) {
    return VersionError(std::string(what) + " message has codec version " + std::to_string(version) + "; this build " +
                        "reads version " + std::to_string(kCodecVersion) + " (all ranks must run the same distckpt)");
  }
  return OkStatus();
}

bool GetU32(WireReader* r, uint32_t* v) {
  uint64_t x;
  if (!r->Var(&x) || x > UINT32_MAX) return false;
  *v = static_cast<uint32_t>(x);
  return true;
}

// Decoded items can be much larger than their smallest encoding (a 0-d box is 1 byte on the wire, 136 in memory), so
// containers grow with what was actually decoded instead of trusting a count up front.
size_t ReserveHint(uint64_t n) { return static_cast<size_t>(std::min<uint64_t>(n, 1024)); }

Status Truncated(const char* what) { return Corrupt(std::string(what) + " message is truncated or malformed"); }

}  // namespace

Result<std::string> EncodeLocalPlan(const LocalPlan& plan) {
  WireWriter w;
  size_t estimate = 16;
  for (const LocalTensorDecl& t : plan.tensors)
    estimate += t.name.size() + 4 + 8 * t.shape.size() * (1 + 2 * t.boxes.size());
  w.Reserve(estimate);
  PutHeader(&w, kLocalPlanMagic);
  w.Var(plan.rank);
  w.Var(plan.tensors.size());
  for (const LocalTensorDecl& t : plan.tensors) {
    if (t.shape.size() > kMaxDims) {
      return InvalidArgument("tensor '" + t.name + "' has " + std::to_string(t.shape.size()) + " dimensions; at most " +
                             std::to_string(kMaxDims) + " are supported");
    }
    w.Str(t.name);
    w.U8(static_cast<uint8_t>(t.dtype));
    w.Var(t.shape.size());
    for (uint64_t d : t.shape) w.Var(d);
    w.Var(t.boxes.size());
    for (const Box& b : t.boxes) {
      if (b.ndim > kMaxDims) return InvalidArgument("tensor '" + t.name + "' has a box with invalid ndim");
      w.U8(static_cast<uint8_t>(b.ndim));
      for (uint32_t d = 0; d < b.ndim; ++d) w.Var(b.offset[d]);
      for (uint32_t d = 0; d < b.ndim; ++d) w.Var(b.length[d]);
    }
  }
  w.Var(plan.bytes.size());
  for (const LocalBytesDecl& b : plan.bytes) {
    w.Str(b.name);
    w.Var(b.size);
  }
  bool any = false;
  for (const LocalTensorDecl& t : plan.tensors) any = any || !t.fingerprints.empty();
  for (const LocalBytesDecl& b : plan.bytes) any = any || b.fingerprint.known;
  w.U8(any ? 1 : 0);
  if (any) {
    auto put = [&w](const ChunkFingerprint& fp) {
      w.U8(fp.known ? 1 : 0);
      w.U64(fp.checksum);
      w.U64(fp.hash.lo);
      w.U64(fp.hash.hi);
    };
    for (const LocalTensorDecl& t : plan.tensors) {
      if (!t.fingerprints.empty() && t.fingerprints.size() != t.boxes.size()) {
        return InvalidArgument("tensor '" + t.name + "' has " + std::to_string(t.fingerprints.size()) +
                               " fingerprints for " + std::to_string(t.boxes.size()) + " pieces");
      }
      w.Var(t.fingerprints.size());
      for (const ChunkFingerprint& fp : t.fingerprints) put(fp);
    }
    for (const LocalBytesDecl& b : plan.bytes) put(b.fingerprint);
  }
  return w.Take();
}

Result<LocalPlan> DecodeLocalPlan(std::string_view data) {
  static constexpr char kWhat[] = "local plan";
  WireReader r(data);
  DCKPT_RETURN_IF_ERROR(CheckHeader(&r, kLocalPlanMagic, kWhat));
  LocalPlan plan;
  uint64_t n;
  // Minimum encoded sizes: a tensor is name length + dtype + ndim + box count (4 bytes), a box its ndim byte, a
  // bytes declaration its name length + size (2 bytes).
  if (!GetU32(&r, &plan.rank) || !r.Count(&n, 4)) return Truncated(kWhat);
  plan.tensors.reserve(ReserveHint(n));
  for (uint64_t i = 0; i < n; ++i) {
    LocalTensorDecl& t = plan.tensors.emplace_back();
    uint8_t dtype;
    uint64_t ndim, nboxes;
    if (!r.Str(&t.name) || !r.U8(&dtype) || !r.Var(&ndim) || ndim > kMaxDims) return Truncated(kWhat);
    t.dtype = static_cast<DType>(dtype);
    t.shape.resize(ndim);
    for (uint64_t& d : t.shape) {
      if (!r.Var(&d)) return Truncated(kWhat);
    }
    if (!r.Count(&nboxes, 1)) return Truncated(kWhat);
    t.boxes.reserve(ReserveHint(nboxes));
    for (uint64_t k = 0; k < nboxes; ++k) {
      Box& b = t.boxes.emplace_back();
      uint8_t bdim;
      if (!r.U8(&bdim) || bdim > kMaxDims) return Truncated(kWhat);
      b.ndim = bdim;
      for (uint32_t d = 0; d < b.ndim; ++d) {
        if (!r.Var(&b.offset[d])) return Truncated(kWhat);
      }
      for (uint32_t d = 0; d < b.ndim; ++d) {
        if (!r.Var(&b.length[d])) return Truncated(kWhat);
        if (b.offset[d] > UINT64_MAX - b.length[d]) return Corrupt("local plan message has a box that overflows");
      }
    }
  }
  if (!r.Count(&n, 2)) return Truncated(kWhat);
  plan.bytes.resize(n);
  for (LocalBytesDecl& b : plan.bytes) {
    if (!r.Str(&b.name) || !r.Var(&b.size)) return Truncated(kWhat);
  }
  uint8_t has_fingerprints = 0;
  if (!r.U8(&has_fingerprints) || has_fingerprints > 1) return Truncated(kWhat);
  if (has_fingerprints) {
    auto get = [&r](ChunkFingerprint* fp) {
      uint8_t known = 0;
      if (!r.U8(&known) || known > 1 || !r.U64(&fp->checksum) || !r.U64(&fp->hash.lo) || !r.U64(&fp->hash.hi)) {
        return false;
      }
      fp->known = known == 1;
      return true;
    };
    for (LocalTensorDecl& t : plan.tensors) {
      uint64_t nfp;
      if (!r.Count(&nfp, 25) || (nfp != 0 && nfp != t.boxes.size())) return Truncated(kWhat);
      t.fingerprints.resize(nfp);
      for (ChunkFingerprint& fp : t.fingerprints) {
        if (!get(&fp)) return Truncated(kWhat);
      }
    }
    for (LocalBytesDecl& b : plan.bytes) {
      if (!get(&b.fingerprint)) return Truncated(kWhat);
    }
  }
  if (!r.done()) return Corrupt("local plan message has trailing bytes");
  return plan;
}

Result<std::string> EncodeRankAssignment(const RankAssignment& a) {
  WireWriter w;
  w.Reserve(16 + 12 * a.tasks.size() + 2 * (a.tensor_entry.size() + a.bytes_entry.size()));
  PutHeader(&w, kAssignmentMagic);
  w.Var(a.rank);
  w.Var(a.tasks.size());
  for (const WriteTask& t : a.tasks) {
    w.Var(t.entry);
    w.Var(t.chunk);
    w.Var(t.local);
    w.Var(t.file);
    w.Var(t.offset);
    w.Var(t.length);
  }
  for (const std::vector<uint32_t>* ids : {&a.tensor_entry, &a.bytes_entry}) {
    w.Var(ids->size());
    for (uint32_t id : *ids) w.Var(id);
  }
  return w.Take();
}

Result<RankAssignment> DecodeRankAssignment(std::string_view data) {
  static constexpr char kWhat[] = "rank assignment";
  WireReader r(data);
  DCKPT_RETURN_IF_ERROR(CheckHeader(&r, kAssignmentMagic, kWhat));
  RankAssignment a;
  uint64_t n;
  if (!GetU32(&r, &a.rank) || !r.Count(&n, 6)) return Truncated(kWhat);
  a.tasks.resize(n);
  for (WriteTask& t : a.tasks) {
    if (!GetU32(&r, &t.entry) || !GetU32(&r, &t.chunk) || !GetU32(&r, &t.local) || !GetU32(&r, &t.file) ||
        !r.Var(&t.offset) || !r.Var(&t.length)) {
      return Truncated(kWhat);
    }
  }
  for (std::vector<uint32_t>* ids : {&a.tensor_entry, &a.bytes_entry}) {
    if (!r.Count(&n, 1)) return Truncated(kWhat);
    ids->resize(n);
    for (uint32_t& id : *ids) {
      if (!GetU32(&r, &id)) return Truncated(kWhat);
    }
  }
  if (!r.done()) return Corrupt("rank assignment message has trailing bytes");
  return a;
}

std::string EncodeChunkReports(const Status& status, const std::vector<ChunkChecksums>& reports,
                               uint64_t bytes_written) {
  WireWriter w;
  PutStatus(&w, status);
  w.Var(bytes_written);
  w.Var(reports.size());
  for (const ChunkChecksums& c : reports) {
    w.Var(c.entry);
    w.Var(c.chunk);
    w.U64(c.checksum);
    w.U8(c.has_hash ? 1 : 0);
    w.U64(c.hash.lo);
    w.U64(c.hash.hi);
    w.Var(c.blocks.size());
    for (uint64_t b : c.blocks) w.U64(b);
    w.U8(static_cast<uint8_t>(c.coding.codec));
    w.U8(c.placed ? 1 : 0);
    if (c.placed) {
      w.Var(c.offset);
      w.Var(c.file_size);
    }
    if (!c.coding.raw()) {
      w.Var(c.coding.stored_length);
      w.Var(c.stored.size());
      for (const StoredBlock& sb : c.stored) {
        w.U64(sb.checksum);
        w.Var(sb.size);
      }
    }
  }
  return w.Take();
}

Status DecodeChunkReports(const std::string& msg, Status* status, std::vector<ChunkChecksums>* reports) {
  WireReader r(msg);
  uint64_t n, bytes_written;
  if (!GetStatus(&r, status) || !r.Var(&bytes_written) || !r.Count(&n, 28))
    return Internal("malformed checksum report");
  for (uint64_t i = 0; i < n; ++i) {
    ChunkChecksums c;
    uint64_t entry, chunk, nblocks;
    uint8_t has_hash = 0;
    if (!r.Var(&entry) || !r.Var(&chunk) || !r.U64(&c.checksum) || !r.U8(&has_hash) || !r.U64(&c.hash.lo) ||
        !r.U64(&c.hash.hi) || !r.Count(&nblocks, 8)) {
      return Internal("malformed checksum report");
    }
    c.entry = uint32_t(entry), c.chunk = uint32_t(chunk);
    c.has_hash = has_hash != 0;
    c.blocks.resize(nblocks);
    for (uint64_t& b : c.blocks) r.U64(&b);
    uint8_t codec = 0, placed = 0;
    if (!r.U8(&codec) || !r.U8(&placed)) return Internal("malformed checksum report");
    c.coding.codec = static_cast<Codec>(codec);
    c.placed = placed != 0;
    if (c.placed && (!r.Var(&c.offset) || !r.Var(&c.file_size))) return Internal("malformed checksum report");
    if (!c.coding.raw()) {
      uint64_t nstored = 0;
      if (!r.Var(&c.coding.stored_length) || !r.Count(&nstored, 9)) return Internal("malformed checksum report");
      c.stored.resize(nstored);
      for (StoredBlock& sb : c.stored) {
        if (!r.U64(&sb.checksum) || !r.Var(&sb.size)) return Internal("malformed checksum report");
      }
    }
    reports->push_back(std::move(c));
  }
  return r.ok() ? OkStatus() : Internal("malformed checksum report");
}

}  // namespace distckpt
