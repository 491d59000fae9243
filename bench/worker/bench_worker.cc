// distckpt's side of bench/run: one process per rank, started by tools/launcher's `launch` (Gloo over loopback TCP),
// like examples/transformer_demo.cc. Every mode times only the distckpt call (all ranks start together after a
// barrier; the figure is the slowest rank's), checks what it loaded, and rank 0 prints one line
//   RESULT {"mode": ..., ...}
// that bench/run parses. The state comes from a spec file written by bench/run (bench/spec.py), the same one the
// torch.distributed.checkpoint side reads, so both systems save and load identical tensors and shardings.
//
//   launch -n 4 -- bench_worker --mode save  --spec S --dir D [--io-threads N] [--no-sync] [--unaligned]
//                                           [--no-chunk-hashes]   (what the second hash of every byte costs)
//   launch -n 3 -- bench_worker --mode load  --spec S --dir D [--no-verify] [--no-check] [--no-map] [--no-share]
//   launch -n 4 -- bench_worker --mode async --spec S --dir D
//   launch -n 3 -- bench_worker --mode reshard-limit --spec S --dir D [--repeat N] [--private]   a reshard's least work
//   bench_worker --mode memcpy [--mib N]           memcpy bandwidth, one thread and every core
//   bench_worker --mode open --dir D --name T      metadata open + one lookup, in a fresh process
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/process_stats.h"
#include "core/base/wire.h"
#include "core/comm/gloo/gloo.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/engine/save_async.h"
#include "core/format/checksum.h"
#include "core/storage/storage.h"

namespace distckpt {
namespace {

using bench::Now;

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "bench_worker: %s\n", msg.c_str());
  std::exit(1);
}

// One line of the spec: "<name> <dtype> <replicated 0|1> <dim0> [<dim1>]". Sharded tensors are split by rows when
// saving and by columns when loading; replicated ones are whole on every rank when saving and split by rows when
// loading (bench/spec.py writes the file; peers.py applies the same rule).
struct Spec {
  std::string name;
  DType dtype;
  bool replicated;
  std::vector<uint64_t> shape;
};

std::vector<Spec> ReadSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) Die("cannot read the spec " + path);
  std::vector<Spec> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    Spec s;
    std::string dtype;
    int rep = 0;
    ls >> s.name >> dtype >> rep;
    s.replicated = rep != 0;
    if (dtype == "F32") s.dtype = DType::kF32;
    else if (dtype == "BF16") s.dtype = DType::kBF16;
    else Die("unknown dtype " + dtype);
    uint64_t d;
    while (ls >> d) s.shape.push_back(d);
    out.push_back(std::move(s));
  }
  return out;
}

// Part `k` of `n` of dimension `dim`: torch.chunk's rule (ceil-sized parts), which DTensor's Shard uses too.
Box Part(const std::vector<uint64_t>& shape, uint32_t dim, uint64_t n, uint64_t k) {
  Box b = Box::Whole(shape).value();
  const uint64_t size = (shape[dim] + n - 1) / n;
  b.offset[dim] = std::min(shape[dim], size * k);
  b.length[dim] = std::min(shape[dim], size * (k + 1)) - b.offset[dim];
  return b;
}

Box SaveBox(const Spec& s, uint64_t world, uint64_t rank) {
  return s.replicated ? Box::Whole(s.shape).value() : Part(s.shape, 0, world, rank);
}
Box LoadBox(const Spec& s, uint64_t world, uint64_t rank) {
  return s.replicated ? Part(s.shape, 0, world, rank)
                      : Part(s.shape, static_cast<uint32_t>(s.shape.size() - 1), world, rank);
}

// Element values depend only on (tensor, global index), so any sharding can be checked after a load. 32-bit words
// (f32) get the full value, bf16 its low half.
inline uint32_t Value(uint64_t t, uint64_t i) {
  uint64_t x = (t + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  return static_cast<uint32_t>(x ^ (x >> 29));
}

// Calls fn(row index in box, global index of the row's first element, elements in the row) for each box row.
template <typename Fn>
void ForRows(const Spec& s, const Box& box, Fn fn) {
  const bool two_d = box.ndim == 2;
  const uint64_t cols = two_d ? s.shape[1] : 1, rows = two_d ? box.length[0] : 1;
  const uint64_t inner = two_d ? box.length[1] : box.length[0];
  for (uint64_t r = 0; r < rows; ++r) {
    fn(r, two_d ? (box.offset[0] + r) * cols + box.offset[1] : box.offset[0], inner);
  }
}

void Fill(const Spec& s, uint64_t t, const Box& box, uint8_t* out) {
  ForRows(s, box, [&](uint64_t r, uint64_t g, uint64_t n) {
    if (s.dtype == DType::kBF16) {
      uint16_t* p = reinterpret_cast<uint16_t*>(out) + r * n;
      for (uint64_t c = 0; c < n; ++c) p[c] = static_cast<uint16_t>(Value(t, g + c));
    } else {
      uint32_t* p = reinterpret_cast<uint32_t*>(out) + r * n;
      for (uint64_t c = 0; c < n; ++c) p[c] = Value(t, g + c);
    }
  });
}

bool Check(const Spec& s, uint64_t t, const Box& box, const uint8_t* in) {
  bool ok = true;
  ForRows(s, box, [&](uint64_t r, uint64_t g, uint64_t n) {
    for (uint64_t c = 0; ok && c < n; ++c) {
      if (s.dtype == DType::kBF16) ok = reinterpret_cast<const uint16_t*>(in)[r * n + c] == uint16_t(Value(t, g + c));
      else ok = reinterpret_cast<const uint32_t*>(in)[r * n + c] == Value(t, g + c);
    }
  });
  return ok;
}

// Every rank's value of a per-rank number, in rank order.
std::vector<double> Gather(Communicator* comm, double mine) {
  WireWriter w;
  uint64_t bits;
  std::memcpy(&bits, &mine, sizeof bits);
  w.U64(bits);
  std::vector<std::string> all;
  if (!comm->AllGather(w.Take(), &all, kDefaultCollectiveTimeout).ok()) Die("allgather failed");
  std::vector<double> out;
  for (const std::string& s : all) {
    WireReader r(s);
    uint64_t v = 0;
    r.U64(&v);
    double d;
    std::memcpy(&d, &v, sizeof d);
    out.push_back(d);
  }
  return out;
}
double Max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

std::string Json(const std::vector<double>& v) {
  std::string s = "[";
  char buf[64];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.6g", i ? ", " : "", v[i]);
    s += buf;
  }
  return s + "]";
}

struct Args {
  std::string mode, spec, dir, name;
  size_t io_threads = 0;
  bool sync = true, verify = true, check = true, chunk_hashes = true;
  bool map = true, share = true;  // ReadOptions::map_files, ::share_verification
  bool private_copy = false;      // reshard-limit: also time the work from a private copy of the files
  bool unaligned = false;  // pieces start 64 bytes into a page (as torch's CPU allocator aligns them), not on one
  uint64_t mib = 1024;
  int repeat = 5;
};

struct Piece {
  size_t t;
  Box box;
  uint8_t* data = nullptr;
  uint64_t size = 0;
  uint8_t* base = nullptr;  // the allocation holding data
};

// The rank's state: every tensor of the spec with this rank's box, in page-aligned buffers (touched, so they are
// resident before the baseline RSS is taken).
struct RankState {
  std::vector<Spec> specs;
  std::vector<Piece> pieces;
  State state;
  uint64_t bytes = 0;
  ~RankState() {
    for (Piece& p : pieces) std::free(p.base);
  }
};

void BuildState(RankState* rs, const Args& a, bool saving, uint64_t world, uint64_t rank) {
  rs->specs = ReadSpec(a.spec);
  for (size_t t = 0; t < rs->specs.size(); ++t) {
    const Spec& s = rs->specs[t];
    if (!rs->state.AddTensor(s.name, s.dtype, s.shape).ok()) Die("bad tensor " + s.name);
    Piece p{t, saving ? SaveBox(s, world, rank) : LoadBox(s, world, rank)};
    p.size = p.box.volume() * DTypeSize(s.dtype);
    if (p.size == 0) continue;
    p.base = static_cast<uint8_t*>(std::aligned_alloc(4096, (p.size + 4096 + 4095) / 4096 * 4096));
    if (p.base == nullptr) Die("out of memory");
    p.data = p.base + (a.unaligned ? 64 : 0);
    if (saving) Fill(s, t, p.box, p.data);
    else std::memset(p.data, 0xAB, p.size);
    rs->bytes += p.size;
    rs->pieces.push_back(p);
  }
  for (const Piece& p : rs->pieces) {
    const Spec& s = rs->specs[p.t];
    std::vector<uint64_t> off(p.box.offset, p.box.offset + p.box.ndim), len(p.box.length, p.box.length + p.box.ndim);
    if (!rs->state.AddPiece(s.name, off, len, p.data).ok()) Die("bad piece " + s.name);
  }
}

// memcpy of this rank's pieces into fresh buffers (a clone of the state, page faults included) and into buffers
// already faulted in. Returns {fresh seconds, prefaulted seconds}.
std::pair<double, double> TimeStateCopy(const RankState& rs) {
  std::vector<uint8_t*> dst;
  double t0 = Now();
  for (const Piece& p : rs.pieces) {
    dst.push_back(static_cast<uint8_t*>(std::aligned_alloc(4096, (p.size + 4095) / 4096 * 4096)));
    std::memcpy(dst.back(), p.data, p.size);
  }
  const double fresh = Now() - t0;
  t0 = Now();
  for (size_t i = 0; i < rs.pieces.size(); ++i) std::memcpy(dst[i], rs.pieces[i].data, rs.pieces[i].size);
  const double warm = Now() - t0;
  for (uint8_t* d : dst) std::free(d);
  return {fresh, warm};
}

int RunSave(const Args& a, Communicator* comm) {
  const uint64_t rank = comm->rank(), world = comm->size();
  RankState rs;
  BuildState(&rs, a, true, world, rank);
  const std::string path = a.dir + "/ckpt";
  if (rank == 0) (void)DefaultStorage()->RemoveAll(path);
  const double rss_base = static_cast<double>(bench::CurrentRssBytes());
  (void)comm->Barrier(kDefaultCollectiveTimeout);
  SaveOptions so;
  so.sync = a.sync;
  so.io_threads = a.io_threads;
  so.chunk_hashes = a.chunk_hashes;
  const double t0 = Now();
  auto saved = Save(path, rs.state, comm, so);
  const double dt = Now() - t0;
  if (!saved.ok()) Die("save failed: " + saved.status().ToString());
  auto secs = Gather(comm, dt);
  auto peak = Gather(comm, static_cast<double>(bench::PeakRssBytes()));
  auto base = Gather(comm, rss_base);
  auto held = Gather(comm, static_cast<double>(rs.bytes));
  if (rank == 0) {
    std::printf("RESULT {\"mode\": \"save\", \"seconds\": %.6f, \"bytes\": %" PRIu64 ", \"metadata_bytes\": %" PRIu64
                ", \"rank_seconds\": %s, \"rss_peak\": %s, \"rss_base\": %s, \"state_bytes\": %s}\n",
                Max(secs), saved->total_bytes, saved->metadata_bytes, Json(secs).c_str(), Json(peak).c_str(),
                Json(base).c_str(), Json(held).c_str());
  }
  return 0;
}

int RunLoad(const Args& a, Communicator* comm) {
  const uint64_t rank = comm->rank(), world = comm->size();
  RankState rs;
  BuildState(&rs, a, false, world, rank);
  const double rss_base = static_cast<double>(bench::CurrentRssBytes());
  (void)comm->Barrier(kDefaultCollectiveTimeout);
  ReadOptions ro;
  ro.verify = a.verify;
  ro.io_threads = a.io_threads;
  ro.map_files = a.map;
  ro.share_verification = a.share;
  const double t0 = Now();
  auto loaded = Load(a.dir + "/ckpt", rs.state, comm, ro);
  const double dt = Now() - t0;
  if (!loaded.ok()) Die("load failed: " + loaded.status().ToString());
  const double peak_rss = static_cast<double>(bench::PeakRssBytes());
  double bad = 0;
  if (a.check) {
    for (const Piece& p : rs.pieces) {
      if (!Check(rs.specs[p.t], p.t, p.box, p.data)) {
        std::fprintf(stderr, "rank %" PRIu64 ": wrong values in %s\n", rank, rs.specs[p.t].name.c_str());
        ++bad;
      }
    }
  }
  auto secs = Gather(comm, dt);
  auto peak = Gather(comm, peak_rss);
  auto base = Gather(comm, rss_base);
  auto held = Gather(comm, static_cast<double>(rs.bytes));
  auto read = Gather(comm, static_cast<double>(loaded->io.bytes_read));
  auto mapped = Gather(comm, static_cast<double>(loaded->io.bytes_mapped));
  auto verified = Gather(comm, static_cast<double>(loaded->io.bytes_verified));
  auto bads = Gather(comm, bad);
  double bytes = 0;
  for (double h : held) bytes += h;
  if (rank == 0) {
    std::printf(
        "RESULT {\"mode\": \"load\", \"seconds\": %.6f, \"bytes\": %.0f, \"bytes_read\": %s, "
        "\"bytes_mapped\": %s, \"bytes_verified\": %s, \"bad\": %.0f, "
        "\"checked\": %s, \"rank_seconds\": %s, \"rss_peak\": %s, \"rss_base\": %s, \"state_bytes\": %s}\n",
        Max(secs), bytes, Json(read).c_str(), Json(mapped).c_str(), Json(verified).c_str(), Max(bads),
        a.check ? "true" : "false", Json(secs).c_str(), Json(peak).c_str(), Json(base).c_str(), Json(held).c_str());
  }
  return Max(bads) == 0 ? 0 : 1;
}

int RunAsync(const Args& a, Communicator* comm) {
  const uint64_t rank = comm->rank(), world = comm->size();
  RankState rs;
  BuildState(&rs, a, true, world, rank);
  const std::string path = a.dir + "/ckpt";
  if (rank == 0) (void)DefaultStorage()->RemoveAll(path);
  // The reference: every rank copies its own state at the same moment, as the async save's staging does.
  (void)comm->Barrier(kDefaultCollectiveTimeout);
  auto [fresh, warm] = TimeStateCopy(rs);
  auto fresh_all = Gather(comm, fresh), warm_all = Gather(comm, warm);
  SaveOptions so;
  so.sync = a.sync;
  so.io_threads = a.io_threads;
  // Two saves of the whole state, as a training loop makes every N steps: the first stages into fresh memory, the
  // second into the staging buffer the first one left in the pool (the steady state).
  double stall[2], total[2];
  uint64_t bytes = 0;
  const double rss_base = static_cast<double>(bench::CurrentRssBytes());
  for (int k = 0; k < 2; ++k) {
    const std::string where = path + (k == 0 ? "-first" : "");
    if (rank == 0) (void)DefaultStorage()->RemoveAll(where);
    (void)comm->Barrier(kDefaultCollectiveTimeout);
    const double t0 = Now();
    auto fut = SaveAsync(where, rs.state, comm, so);
    stall[k] = Now() - t0;
    if (!fut.ok()) Die("async save failed: " + fut.status().ToString());
    auto done = (*fut)->Wait(std::chrono::hours(1));
    total[k] = Now() - t0;
    if (!done.ok()) Die("async save failed: " + done.status().ToString());
    bytes = done->total_bytes;
  }
  auto stalls0 = Gather(comm, stall[0]), totals0 = Gather(comm, total[0]);
  auto stalls = Gather(comm, stall[1]), totals = Gather(comm, total[1]);
  auto peak = Gather(comm, static_cast<double>(bench::PeakRssBytes()));
  auto base = Gather(comm, rss_base);
  auto held = Gather(comm, static_cast<double>(rs.bytes));
  if (rank == 0) {
    (void)DefaultStorage()->RemoveAll(path + "-first");
    std::printf(
        "RESULT {\"mode\": \"async\", \"first_stall\": %.6f, \"first_total\": %.6f, \"stall\": %.6f, "
        "\"total\": %.6f, \"bytes\": %" PRIu64
        ", \"memcpy_fresh\": %.6f, \"memcpy_prefaulted\": %.6f, "
        "\"rank_stall\": %s, \"rss_peak\": %s, \"rss_base\": %s, \"state_bytes\": %s}\n",
        Max(stalls0), Max(totals0), Max(stalls), Max(totals), bytes, Max(fresh_all), Max(warm_all),
        Json(stalls).c_str(), Json(peak).c_str(), Json(base).c_str(), Json(held).c_str());
  }
  return 0;
}

// The least work a resharded load must do on this machine, measured on the checkpoint the load bench reads: each
// rank gets its pieces from the page cache into its own (faulted-in) buffers, and every needed 1 MiB checksum block
// is hashed by one of the ranks that need it — nothing else (no plan, no collectives, no bounds checks, no error
// paths). Two ways in, each timed from a barrier to the slowest rank:
//   map:  every data file mapped, the bytes copied from the mapping, the mappings dropped at the end: the page faults
//         and page-table work any loader reading through mmap pays, once per process;
//   read: each needed block pread into a 1 MiB buffer and copied from there: a kernel copy of every needed block
//         instead of the page-table work.
// The verified-copy limit of --mode memcpy has neither cost (its source is private memory already mapped), nor the
// strided access of a column reshard (each rank wants a third of every row, so it reads pages it takes little from).
struct Rect {  // rows [r0, r0 + rn), columns [c0, c0 + cn), in elements; a 1-d box is one row
  uint64_t r0, rn, c0, cn;
};
Rect AsRect(const Box& b) {
  return b.ndim == 2 ? Rect{b.offset[0], b.length[0], b.offset[1], b.length[1]} : Rect{0, 1, b.offset[0], b.length[0]};
}
bool Intersect(const Rect& a, const Rect& b, Rect* out) {
  const uint64_t r0 = std::max(a.r0, b.r0), r1 = std::min(a.r0 + a.rn, b.r0 + b.rn);
  const uint64_t c0 = std::max(a.c0, b.c0), c1 = std::min(a.c0 + a.cn, b.c0 + b.cn);
  if (r0 >= r1 || c0 >= c1) return false;
  *out = Rect{r0, r1 - r0, c0, c1 - c0};
  return true;
}

int RunReshardLimit(const Args& a, Communicator* comm) {
  const uint64_t rank = comm->rank(), world = comm->size();
  RankState rs;
  BuildState(&rs, a, false, world, rank);
  auto reader = Reader::Open(a.dir + "/ckpt", nullptr, ReadOptions{});
  if (!reader.ok()) Die("open failed: " + reader.status().ToString());
  const MetadataView& meta = (*reader)->metadata();
  const uint64_t block = meta.checksum_block_size();
  std::vector<std::string> paths;
  std::vector<uint64_t> sizes;
  for (size_t f = 0; f < meta.num_files(); ++f) {
    paths.push_back(a.dir + "/ckpt/" + std::string(meta.file_name(f)));
    sizes.push_back(meta.file_size(f));
  }
  // One unit of work: block k of chunk c of a piece's tensor, with the rects that say what to copy from it.
  struct Unit {
    const Piece* piece;
    Rect chunk, mine;
    uint32_t file;
    uint64_t offset, length, lo, hi;  // the chunk in its file; the block's byte range within the chunk
    bool hash;
  };
  std::vector<Unit> units;
  uint64_t serial = 0;
  for (const Piece& p : rs.pieces) {
    const Spec& s = rs.specs[p.t];
    auto idx = meta.Find(s.name);
    if (!idx) Die("no entry " + s.name);
    const EntryView e = meta.entry(*idx);
    const uint64_t es = DTypeSize(s.dtype);
    std::vector<Rect> wanted(world);
    for (uint64_t r = 0; r < world; ++r) wanted[r] = AsRect(LoadBox(s, world, r));
    for (size_t c = 0; c < e.num_chunks; ++c, ++serial) {
      const Rect chunk = AsRect(e.chunk_box(c));
      Rect mine;
      if (!Intersect(chunk, AsRect(p.box), &mine)) continue;
      const ChunkLocation loc = e.chunk(c);
      const uint64_t row_bytes = chunk.cn * es;
      for (uint64_t lo = 0, k = 0; lo < loc.length; lo += block, ++k) {
        const uint64_t hi = std::min(loc.length, lo + block);
        // The ranks whose rows this block holds; one of them (in turn) hashes it.
        std::vector<uint64_t> needing;
        for (uint64_t r = 0; r < world; ++r) {
          Rect x;
          if (!Intersect(chunk, wanted[r], &x)) continue;
          const uint64_t first = chunk.r0 + lo / row_bytes, last = chunk.r0 + (hi - 1) / row_bytes;
          if (x.r0 <= last && x.r0 + x.rn > first) needing.push_back(r);
        }
        if (std::find(needing.begin(), needing.end(), rank) == needing.end()) continue;
        units.push_back({&p, chunk, mine, loc.file, loc.offset, loc.length, lo, hi,
                         needing[(serial + k) % needing.size()] == rank});
      }
    }
  }
  // Copies what `u` holds of this rank's piece from `src` (the block's bytes).
  auto copy = [&](const Unit& u, const char* src) {
    const Spec& s = rs.specs[u.piece->t];
    const uint64_t es = DTypeSize(s.dtype);
    const Rect dst = AsRect(u.piece->box);
    const uint64_t row_bytes = u.chunk.cn * es;
    const uint64_t first = u.lo / row_bytes, last = (u.hi - 1) / row_bytes;
    for (uint64_t i = std::max(first, u.mine.r0 - u.chunk.r0); i <= last && i < u.mine.r0 + u.mine.rn - u.chunk.r0;
         ++i) {
      const uint64_t from = i * row_bytes + (u.mine.c0 - u.chunk.c0) * es, to = from + u.mine.cn * es;
      const uint64_t x0 = std::max(from, u.lo), x1 = std::min(to, u.hi);
      if (x0 >= x1) continue;
      uint8_t* d = u.piece->data + ((u.chunk.r0 + i - dst.r0) * dst.cn + (u.mine.c0 - dst.c0)) * es + (x0 - from);
      std::memcpy(d, src + (x0 - u.lo), x1 - x0);
    }
  };
  uint64_t sink = 0;
  auto run_map = [&] {
    std::vector<const char*> maps(paths.size(), nullptr);
    std::vector<int> fds(paths.size(), -1);
    for (const Unit& u : units) {
      if (maps[u.file] != nullptr) continue;
      fds[u.file] = ::open(paths[u.file].c_str(), O_RDONLY | O_CLOEXEC);
      void* m = ::mmap(nullptr, sizes[u.file], PROT_READ, MAP_SHARED, fds[u.file], 0);
      if (fds[u.file] < 0 || m == MAP_FAILED) Die("cannot map " + paths[u.file]);
      maps[u.file] = static_cast<const char*>(m);
    }
    for (const Unit& u : units) {
      const char* src = maps[u.file] + u.offset + u.lo;
      if (u.hash) sink += Xxh3(src, u.hi - u.lo);
      copy(u, src);
    }
    for (size_t f = 0; f < maps.size(); ++f) {
      if (maps[f] != nullptr) ::munmap(const_cast<char*>(maps[f]), sizes[f]);
      if (fds[f] >= 0) ::close(fds[f]);
    }
  };
  auto run_read = [&] {
    std::vector<int> fds(paths.size(), -1);
    char* buf = static_cast<char*>(std::aligned_alloc(4096, block));
    std::memset(buf, 0, block);
    for (const Unit& u : units) {
      if (fds[u.file] < 0) fds[u.file] = ::open(paths[u.file].c_str(), O_RDONLY | O_CLOEXEC);
      const uint64_t n = u.hi - u.lo;
      if (::pread(fds[u.file], buf, n, static_cast<off_t>(u.offset + u.lo)) != static_cast<ssize_t>(n)) {
        Die("cannot read " + paths[u.file]);
      }
      if (u.hash) sink += Xxh3(buf, n);
      copy(u, buf);
    }
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    std::free(buf);
  };
  // The same work from a private copy of the files, read into this process's memory before the clock starts: the
  // verified-copy limit with this reshard's access pattern and process count, without the page cache.
  std::vector<char*> copies(paths.size(), nullptr);
  auto run_private = [&] {
    for (const Unit& u : units) {
      const char* src = copies[u.file] + u.offset + u.lo;
      if (u.hash) sink += Xxh3(src, u.hi - u.lo);
      copy(u, src);
    }
  };
  if (a.private_copy) {
    for (const Unit& u : units) {
      if (copies[u.file] != nullptr) continue;
      copies[u.file] = static_cast<char*>(std::aligned_alloc(4096, (sizes[u.file] + 4095) / 4096 * 4096));
      const int fd = ::open(paths[u.file].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || copies[u.file] == nullptr ||
          ::pread(fd, copies[u.file], sizes[u.file], 0) != static_cast<ssize_t>(sizes[u.file])) {
        Die("cannot copy " + paths[u.file]);
      }
      ::close(fd);
    }
  }
  const int methods = a.private_copy ? 3 : 2;
  std::vector<std::vector<double>> secs(3);
  double bad = 0;
  for (int r = 0; r < a.repeat; ++r) {
    for (int m = 0; m < methods; ++m) {
      const int method = (r + m) % methods;  // each method goes first in turn
      for (const Piece& p : rs.pieces) std::memset(p.data, 0xAB, p.size);
      (void)comm->Barrier(kDefaultCollectiveTimeout);
      const double t0 = Now();
      method == 0 ? run_map() : method == 1 ? run_read() : run_private();
      secs[method].push_back(Max(Gather(comm, Now() - t0)));
      for (const Piece& p : rs.pieces) bad += Check(rs.specs[p.t], p.t, p.box, p.data) ? 0 : 1;
    }
  }
  for (char* c : copies) std::free(c);
  const std::vector<double>& map_s = secs[0];
  const std::vector<double>& read_s = secs[1];
  const double bads = Max(Gather(comm, bad));
  double bytes = 0;
  for (double h : Gather(comm, static_cast<double>(rs.bytes))) bytes += h;
  if (rank == 0) {
    std::printf(
        "RESULT {\"mode\": \"reshard-limit\", \"bytes\": %.0f, \"map_seconds\": %s, \"read_seconds\": %s, "
        "\"private_seconds\": %s, \"bad\": %.0f, \"sink\": %llu}\n",
        bytes, Json(map_s).c_str(), Json(read_s).c_str(), Json(secs[2]).c_str(), bads,
        static_cast<unsigned long long>(sink & 1));
  }
  return bads == 0 ? 0 : 1;
}

// memcpy bandwidth (bytes copied per second) with one thread and with every core, buffers faulted in first. Also the
// limit of a verified load: every core hashes 1 MiB blocks (XXH3, as checksums are computed) and copies each block
// right after hashing it, while it is still in cache — the least work that delivers verified bytes.
int RunMemcpy(const Args& a) {
  const size_t n = static_cast<size_t>(a.mib) << 20;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  char* src = static_cast<char*>(std::aligned_alloc(4096, n));
  char* dst = static_cast<char*>(std::aligned_alloc(4096, n));
  if (src == nullptr || dst == nullptr) Die("out of memory");
  std::memset(src, 1, n);
  std::memset(dst, 2, n);
  auto copy = [&](unsigned k) {
    std::vector<std::thread> ts;
    const size_t part = n / k;
    const double t0 = Now();
    for (unsigned i = 0; i < k; ++i) ts.emplace_back([&, i] { std::memcpy(dst + i * part, src + i * part, part); });
    for (auto& t : ts) t.join();
    return Now() - t0;
  };
  auto best = [&](unsigned k) {
    double b = 1e30;
    for (int r = 0; r < a.repeat; ++r) b = std::min(b, copy(k));
    return static_cast<double>(n) / b;
  };
  const double one = best(1), all = best(threads);
  std::vector<uint64_t> sink(threads);
  auto hash_copy = [&](bool copy_too) {
    double b = 1e30;
    for (int r = 0; r < a.repeat; ++r) {
      std::vector<std::thread> ts;
      const size_t part = n / threads;
      const double t0 = Now();
      for (unsigned i = 0; i < threads; ++i) {
        ts.emplace_back([&, i] {
          uint64_t h = 0;
          for (size_t off = 0; off < part; off += 1 << 20) {
            const size_t len = std::min<size_t>(1 << 20, part - off);
            h ^= Xxh3(src + i * part + off, len);
            if (copy_too) std::memcpy(dst + i * part + off, src + i * part + off, len);
          }
          sink[i] = h;
        });
      }
      for (auto& t : ts) t.join();
      b = std::min(b, Now() - t0);
    }
    return static_cast<double>(n) / b;
  };
  const double hash_all = hash_copy(false), hash_copy_all = hash_copy(true);
  std::printf(
      "RESULT {\"mode\": \"memcpy\", \"bytes\": %zu, \"threads\": %u, \"one_thread_Bps\": %.0f, "
      "\"all_threads_Bps\": %.0f, \"hash_all_threads_Bps\": %.0f, \"hash_copy_all_threads_Bps\": %.0f, "
      "\"sink\": %llu}\n",
      n, threads, one, all, hash_all, hash_copy_all, static_cast<unsigned long long>(sink[0] & 1));
  std::free(src);
  std::free(dst);
  return 0;
}

// Opens a checkpoint's metadata (read, FlatBuffers verify, full semantic validation) and looks up one tensor and its
// chunk index, `repeat` times in this process. The first open is what a fresh process pays.
int RunOpen(const Args& a) {
  std::vector<double> times;
  uint64_t meta_bytes = 0, chunks = 0;
  for (int r = 0; r < a.repeat; ++r) {
    const double t0 = Now();
    auto reader = Reader::Open(a.dir, nullptr, ReadOptions{});
    if (!reader.ok()) Die("open failed: " + reader.status().ToString());
    auto idx = (*reader)->metadata().Find(a.name);
    if (!idx) Die("no entry " + a.name);
    const ChunkIndex& index = (*reader)->Index(*idx);
    (void)index;
    times.push_back(Now() - t0);
    meta_bytes = (*reader)->metadata().buffer_size();
    chunks = 0;
    for (size_t i = 0; i < (*reader)->metadata().num_entries(); ++i)
      chunks += (*reader)->metadata().entry(i).num_chunks;
  }
  std::printf("RESULT {\"mode\": \"open\", \"seconds\": %s, \"metadata_bytes\": %" PRIu64 ", \"chunks\": %" PRIu64
              "}\n",
              Json(times).c_str(), meta_bytes, chunks);
  return 0;
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(k + " needs a value");
      return argv[++i];
    };
    if (k == "--mode") a.mode = next();
    else if (k == "--spec") a.spec = next();
    else if (k == "--dir") a.dir = next();
    else if (k == "--name") a.name = next();
    else if (k == "--io-threads") a.io_threads = std::stoul(next());
    else if (k == "--mib") a.mib = std::stoull(next());
    else if (k == "--repeat") a.repeat = std::stoi(next());
    else if (k == "--no-sync") a.sync = false;
    else if (k == "--no-chunk-hashes") a.chunk_hashes = false;
    else if (k == "--no-verify") a.verify = false;
    else if (k == "--no-check") a.check = false;
    else if (k == "--no-map") a.map = false;
    else if (k == "--no-share") a.share = false;
    else if (k == "--unaligned") a.unaligned = true;
    else if (k == "--private") a.private_copy = true;
    else Die("unknown argument " + k);
  }
  if (a.mode == "memcpy") return RunMemcpy(a);
  if (a.mode == "open") return RunOpen(a);
  if (a.mode != "save" && a.mode != "load" && a.mode != "async" && a.mode != "reshard-limit") {
    Die("--mode save|load|async|reshard-limit|memcpy|open");
  }
  std::unique_ptr<Communicator> comm = NewSingleProcessCommunicator();
  if (std::getenv("DCKPT_RANK") != nullptr) {
    auto opts = GlooOptionsFromEnv(GlooOptions{});
    auto gloo = opts.ok() ? NewGlooCommunicator(*opts) : Result<std::unique_ptr<Communicator>>(opts.status());
    if (!gloo.ok()) Die("cannot join the group: " + gloo.status().ToString());
    comm = std::move(gloo).value();
  }
  if (a.mode == "save") return RunSave(a, comm.get());
  if (a.mode == "load") return RunLoad(a, comm.get());
  if (a.mode == "reshard-limit") return RunReshardLimit(a, comm.get());
  return RunAsync(a, comm.get());
}

}  // namespace
}  // namespace distckpt

int main(int argc, char** argv) { return distckpt::Main(argc, argv); }
