#include "core/plan/save_planner.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/base/utf8.h"
#include "core/format/checksum.h"

namespace distckpt {
namespace {

// Scale note: a 1,024-rank job with 1,000 tensors per rank hands us ~1M declarations and boxes. Everything below is
// flat arrays indexed by integers, grouped by counting sorts, with per-tensor scratch reused across tensors; the only
// hash map is keyed by distinct names.

constexpr uint32_t kUnassigned = 0xFFFFFFFFu;

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

std::string Quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

// One entry being built: every declaration of one name.
struct Group {
  std::string_view name;
  EntryKind kind = EntryKind::kTensor;
  uint32_t first_rank = 0;    // lowest declaring rank (ranks are visited in order)
  uint32_t member_begin = 0;  // into `members`, after grouping
  uint32_t num_members = 0;
};

// One declaration: rank and index into that rank's tensors or bytes (by the group's kind).
struct Member {
  uint32_t rank;
  uint32_t decl;
};

// One input box of the tensor being planned.
struct BoxRef {
  const Box* box;
  uint32_t rank;
  uint32_t local;
};

// Lexicographic on offsets then lengths; all boxes of a tensor share ndim (checked before sorting).
bool BoxLess(const Box& a, const Box& b) {
  for (uint32_t d = 0; d < a.ndim; ++d) {
    if (a.offset[d] != b.offset[d]) return a.offset[d] < b.offset[d];
  }
  for (uint32_t d = 0; d < a.ndim; ++d) {
    if (a.length[d] != b.length[d]) return a.length[d] < b.length[d];
  }
  return false;
}

bool RefLess(const BoxRef& a, const BoxRef& b) {
  if (a.box != b.box && *a.box != *b.box) return BoxLess(*a.box, *b.box);
  return a.rank != b.rank ? a.rank < b.rank : a.local < b.local;
}

// Who may write a chunk. Replicated chunks list their candidate ranks in `candidates`; others have one.
struct ChunkAssign {
  uint32_t writer = kUnassigned;
  uint32_t local = 0;
  uint32_t cand_begin = 0;  // replicated only: range in `candidates`
  uint32_t cand_end = 0;
};

struct Candidate {
  uint32_t rank;
  uint32_t local;
};

// "rank 3" or "ranks 3, 7, 9 (+12 more)": the ranks that declared one distinct box (refs sorted by rank).
std::string RanksOf(const BoxRef* refs, size_t n) {
  std::string s;
  size_t shown = 0, distinct = 0;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && refs[i].rank == refs[i - 1].rank) continue;
    ++distinct;
    if (shown < 3) {
      s += (shown ? ", " : "") + std::to_string(refs[i].rank);
      ++shown;
    }
  }
  if (distinct > shown) s += " (+" + std::to_string(distinct - shown) + " more)";
  return (distinct == 1 ? "rank " : "ranks ") + s;
}

// Called only after CheckExactTiling failed: finds two overlapping distinct boxes so the error can name their ranks.
// A sweep on dimension 0, bounded so a pathological layout cannot stall the error path.
bool FindOverlap(const std::vector<Box>& tiles, size_t* a, size_t* b) {
  if (tiles.empty() || tiles[0].ndim == 0) return tiles.size() > 1 ? (*a = 0, *b = 1, true) : false;
  std::vector<uint32_t> order(tiles.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](uint32_t x, uint32_t y) { return tiles[x].offset[0] < tiles[y].offset[0]; });
  std::vector<uint32_t> active;
  uint64_t budget = 50'000'000;
  Box unused;
  for (uint32_t id : order) {
    const uint64_t start = tiles[id].offset[0];
    active.erase(std::remove_if(active.begin(), active.end(), [&](uint32_t x) { return tiles[x].end(0) <= start; }),
                 active.end());
    for (uint32_t other : active) {
      if (budget-- == 0) return false;
      if (Intersect(tiles[other], tiles[id], &unused)) {
        *a = other;
        *b = id;
        return true;
      }
    }
    active.push_back(id);
  }
  return false;
}

// Entry names: non-empty, at most this long, UTF-8 without NUL (FORMAT.md; the metadata validator enforces the same).
constexpr size_t kMaxEntryNameBytes = 1 << 16;

uint64_t AlignDown(uint64_t v, uint64_t alignment) { return v & ~(alignment - 1); }

class GlobalPlanner {
 public:
  GlobalPlanner(const std::vector<LocalPlan>& plans, const SavePlanOptions& options)
      : plans_(plans), options_(options), load_(plans.size(), 0) {}

  Result<GlobalPlan> Run() {
    if (options_.alignment < kChunkAlignment || (options_.alignment & (options_.alignment - 1)) != 0) {
      return InvalidArgument("save plan alignment " + std::to_string(options_.alignment) +
                             " must be a power of two >= " + std::to_string(kChunkAlignment));
    }
    const uint64_t block = options_.checksum_block_size;
    if (block < 4096 || (block & (block - 1)) != 0) {
      return InvalidArgument("checksum block size " + std::to_string(block) + " must be a power of two >= 4096");
    }
    DCKPT_RETURN_IF_ERROR(GroupByName());
    SortEntries();
    plan_.metadata.entries.resize(groups_.size());
    for (uint32_t e = 0; e < groups_.size(); ++e) {
      const Group& g = groups_[order_[e]];
      EntryRecord& rec = plan_.metadata.entries[e];
      rec.name = std::string(g.name);
      rec.kind = g.kind;
      DCKPT_RETURN_IF_ERROR(CheckName(g));
      DCKPT_RETURN_IF_ERROR(g.kind == EntryKind::kTensor ? PlanTensor(g, &rec) : PlanBytes(g, &rec));
    }
    BalanceReplicas();
    DCKPT_RETURN_IF_ERROR(AssignFiles());
    MapDeclarations();
    plan_.metadata.checksum_block_size = options_.checksum_block_size;
    plan_.metadata.alignment = options_.alignment;
    return std::move(plan_);
  }

 private:
  // Buckets every declaration by name; entries get a group id each, members come out grouped in rank order.
  Status GroupByName() {
    const size_t nranks = plans_.size();
    plan_.tensor_entry.resize(nranks);
    plan_.bytes_entry.resize(nranks);
    size_t total = 0;
    for (uint32_t r = 0; r < nranks; ++r) {
      if (plans_[r].rank != r) {
        return InvalidArgument("local plan #" + std::to_string(r) + " is labelled rank " +
                               std::to_string(plans_[r].rank) + "; plans must be ordered by rank");
      }
      total += plans_[r].tensors.size() + plans_[r].bytes.size();
    }
    if (total >= kUnassigned) return InvalidArgument("too many declarations in the save plan");
    std::unordered_map<std::string_view, uint32_t> by_name;
    by_name.reserve(plans_.empty() ? 0 : 2 * (plans_[0].tensors.size() + plans_[0].bytes.size()) + 16);

    // Ranks usually declare the same names in the same order: try the previous rank's group at the same position
    // before hashing.
    auto lookup = [&](std::string_view name, EntryKind kind, uint32_t r, const std::vector<uint32_t>* prev, size_t j,
                      uint32_t* out) -> Status {
      uint32_t g = kUnassigned;
      if (prev != nullptr && j < prev->size() && groups_[(*prev)[j]].name == name) {
        g = (*prev)[j];
      } else {
        auto [it, inserted] = by_name.try_emplace(name, static_cast<uint32_t>(groups_.size()));
        if (inserted) {
          Group ng;
          ng.name = name;
          ng.kind = kind;
          ng.first_rank = r;
          groups_.push_back(ng);
        }
        g = it->second;
      }
      Group& group = groups_[g];
      if (group.kind != kind) {
        auto kind_name = [](EntryKind k) { return k == EntryKind::kTensor ? "a tensor" : "bytes"; };
        return InvalidArgument(Quoted(name) + " is declared as " + kind_name(group.kind) + " by rank " +
                               std::to_string(group.first_rank) + " but as " + kind_name(kind) + " by rank " +
                               std::to_string(r) + "; an entry name must have one kind");
      }
      ++group.num_members;
      *out = g;
      return OkStatus();
    };

    for (uint32_t r = 0; r < nranks; ++r) {
      const LocalPlan& p = plans_[r];
      std::vector<uint32_t>& te = plan_.tensor_entry[r];
      std::vector<uint32_t>& be = plan_.bytes_entry[r];
      te.resize(p.tensors.size());
      be.resize(p.bytes.size());
      for (size_t j = 0; j < p.tensors.size(); ++j) {
        DCKPT_RETURN_IF_ERROR(
            lookup(p.tensors[j].name, EntryKind::kTensor, r, r > 0 ? &plan_.tensor_entry[r - 1] : nullptr, j, &te[j]));
      }
      for (size_t j = 0; j < p.bytes.size(); ++j) {
        DCKPT_RETURN_IF_ERROR(
            lookup(p.bytes[j].name, EntryKind::kBytes, r, r > 0 ? &plan_.bytes_entry[r - 1] : nullptr, j, &be[j]));
      }
    }

    // Counting sort of the declarations by group; visiting ranks in order keeps each group's members rank-sorted.
    uint32_t next = 0;
    for (Group& g : groups_) {
      g.member_begin = next;
      next += g.num_members;
      g.num_members = 0;
    }
    members_.resize(next);
    for (uint32_t r = 0; r < nranks; ++r) {
      for (int k = 0; k < 2; ++k) {
        const std::vector<uint32_t>& ids = k == 0 ? plan_.tensor_entry[r] : plan_.bytes_entry[r];
        for (uint32_t j = 0; j < ids.size(); ++j) {
          Group& g = groups_[ids[j]];
          if (g.num_members > 0 && members_[g.member_begin + g.num_members - 1].rank == r) {
            return InvalidArgument("rank " + std::to_string(r) + " declares " + Quoted(g.name) +
                                   " more than once; each rank declares an entry once, with all its local pieces");
          }
          members_[g.member_begin + g.num_members++] = Member{r, j};
        }
      }
    }
    return OkStatus();
  }

  // The format's name rules (FORMAT.md), checked here so the error names a rank rather than surfacing at encode time.
  Status CheckName(const Group& g) {
    const std::string who = "rank " + std::to_string(g.first_rank) + " declares an entry name ";
    if (g.name.empty()) return InvalidArgument(who + "that is empty");
    if (g.name.size() > kMaxEntryNameBytes) {
      return InvalidArgument(who + "longer than " + std::to_string(kMaxEntryNameBytes) + " bytes");
    }
    if (g.name.find('\0') != std::string_view::npos) return InvalidArgument(who + "containing a NUL byte");
    if (!IsValidUtf8(g.name)) return InvalidArgument(who + "that is not valid UTF-8");
    return OkStatus();
  }

  void SortEntries() {
    order_.resize(groups_.size());
    for (uint32_t i = 0; i < order_.size(); ++i) order_[i] = i;
    std::sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) { return groups_[a].name < groups_[b].name; });
    entry_of_group_.resize(groups_.size());
    for (uint32_t e = 0; e < order_.size(); ++e) entry_of_group_[order_[e]] = e;
  }

  Status PlanTensor(const Group& g, EntryRecord* rec) {
    const Member* mem = &members_[g.member_begin];
    const LocalTensorDecl& ref = plans_[mem[0].rank].tensors[mem[0].decl];
    const std::string what = "tensor " + Quoted(g.name);
    if (!IsValidDType(static_cast<uint32_t>(ref.dtype))) {
      return InvalidArgument(what + ": rank " + std::to_string(mem[0].rank) + " declares an invalid dtype (" +
                             std::to_string(static_cast<int>(ref.dtype)) + ")");
    }
    if (ref.shape.size() > kMaxDims) {
      return InvalidArgument(what + ": rank " + std::to_string(mem[0].rank) + " declares shape " +
                             ShapeString(ref.shape) + " with more than " + std::to_string(kMaxDims) + " dimensions");
    }
    const uint64_t itemsize = DTypeSize(ref.dtype);
    auto total = CheckedVolume(ref.shape, itemsize);
    if (!total.ok()) {
      return InvalidArgument(what + ": shape " + ShapeString(ref.shape) + " of " + DTypeName(ref.dtype) +
                             " does not fit in 64-bit byte sizes");
    }
    const uint32_t ndim = static_cast<uint32_t>(ref.shape.size());
    rec->dtype = ref.dtype;
    rec->shape = ref.shape;

    refs_.clear();
    for (uint32_t m = 0; m < g.num_members; ++m) {
      const LocalTensorDecl& decl = plans_[mem[m].rank].tensors[mem[m].decl];
      if (m > 0 && (decl.dtype != ref.dtype || decl.shape != ref.shape)) {
        auto desc = [](const LocalTensorDecl& t) {
          const char* dt = IsValidDType(static_cast<uint32_t>(t.dtype)) ? DTypeName(t.dtype) : "invalid";
          return std::string("dtype ") + dt + " shape " + ShapeString(t.shape);
        };
        return InvalidArgument(what + ": rank " + std::to_string(mem[0].rank) + " declares " + desc(ref) +
                               " but rank " + std::to_string(mem[m].rank) + " declares " + desc(decl) +
                               "; every rank must agree on a tensor's dtype and global shape");
      }
      for (uint32_t k = 0; k < decl.boxes.size(); ++k) {
        const Box& b = decl.boxes[k];
        bool inside = b.ndim == ndim;
        for (uint32_t d = 0; inside && d < ndim; ++d) {
          inside = b.offset[d] <= ref.shape[d] && b.length[d] <= ref.shape[d] - b.offset[d];
        }
        if (!inside) {
          return InvalidArgument(what + ": rank " + std::to_string(mem[m].rank) + " piece #" + std::to_string(k) +
                                 " box " + b.ToString() + " lies outside the tensor of shape " +
                                 ShapeString(ref.shape));
        }
        if (!b.empty()) refs_.push_back(BoxRef{&b, mem[m].rank, k});
      }
    }

    if (*total == 0 && ndim > 0) {
      // A tensor with no elements still gets one (empty) chunk so readers see it. Its writer is the lowest
      // declaring rank that holds a piece (so `local` names a real piece), else the lowest declaring rank.
      rec->chunk_offsets.assign(ndim, 0);
      rec->chunk_lengths = ref.shape;
      uint32_t writer = mem[0].rank;
      for (uint32_t m = 0; m < g.num_members; ++m) {
        if (!plans_[mem[m].rank].tensors[mem[m].decl].boxes.empty()) {
          writer = mem[m].rank;
          break;
        }
      }
      AddChunk(rec, 0, ChunkAssign{writer, 0, 0, 0});
      return OkStatus();
    }

    // Dedup: identical boxes become adjacent. Ranks usually list pieces in order, so check before sorting.
    if (!std::is_sorted(refs_.begin(), refs_.end(), RefLess)) std::sort(refs_.begin(), refs_.end(), RefLess);
    tiles_.clear();
    tile_refs_.clear();
    rec->chunk_offsets.reserve(refs_.size() * ndim);
    rec->chunk_lengths.reserve(refs_.size() * ndim);
    for (size_t i = 0; i < refs_.size();) {
      size_t j = i + 1;
      while (j < refs_.size() && *refs_[j].box == *refs_[i].box) ++j;
      const Box& b = *refs_[i].box;
      tiles_.push_back(b);
      tile_refs_.push_back(static_cast<uint32_t>(i));
      rec->chunk_offsets.insert(rec->chunk_offsets.end(), b.offset, b.offset + ndim);
      rec->chunk_lengths.insert(rec->chunk_lengths.end(), b.length, b.length + ndim);
      AddChunk(rec, b.volume() * itemsize, Assign(i, j));
      i = j;
    }
    tile_refs_.push_back(static_cast<uint32_t>(refs_.size()));

    Status tiled = CheckExactTiling(ref.shape, tiles_);
    if (tiled.ok()) return OkStatus();
    if (tiled.code() == StatusCode::kUnsupported) return tiled.WithContext(what);
    size_t a, b;
    if (FindOverlap(tiles_, &a, &b)) {
      return InvalidArgument(what + ": box " + tiles_[a].ToString() + " from " +
                             RanksOf(&refs_[tile_refs_[a]], tile_refs_[a + 1] - tile_refs_[a]) +
                             " partially overlaps box " + tiles_[b].ToString() + " from " +
                             RanksOf(&refs_[tile_refs_[b]], tile_refs_[b + 1] - tile_refs_[b]) +
                             "; replicas must declare identical boxes and shards must not overlap");
    }
    return InvalidArgument(what + " of shape " + ShapeString(ref.shape) +
                           " is not covered exactly by the ranks' boxes: " + tiled.message() +
                           "; some rank must declare every region of every tensor");
  }

  // The writer of the distinct box refs_[i, j): the single owner, or (replicated) decided later by BalanceReplicas.
  ChunkAssign Assign(size_t i, size_t j) {
    if (refs_[j - 1].rank == refs_[i].rank) return ChunkAssign{refs_[i].rank, refs_[i].local, 0, 0};
    ChunkAssign a;
    a.cand_begin = static_cast<uint32_t>(candidates_.size());
    for (size_t k = i; k < j; ++k) {
      if (k == i || refs_[k].rank != refs_[k - 1].rank) candidates_.push_back(Candidate{refs_[k].rank, refs_[k].local});
    }
    a.cand_end = static_cast<uint32_t>(candidates_.size());
    return a;
  }

  Status PlanBytes(const Group& g, EntryRecord* rec) {
    const Member* mem = &members_[g.member_begin];
    const uint64_t size = plans_[mem[0].rank].bytes[mem[0].decl].size;
    for (uint32_t m = 1; m < g.num_members; ++m) {
      const uint64_t other = plans_[mem[m].rank].bytes[mem[m].decl].size;
      if (other != size) {
        return InvalidArgument("bytes " + Quoted(g.name) + ": rank " + std::to_string(mem[0].rank) + " declares " +
                               std::to_string(size) + " bytes but rank " + std::to_string(mem[m].rank) + " declares " +
                               std::to_string(other) + "; every rank must hold the same blob");
      }
    }
    rec->dtype = DType::kU8;
    rec->shape = {size};
    rec->chunk_offsets = {0};
    rec->chunk_lengths = {size};
    ChunkAssign a{mem[0].rank, 0, 0, 0};
    if (g.num_members > 1) {
      a.writer = kUnassigned;
      a.cand_begin = static_cast<uint32_t>(candidates_.size());
      for (uint32_t m = 0; m < g.num_members; ++m) candidates_.push_back(Candidate{mem[m].rank, 0});
      a.cand_end = static_cast<uint32_t>(candidates_.size());
    }
    AddChunk(rec, size, a);
    return OkStatus();
  }

  void AddChunk(EntryRecord* rec, uint64_t length, const ChunkAssign& a) {
    ChunkLocation loc;
    loc.length = length;
    rec->chunks.push_back(loc);
    if (a.writer == kUnassigned) {
      replicated_.push_back(static_cast<uint32_t>(assign_.size()));
    } else {
      load_[a.writer] += length;
    }
    assign_.push_back(a);
    chunk_length_.push_back(length);
  }

  // Greedy longest-processing-time: owners' chunks are already counted; replicated chunks go, largest first, to the
  // candidate with the fewest bytes so far (ties: lowest rank). Ends within one chunk of the best balance.
  void BalanceReplicas() {
    std::stable_sort(replicated_.begin(), replicated_.end(),
                     [&](uint32_t a, uint32_t b) { return chunk_length_[a] > chunk_length_[b]; });
    for (uint32_t c : replicated_) {
      ChunkAssign& a = assign_[c];
      const Candidate* best = &candidates_[a.cand_begin];
      for (uint32_t k = a.cand_begin + 1; k < a.cand_end; ++k) {
        if (load_[candidates_[k].rank] < load_[best->rank]) best = &candidates_[k];
      }
      a.writer = best->rank;
      a.local = best->local;
      load_[best->rank] += chunk_length_[c];
    }
  }

  // The writer's fingerprint of chunk assignment `a` of entry `e` (unknown if it sent none).
  ChunkFingerprint FingerprintOf(uint32_t e, const ChunkAssign& a) const {
    const Group& g = groups_[order_[e]];
    for (uint32_t m = g.member_begin; m < g.member_begin + g.num_members; ++m) {
      if (members_[m].rank != a.writer) continue;
      if (g.kind == EntryKind::kBytes) return plans_[a.writer].bytes[members_[m].decl].fingerprint;
      const std::vector<ChunkFingerprint>& fps = plans_[a.writer].tensors[members_[m].decl].fingerprints;
      return a.local < fps.size() ? fps[a.local] : ChunkFingerprint{};
    }
    return ChunkFingerprint{};
  }

  // Incremental saves: asks options_.reuse about every chunk with bytes; a reused one gets its base's location (a
  // file record per base file, after the writers' own) and no writer. reused_of[c]: index into `reused`.
  Status ReuseChunks(std::vector<uint32_t>* reused_of, std::vector<ReusedChunk>* reused) {
    reused_of->assign(assign_.size(), kUnassigned);
    if (!options_.reuse) return OkStatus();
    size_t c = 0;
    for (uint32_t e = 0; e < plan_.metadata.entries.size(); ++e) {
      const EntryRecord& rec = plan_.metadata.entries[e];
      for (uint32_t k = 0; k < rec.chunks.size(); ++k, ++c) {
        if (rec.chunks[k].length == 0) continue;
        ReusedChunk r;
        if (!options_.reuse(rec, k, FingerprintOf(e, assign_[c]), &r)) continue;
        if (r.base == 0) {
          return Internal("entry " + Quoted(rec.name) + " chunk " + std::to_string(k) + " reuses no base");
        }
        (*reused_of)[c] = static_cast<uint32_t>(reused->size());
        ChunkChecksums sums;
        sums.entry = e;
        sums.chunk = k;
        sums.checksum = r.checksum;
        sums.blocks = r.blocks;
        sums.hash = r.hash;
        sums.coding = r.coding;
        sums.stored = r.stored;
        plan_.reused.push_back(std::move(sums));
        reused->push_back(std::move(r));
      }
    }
    return OkStatus();
  }

  // One file per writing rank, in rank order; chunks laid out in entry order, each on an aligned offset. Chunks
  // taken from a base (ReuseChunks) keep their place in the base's file.
  Status AssignFiles() {
    std::vector<uint32_t> reused_of;
    std::vector<ReusedChunk> reused;
    DCKPT_RETURN_IF_ERROR(ReuseChunks(&reused_of, &reused));
    const size_t nranks = plans_.size();
    std::vector<uint32_t> tasks(nranks, 0);
    for (size_t c = 0; c < assign_.size(); ++c) {
      if (reused_of[c] == kUnassigned) ++tasks[assign_[c].writer];
    }
    std::vector<uint32_t> file_of(nranks, kUnassigned);
    for (uint32_t r = 0; r < nranks; ++r) {
      if (tasks[r] == 0) continue;
      file_of[r] = static_cast<uint32_t>(plan_.metadata.files.size());
      plan_.metadata.files.push_back(DataFileRecord{DataFileName(r), 0});
    }
    std::map<std::pair<uint32_t, std::string>, uint32_t> base_file;  // (base, name) -> file index
    for (const ReusedChunk& r : reused) {
      auto [it, added] = base_file.emplace(std::make_pair(r.base, r.file), 0);
      if (!added) continue;
      it->second = static_cast<uint32_t>(plan_.metadata.files.size());
      plan_.metadata.files.push_back(DataFileRecord{r.file, r.file_size, r.base});
    }
    plan_.per_rank.resize(nranks);
    for (uint32_t r = 0; r < nranks; ++r) plan_.per_rank[r].reserve(tasks[r]);

    std::vector<uint64_t> cursor(nranks, 0);
    const uint64_t align = options_.alignment;
    size_t c = 0;
    for (uint32_t e = 0; e < plan_.metadata.entries.size(); ++e) {
      EntryRecord& rec = plan_.metadata.entries[e];
      for (uint32_t k = 0; k < rec.chunks.size(); ++k, ++c) {
        const ChunkAssign& a = assign_[c];
        ChunkLocation& loc = rec.chunks[k];
        if (reused_of[c] != kUnassigned) {
          const ReusedChunk& r = reused[reused_of[c]];
          loc.file = base_file.at(std::make_pair(r.base, r.file));
          loc.offset = r.offset;
          loc.checksum = 0;
          loc.first_block = kNoBlockTable;
          continue;
        }
        uint64_t& cur = cursor[a.writer];
        if (loc.length == 0) {
          // Zero-length chunks take no space; an aligned offset at or before the cursor stays inside the file.
          loc.offset = AlignDown(cur, align);
        } else {
          if (cur > UINT64_MAX - (align - 1))
            return InvalidArgument("rank " + std::to_string(a.writer) + "'s data file would exceed 2^64 bytes");
          loc.offset = AlignDown(cur + align - 1, align);
          if (loc.length > UINT64_MAX - loc.offset)
            return InvalidArgument("rank " + std::to_string(a.writer) + "'s data file would exceed 2^64 bytes");
          cur = loc.offset + loc.length;
        }
        loc.file = file_of[a.writer];
        loc.checksum = 0;
        loc.first_block = kNoBlockTable;
        plan_.per_rank[a.writer].push_back(WriteTask{e, k, a.local, loc.file, loc.offset, loc.length});
      }
    }
    for (uint32_t r = 0; r < nranks; ++r) {
      if (file_of[r] != kUnassigned) plan_.metadata.files[file_of[r]].size = cursor[r];
    }
    return OkStatus();
  }

  void MapDeclarations() {
    for (auto* table : {&plan_.tensor_entry, &plan_.bytes_entry}) {
      for (std::vector<uint32_t>& ids : *table) {
        for (uint32_t& id : ids) id = entry_of_group_[id];
      }
    }
  }

  const std::vector<LocalPlan>& plans_;
  const SavePlanOptions& options_;
  GlobalPlan plan_;

  std::vector<Group> groups_;
  std::vector<Member> members_;
  std::vector<uint32_t> order_;           // entry index -> group
  std::vector<uint32_t> entry_of_group_;  // group -> entry index

  // Per chunk, in (entry, chunk) order.
  std::vector<ChunkAssign> assign_;
  std::vector<uint64_t> chunk_length_;
  std::vector<uint32_t> replicated_;  // chunk ids still without a writer
  std::vector<Candidate> candidates_;
  std::vector<uint64_t> load_;  // bytes assigned to each rank so far

  // Scratch for the tensor being planned, reused so planning does not allocate per tensor.
  std::vector<BoxRef> refs_;
  std::vector<Box> tiles_;
  std::vector<uint32_t> tile_refs_;
};

}  // namespace

std::string DataFileName(uint32_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "data-%05u.bin", rank);
  return buf;
}

Result<GlobalPlan> MakeGlobalPlan(const std::vector<LocalPlan>& plans, const SavePlanOptions& options) {
  return GlobalPlanner(plans, options).Run();
}

Result<RankAssignment> GetRankAssignment(const GlobalPlan& plan, uint32_t rank) {
  if (rank >= plan.per_rank.size() || rank >= plan.tensor_entry.size() || rank >= plan.bytes_entry.size()) {
    return InvalidArgument("the global plan has no rank " + std::to_string(rank));
  }
  RankAssignment a;
  a.rank = rank;
  a.tasks = plan.per_rank[rank];
  a.tensor_entry = plan.tensor_entry[rank];
  a.bytes_entry = plan.bytes_entry[rank];
  return a;
}

Status FinalizeChecksums(const std::vector<ChunkChecksums>& reports, GlobalPlan* plan) {
  MetadataRecord& md = plan->metadata;
  const uint64_t block_size = md.checksum_block_size;
  if (block_size == 0) return InvalidArgument("metadata checksum block size is zero");
  // Flat chunk numbering: base[e] + chunk.
  std::vector<size_t> base(md.entries.size() + 1, 0);
  for (size_t e = 0; e < md.entries.size(); ++e) base[e + 1] = base[e] + md.entries[e].chunks.size();
  constexpr size_t kMissing = SIZE_MAX;
  std::vector<size_t> report_of(base.back(), kMissing);

  for (size_t i = 0; i < reports.size(); ++i) {
    const ChunkChecksums& rep = reports[i];
    if (rep.entry >= md.entries.size() || rep.chunk >= md.entries[rep.entry].chunks.size()) {
      return InvalidArgument("checksum report #" + std::to_string(i) + " names entry " + std::to_string(rep.entry) +
                             " chunk " + std::to_string(rep.chunk) + ", which the plan does not have");
    }
    const EntryRecord& rec = md.entries[rep.entry];
    const std::string what = "entry " + Quoted(rec.name) + " chunk " + std::to_string(rep.chunk);
    size_t& slot = report_of[base[rep.entry] + rep.chunk];
    if (slot != kMissing) return InvalidArgument(what + ": checksums reported twice");
    slot = i;
    const uint64_t length = rec.chunks[rep.chunk].length;
    const uint64_t nblocks = NumChecksumBlocks(length, block_size);
    const uint64_t expect = nblocks == 1 ? 0 : nblocks;
    if (rep.blocks.size() != expect) {
      return InvalidArgument(what + " (" + std::to_string(length) + " bytes) has " + std::to_string(nblocks) +
                             " checksum blocks of " + std::to_string(block_size) + " bytes, but " +
                             std::to_string(rep.blocks.size()) + " block checksums were reported" +
                             (nblocks == 1 ? " (a single-block chunk reports none)" : ""));
    }
    if (nblocks > 1 && CombineBlockChecksums(rep.blocks) != rep.checksum) {
      return InvalidArgument(what + ": the reported chunk checksum does not match its block checksums");
    }
    if (!rep.coding.raw() && rep.stored.size() != nblocks) {
      return InvalidArgument(what + " is compressed in " + std::to_string(nblocks) + " blocks, but " +
                             std::to_string(rep.stored.size()) + " stored blocks were reported");
    }
    const uint32_t file = rec.chunks[rep.chunk].file;
    if (rep.placed && (file >= md.files.size() || md.files[file].base != 0)) {
      return InvalidArgument(what + ": a writer placed a chunk in a file it does not write");
    }
  }

  // Build the new tables aside so a failure leaves the plan untouched, then install them.
  std::vector<std::vector<uint64_t>> tables(md.entries.size());
  for (size_t e = 0; e < md.entries.size(); ++e) {
    for (size_t k = 0; k < md.entries[e].chunks.size(); ++k) {
      const size_t r = report_of[base[e] + k];
      if (r == kMissing) {
        const ChunkLocation& loc = md.entries[e].chunks[k];
        const std::string file = loc.file < md.files.size() ? md.files[loc.file].name : std::to_string(loc.file);
        return InvalidArgument("entry " + Quoted(md.entries[e].name) + " chunk " + std::to_string(k) + " (file " +
                               file + ", offset " + std::to_string(loc.offset) + ") has no checksum report");
      }
      if (tables[e].size() + reports[r].blocks.size() > kNoBlockTable) {
        return InvalidArgument("entry " + Quoted(md.entries[e].name) + " has too many checksum blocks");
      }
      tables[e].insert(tables[e].end(), reports[r].blocks.begin(), reports[r].blocks.end());
    }
  }
  for (size_t e = 0; e < md.entries.size(); ++e) {
    EntryRecord& rec = md.entries[e];
    uint32_t next = 0;
    bool hashed = true;  // an entry records a hash for every chunk, or none
    rec.chunk_hashes.resize(rec.chunks.size());
    for (size_t k = 0; k < rec.chunks.size(); ++k) {
      const ChunkChecksums& rep = reports[report_of[base[e] + k]];
      rec.chunks[k].checksum = rep.checksum;
      rec.chunks[k].first_block = rep.blocks.empty() ? kNoBlockTable : next;
      rec.chunk_hashes[k] = rep.hash;
      hashed = hashed && rep.has_hash;
      next += static_cast<uint32_t>(rep.blocks.size());
    }
    if (!hashed) rec.chunk_hashes.clear();
    rec.block_checksums = std::move(tables[e]);
    // Format 3.0: the codings, with the stored blocks of the compressed chunks in chunk order.
    rec.codings.clear();
    rec.stored_blocks.clear();
    for (size_t k = 0; k < rec.chunks.size(); ++k) {
      const ChunkChecksums& rep = reports[report_of[base[e] + k]];
      if (rep.placed) {
        rec.chunks[k].offset = rep.offset;
        md.files[rec.chunks[k].file].size = rep.file_size;
      }
      if (rep.coding.raw()) continue;
      if (rec.codings.empty()) {
        rec.codings.resize(rec.chunks.size());
        for (size_t j = 0; j < rec.chunks.size(); ++j) rec.codings[j].stored_length = rec.chunks[j].length;
      }
      rec.codings[k] = rep.coding;
      rec.codings[k].first_stored = static_cast<uint32_t>(rec.stored_blocks.size());
      rec.stored_blocks.insert(rec.stored_blocks.end(), rep.stored.begin(), rep.stored.end());
    }
  }
  return OkStatus();
}

}  // namespace distckpt
