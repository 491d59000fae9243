// libFuzzer target for load planning on valid but adversarial metadata. Built and run by scripts/fuzz.sh (outside
// Bazel, clang-14 with ASan + UBSan); tests/fuzz:load_plan_regressions replays the committed inputs under Bazel.
//
// The input drives a generator of checkpoint descriptions: up to 8 dimensions, shapes with zero, tiny, large and
// near-2^64 extents, every dtype, grid tilings with up to 4096 tiny chunks, irregular (guillotine) tilings, empty
// tensors with arbitrary empty chunks, up to 1024 data files, chunks sharing file bytes, and sometimes a description
// that must be refused (a shape whose byte size overflows 64 bits, two chunks with the same box). It is encoded with
// EncodeMetadata and parsed with MetadataView::Parse (which validates); then ChunkIndex and PlanTensorRead plan reads
// of adversarial destination boxes taken from the same input. Properties:
//   - EncodeMetadata accepts exactly the valid descriptions, and the parsed view says what was written;
//   - ChunkIndex::Query returns exactly the chunks whose box meets the query, in increasing id order;
//   - PlanTensorRead fails (kInvalidArgument) exactly when a destination has the wrong ndim or leaves the tensor;
//   - otherwise, for each destination, the ops are exactly one per chunk meeting it, with the intersection as
//     region, grouped by increasing chunk then dest; each op's copy moves region-volume * itemsize bytes in runs
//     that stay inside the chunk (hence its data file) and the destination buffer, never overlap, and copy every
//     element to the element with the same global index. Since the chunks tile the tensor, every byte of every
//     destination is written exactly once.
// Any violation calls abort() with a message on stderr.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/base/box.h"
#include "core/base/dtype.h"
#include "core/format/checksum.h"
#include "core/format/metadata.h"
#include "core/plan/copy_plan.h"
#include "core/plan/load_planner.h"

namespace {

using namespace distckpt;

// The checking code is not what is being fuzzed: without coverage instrumentation it runs several times faster and
// does not flood libFuzzer with features of its own.
#if defined(__clang__)
#define NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define NO_COVERAGE
#endif

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "load_plan_fuzz: property violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define CHECK(cond, msg)                                           \
  do {                                                             \
    if (!(cond)) Fail(std::string(#cond) + ": " + (msg));          \
  } while (0)

// Reads values off the fuzz input; past its end every read gives zero.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t Byte() { return n_ ? (--n_, *p_++) : 0; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(Byte()) << (8 * i);
    return v;
  }
  uint32_t U32() { return static_cast<uint32_t>(U64()); }
  // Uniform-ish in [0, n) for n > 0.
  uint64_t Below(uint64_t n) {
    if (n <= 1) return 0;
    uint64_t v = n <= 256 ? Byte() : n <= 65536 ? (Byte() | (uint64_t{Byte()} << 8)) : U64();
    return v % n;
  }
  bool Bool() { return Byte() & 1; }
  bool empty() const { return n_ == 0; }

 private:
  const uint8_t* p_;
  size_t n_;
};

constexpr size_t kMaxChunks = 4096;
constexpr size_t kMaxFiles = 1024;

// An extent for one dimension: small, medium, large, near 2^63 or 2^64, or raw.
uint64_t Extent(Input& in) {
  switch (in.Byte() % 8) {
    case 0: return 0;
    case 1: case 2: return in.Below(9);
    case 3: return in.Below(300);
    case 4: return in.U64() >> (in.Byte() % 64);
    case 5: return (uint64_t{1} << 63) - in.Below(4);
    case 6: return UINT64_MAX - in.Below(4);
    default: return 1 + in.Below(70000);
  }
}

// Cut points strictly inside (0, len): at most `parts - 1` distinct ones, sorted, with 0 and len at the ends.
std::vector<uint64_t> Cuts(Input& in, uint64_t len, uint64_t parts) {
  std::vector<uint64_t> c = {0};
  if (len >= 2) {
    for (uint64_t k = 1; k < parts; ++k) c.push_back(1 + in.Below(len - 1));
  }
  c.push_back(len);
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  if (len == 0) c = {0, 0};
  return c;
}

// Chunk boxes that tile [0, shape) exactly (or, for an empty tensor, any empty boxes inside it).
std::vector<Box> Tiling(Input& in, const std::vector<uint64_t>& shape, bool empty_tensor) {
  const uint32_t ndim = static_cast<uint32_t>(shape.size());
  Box whole;
  whole.ndim = ndim;
  for (uint32_t d = 0; d < ndim; ++d) whole.length[d] = shape[d];
  std::vector<Box> boxes;
  if (empty_tensor) {
    const uint64_t n = in.Below(17);
    for (uint64_t i = 0; i < n; ++i) {
      Box b = whole;
      for (uint32_t d = 0; d < ndim; ++d) {
        b.offset[d] = in.Below(shape[d] == UINT64_MAX ? shape[d] : shape[d] + 1);
        b.length[d] = in.Below(shape[d] - b.offset[d] + 1 == 0 ? UINT64_MAX : shape[d] - b.offset[d] + 1);
      }
      if (!b.empty()) b.length[ndim == 0 ? 0 : in.Below(ndim)] = 0;
      if (ndim == 0) continue;  // a 0-d tensor is never empty
      boxes.push_back(b);
    }
    return boxes;
  }
  switch (in.Byte() % 4) {
    case 0:  // the whole tensor in one chunk
      boxes.push_back(whole);
      return boxes;
    case 1:
    case 2: {  // a grid: per dimension, up to `parts` slabs, at most kMaxChunks cells in all
      std::vector<std::vector<uint64_t>> cuts(ndim);
      uint64_t cells = 1;
      for (uint32_t d = 0; d < ndim; ++d) {
        const uint64_t room = kMaxChunks / cells;
        // Mostly a few slabs; one dimension in 16 gets up to all the room (many tiny chunks).
        const uint64_t parts = 1 + in.Below(std::min<uint64_t>(room, in.Byte() % 16 == 0 ? kMaxChunks : 6));
        cuts[d] = Cuts(in, shape[d], parts);
        cells *= cuts[d].size() - 1;
      }
      std::vector<uint64_t> idx(ndim, 0);
      while (true) {
        Box b = whole;
        for (uint32_t d = 0; d < ndim; ++d) {
          b.offset[d] = cuts[d][idx[d]];
          b.length[d] = cuts[d][idx[d] + 1] - cuts[d][idx[d]];
        }
        boxes.push_back(b);
        int d = static_cast<int>(ndim) - 1;
        while (d >= 0 && ++idx[d] == cuts[d].size() - 1) idx[d--] = 0;
        if (d < 0) break;
      }
      break;
    }
    default: {  // guillotine: split a random box along a random dimension, repeatedly
      boxes.push_back(whole);
      const uint64_t splits = in.Below(in.Byte() % 16 == 0 ? 1024 : 24);
      for (uint64_t s = 0; s < splits && boxes.size() < kMaxChunks && !in.empty(); ++s) {
        const size_t i = in.Below(boxes.size());
        if (ndim == 0) break;
        const uint32_t d = static_cast<uint32_t>(in.Below(ndim));
        Box& b = boxes[i];
        if (b.length[d] < 2) continue;
        const uint64_t at = 1 + in.Below(b.length[d] - 1);
        Box rest = b;
        rest.offset[d] += at;
        rest.length[d] -= at;
        b.length[d] = at;
        boxes.push_back(rest);
      }
      break;
    }
  }
  // Shuffle, so that chunk ids are not in grid order.
  for (size_t i = boxes.size(); i > 1; --i) std::swap(boxes[i - 1], boxes[in.Below(i)]);
  return boxes;
}

// A destination box: the whole tensor, a chunk, a random sub-box, an empty one, or (invalid) outside the tensor or of
// the wrong ndim.
Box Destination(Input& in, const std::vector<uint64_t>& shape, const std::vector<Box>& chunks, bool* valid) {
  const uint32_t ndim = static_cast<uint32_t>(shape.size());
  Box b;
  b.ndim = ndim;
  *valid = true;
  const uint8_t mode = in.Byte() % 16;
  if (mode == 0) {
    for (uint32_t d = 0; d < ndim; ++d) b.length[d] = shape[d];
  } else if (mode <= 2 && !chunks.empty()) {
    b = chunks[in.Below(chunks.size())];
  } else if (mode == 3) {  // outside: one dimension pokes past the end (if the shape allows it)
    for (uint32_t d = 0; d < ndim; ++d) b.length[d] = shape[d];
    if (ndim > 0) {
      const uint32_t d = static_cast<uint32_t>(in.Below(ndim));
      if (shape[d] < UINT64_MAX) {
        b.offset[d] = in.Below(shape[d] + 1);
        b.length[d] = shape[d] - b.offset[d] + 1;
        *valid = false;
      }
    }
  } else if (mode == 4) {  // the wrong number of dimensions
    b.ndim = static_cast<uint32_t>(in.Below(kMaxDims + 1));
    for (uint32_t d = 0; d < b.ndim; ++d) b.length[d] = in.Below(4);
    *valid = b.ndim == ndim && [&] {
      for (uint32_t d = 0; d < ndim; ++d) {
        if (b.length[d] > shape[d]) return false;
      }
      return true;
    }();
  } else if (mode == 5) {  // raw values: may lie anywhere (never overflowing offset + length)
    for (uint32_t d = 0; d < ndim; ++d) {
      b.offset[d] = in.U64();
      b.length[d] = in.Below(UINT64_MAX - b.offset[d]);
      if (b.offset[d] > shape[d] || b.length[d] > shape[d] - b.offset[d]) *valid = false;
    }
  } else {  // a random box inside, often small so that it can be checked byte by byte
    const bool small = mode < 12;
    for (uint32_t d = 0; d < ndim; ++d) {
      b.offset[d] = in.Below(shape[d] == UINT64_MAX ? UINT64_MAX : shape[d] + 1);
      const uint64_t room = shape[d] - b.offset[d];
      b.length[d] = small ? std::min<uint64_t>(room, in.Below(5)) : in.Below(room == UINT64_MAX ? room : room + 1);
    }
  }
  return b;
}

// Row-major element index of the element at byte `byte` of a buffer holding `box` -> global coordinates.
NO_COVERAGE void Coordinates(const Box& box, uint64_t byte, uint64_t itemsize, uint64_t* out) {
  CHECK(byte % itemsize == 0, "a run starts inside an element");
  uint64_t elem = byte / itemsize;
  for (int d = static_cast<int>(box.ndim) - 1; d >= 0; --d) {
    out[d] = box.offset[d] + elem % box.length[d];
    elem /= box.length[d];
  }
  CHECK(elem == 0, "a byte offset lies past the end of its buffer " + box.ToString());
}

// Run k (in increasing order) of a plan, computed independently of CopyPlan::ForEachRun.
NO_COVERAGE ByteRun RunAt(const CopyPlan& c, uint64_t k) {
  ByteRun r{c.src_base, c.dst_base, c.run_length};
  for (int d = static_cast<int>(c.outer_dims) - 1; d >= 0; --d) {
    r.src += (k % c.count[d]) * c.src_stride[d];
    r.dst += (k % c.count[d]) * c.dst_stride[d];
    k /= c.count[d];
  }
  return r;
}

NO_COVERAGE void CheckRun(const ByteRun& run, const Box& region, const Box& chunk, const Box& dest, uint64_t itemsize,
              uint64_t chunk_bytes, uint64_t dest_bytes) {
  CHECK(run.length > 0 && run.length % itemsize == 0, "run length " + std::to_string(run.length));
  CHECK(run.src <= chunk_bytes && run.length <= chunk_bytes - run.src, "a run leaves its chunk");
  CHECK(run.dst <= dest_bytes && run.length <= dest_bytes - run.dst, "a run leaves its destination");
  const uint64_t n = run.length / itemsize;
  // Every element of short runs; the first, second and last of long ones.
  for (uint64_t e = 0; e < n; e = (n <= 4 || e + 1 == n || e == 0) ? e + 1 : n - 1) {
    uint64_t s[kMaxDims], t[kMaxDims];
    Coordinates(chunk, run.src + e * itemsize, itemsize, s);
    Coordinates(dest, run.dst + e * itemsize, itemsize, t);
    for (uint32_t d = 0; d < region.ndim; ++d) {
      CHECK(s[d] == t[d], "a run copies an element to another index");
      CHECK(s[d] >= region.offset[d] && s[d] < region.end(d), "a run copies an element outside its region");
    }
  }
}

NO_COVERAGE void CheckOp(const TensorReadOp& op, const Box& chunk, const Box& dest, uint64_t itemsize,
             const ChunkLocation& loc, uint64_t file_size) {
  const CopyPlan& c = op.copy;
  const uint64_t chunk_bytes = chunk.volume() * itemsize, dest_bytes = dest.volume() * itemsize;
  CHECK(chunk_bytes == loc.length, "chunk length");
  CHECK(loc.offset <= file_size && loc.length <= file_size - loc.offset, "chunk outside its file");
  CHECK(c.outer_dims <= kMaxDims, "outer_dims");
  CHECK(c.total_bytes() == op.region.volume() * itemsize,
        "plan moves " + std::to_string(c.total_bytes()) + " bytes for region " + op.region.ToString());
  CHECK(c.src_end() <= chunk_bytes, "plan reads past its chunk");
  const uint64_t runs = c.num_runs();
  if (runs <= 64) {
    uint64_t k = 0;
    ByteRun prev{};
    c.ForEachRun([&](const ByteRun& run) {
      CHECK(run == RunAt(c, k), "ForEachRun and the strides disagree");
      if (k > 0) {
        CHECK(run.src >= prev.src + prev.length, "runs overlap or go back in the source");
        CHECK(run.dst >= prev.dst + prev.length, "runs overlap or go back in the destination");
      }
      CheckRun(run, op.region, chunk, dest, itemsize, chunk_bytes, dest_bytes);
      prev = run;
      ++k;
    });
    CHECK(k == runs, "ForEachRun gave " + std::to_string(k) + " runs, num_runs says " + std::to_string(runs));
  } else {
    const uint64_t picks[] = {0, 1, runs / 2, runs - 2, runs - 1};
    for (uint64_t k : picks) CheckRun(RunAt(c, k), op.region, chunk, dest, itemsize, chunk_bytes, dest_bytes);
    CHECK(RunAt(c, runs - 1).src + c.run_length == c.src_end(), "src_end is not the end of the last run");
  }
}

// Ids of the chunks whose box meets `q` (none for an empty q).
NO_COVERAGE std::vector<uint32_t> BruteForceQuery(const std::vector<Box>& boxes, const Box& q) {
  std::vector<uint32_t> out;
  Box unused;
  if (q.empty()) return out;
  for (uint32_t c = 0; c < boxes.size(); ++c) {
    if (Intersect(boxes[c], q, &unused)) out.push_back(c);
  }
  return out;
}

// (chunk, dest) pairs that meet, in (chunk, dest) order.
NO_COVERAGE std::vector<std::pair<uint32_t, uint32_t>> BruteForcePairs(const std::vector<Box>& boxes,
                                                                       const std::vector<Box>& dests) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  Box r;
  for (uint32_t c = 0; c < boxes.size(); ++c) {
    for (uint32_t k = 0; k < dests.size(); ++k) {
      if (!dests[k].empty() && Intersect(boxes[c], dests[k], &r)) out.emplace_back(c, k);
    }
  }
  return out;
}

struct Planned {
  std::string name;
  std::vector<uint64_t> shape;
  std::vector<Box> boxes;
  DType dtype;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  MetadataRecord record;
  record.writer = "load_plan_fuzz";
  record.alignment = kChunkAlignment << in.Below(8);
  const size_t nfiles = 1 + in.Below(in.Byte() % 16 == 0 ? kMaxFiles : 8);
  for (size_t f = 0; f < nfiles; ++f) record.files.push_back({"rank-" + std::to_string(f) + ".bin", 0});
  std::vector<uint64_t> cursor(nfiles, 0);

  bool expect_valid = true;
  std::vector<Planned> planned;
  uint64_t max_chunk = 0;
  const size_t nentries = 1 + in.Below(4);
  size_t total_chunks = 0;
  for (size_t i = 0; i < nentries; ++i) {
    EntryRecord e;
    e.name = "t" + std::to_string(i);
    const bool bytes = in.Byte() % 8 == 0;
    std::vector<Box> boxes;
    if (bytes) {
      e.kind = EntryKind::kBytes;
      e.dtype = DType::kU8;
      e.shape = {in.Below(1 << 20)};
      Box b;
      b.ndim = 1;
      b.length[0] = e.shape[0];
      boxes.push_back(b);
    } else {
      e.dtype = static_cast<DType>(1 + in.Below(kNumDTypes - 1));
      const uint32_t ndim = static_cast<uint32_t>(in.Below(kMaxDims + 1));
      for (uint32_t d = 0; d < ndim; ++d) e.shape.push_back(Extent(in));
      const Result<uint64_t> nbytes = CheckedVolume(e.shape, DTypeSize(e.dtype));
      if (!nbytes.ok()) {
        // Overflowing shape: the writer must refuse it. Keep it as the only entry, with one chunk.
        expect_valid = false;
      }
      const bool empty_tensor = nbytes.ok() && *nbytes == 0;
      boxes = Tiling(in, e.shape, empty_tensor);
      if (boxes.size() + total_chunks > 2 * kMaxChunks && !empty_tensor) {  // keep the whole metadata small
        Box whole;
        whole.ndim = static_cast<uint32_t>(e.shape.size());
        for (uint32_t d = 0; d < whole.ndim; ++d) whole.length[d] = e.shape[d];
        boxes = {whole};
      }
      if (!empty_tensor && !boxes.empty() && in.Byte() == 0xA5) {  // replicated box: overlapping chunks
        boxes.push_back(boxes[in.Below(boxes.size())]);
        expect_valid = false;
      }
    }
    total_chunks += boxes.size();
    const uint64_t itemsize = DTypeSize(e.dtype);
    for (const Box& b : boxes) {
      for (uint32_t d = 0; d < b.ndim; ++d) {
        e.chunk_offsets.push_back(b.offset[d]);
        e.chunk_lengths.push_back(b.length[d]);
      }
      ChunkLocation loc;
      loc.length = expect_valid ? b.volume() * itemsize : 0;  // an overflowing shape may overflow here too
      loc.file = static_cast<uint32_t>(in.Below(nfiles));
      // Usually the next aligned place in the file; sometimes the same bytes as another chunk (allowed: the format
      // does not forbid it), or wherever the cursor would overflow.
      uint64_t& at = cursor[loc.file];
      const uint64_t aligned = (at + record.alignment - 1) & ~(record.alignment - 1);
      if (in.Byte() % 16 == 0 || aligned < at || aligned > UINT64_MAX - loc.length) {
        loc.offset = 0;
        at = std::max(at, loc.length);
      } else {
        loc.offset = aligned;
        at = aligned + loc.length;
      }
      loc.checksum = in.U64();
      max_chunk = std::max(max_chunk, loc.length);
      e.chunks.push_back(loc);
    }
    planned.push_back({e.name, e.shape, boxes, e.dtype});
    record.entries.push_back(std::move(e));
  }
  for (size_t f = 0; f < nfiles; ++f) {
    const uint64_t slack = in.Below(3) * record.alignment;
    record.files[f].size = cursor[f] > UINT64_MAX - slack ? cursor[f] : cursor[f] + slack;
  }
  // A checksum block size that keeps every block table short (at most 8 blocks per chunk).
  uint64_t block = kChunkAlignment;
  while (block < (uint64_t{1} << 63) && NumChecksumBlocks(max_chunk, block) > 8) block <<= 1;
  record.checksum_block_size = block << in.Below(63 - __builtin_ctzll(block) + 1);
  for (EntryRecord& e : record.entries) {
    for (ChunkLocation& loc : e.chunks) {
      const uint64_t nb = NumChecksumBlocks(loc.length, record.checksum_block_size);
      if (nb == 1) continue;
      loc.first_block = static_cast<uint32_t>(e.block_checksums.size());
      std::vector<uint64_t> blocks;
      for (uint64_t k = 0; k < nb; ++k) blocks.push_back(in.U64());
      loc.checksum = CombineBlockChecksums(blocks);
      e.block_checksums.insert(e.block_checksums.end(), blocks.begin(), blocks.end());
    }
  }

  const Result<std::string> encoded = EncodeMetadata(record);
  if (!expect_valid) {
    CHECK(!encoded.ok(), "the writer accepted an overflowing shape or overlapping chunks");
    return 0;
  }
  if (!encoded.ok()) {
    // The tiling checker's work limit is the one legitimate refusal of a valid description.
    CHECK(encoded.status().code() == StatusCode::kUnsupported, "valid description refused: " + encoded.status().message());
    return 0;
  }
  const Result<MetadataView> view = MetadataView::Parse(std::make_shared<const std::string>(*encoded), "fuzz");
  CHECK(view.ok(), "the reader refused what the writer wrote: " + view.status().message());
  CHECK(view->checksum_block_size() == record.checksum_block_size, "checksum_block_size");

  std::vector<uint32_t> hits;
  for (const Planned& p : planned) {
    const std::optional<size_t> idx = view->Find(p.name);
    CHECK(idx.has_value(), "entry " + p.name + " is missing");
    const EntryView e = view->entry(*idx);
    CHECK(e.num_chunks == p.boxes.size(), "chunk count of " + p.name);
    CHECK(std::equal(e.shape.begin(), e.shape.end(), p.shape.begin(), p.shape.end()), "shape of " + p.name);
    for (size_t c = 0; c < e.num_chunks; ++c) CHECK(e.chunk_box(c) == p.boxes[c], "chunk box of " + p.name);
    const uint64_t itemsize = DTypeSize(e.dtype);
    const ChunkIndex index(e);
    CHECK(index.num_chunks() == p.boxes.size(), "the index lost chunks of " + p.name);

    const size_t ndests = 1 + in.Below(8);
    std::vector<Box> dests;
    bool all_valid = true;
    for (size_t k = 0; k < ndests; ++k) {
      bool valid = true;
      dests.push_back(Destination(in, p.shape, p.boxes, &valid));
      all_valid = all_valid && valid;
    }
    // ChunkIndex::Query against brute force, for every destination of the right ndim.
    for (const Box& q : dests) {
      if (q.ndim != e.ndim()) continue;
      hits.clear();
      index.Query(q, &hits);
      const std::vector<uint32_t> expected = BruteForceQuery(p.boxes, q);
      CHECK(hits == expected, "Query(" + q.ToString() + ") on " + p.name + " found " + std::to_string(hits.size()) +
                                  " chunks, brute force " + std::to_string(expected.size()));
    }

    const Result<std::vector<TensorReadOp>> ops = PlanTensorRead(e, index, dests);
    if (!all_valid) {
      CHECK(!ops.ok() && ops.status().code() == StatusCode::kInvalidArgument,
            "PlanTensorRead accepted a destination outside the tensor or of the wrong ndim");
      continue;
    }
    CHECK(ops.ok(), "PlanTensorRead refused valid destinations: " + ops.status().message());
    // Exactly one op per (chunk, dest) that meet, in (chunk, dest) order, with the intersection as region.
    const std::vector<std::pair<uint32_t, uint32_t>> expected = BruteForcePairs(p.boxes, dests);
    CHECK(ops->size() == expected.size(),
          std::to_string(ops->size()) + " ops, expected " + std::to_string(expected.size()));
    for (size_t i = 0; i < ops->size(); ++i) {
      const TensorReadOp& op = (*ops)[i];
      CHECK(op.chunk == expected[i].first && op.dest == expected[i].second, "op order or pairing");
      Box r;
      Intersect(p.boxes[op.chunk], dests[op.dest], &r);
      CHECK(op.region == r, "op region " + op.region.ToString() + " is not the intersection " + r.ToString());
      const ChunkLocation loc = e.chunk(op.chunk);
      CheckOp(op, p.boxes[op.chunk], dests[op.dest], itemsize, loc, view->file_size(loc.file));
    }
  }
  return 0;
}
