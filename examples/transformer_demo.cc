// The main job: W ranks save a transformer-like training state (embeddings, layers, optimizer moments, a step
// counter; about half of it replicated on every rank, the rest row-sharded), then M ranks load it with a different
// sharding (sharded tensors by columns, replicated ones split by rows), every rank checks every value it loaded, and
// rank 0 prints a summary. Each rank is a process; they talk through Gloo over TCP (rank, world size and rendezvous
// come from the environment, as set by tools/launcher's `launch`).
//
//   launch -n 4 -- transformer_demo --mode save --dir /tmp/distckpt-demo
//   launch -n 3 -- transformer_demo --mode load --dir /tmp/distckpt-demo
// Without DCKPT_RANK in the environment it runs as a single process.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/base/wire.h"
#include "core/comm/gloo/gloo.h"
#include "core/engine/load.h"
#include "core/engine/save.h"
#include "core/storage/storage.h"

namespace distckpt {
namespace {

struct Args {
  std::string mode;
  std::string dir = "/tmp/distckpt-demo";
  uint64_t hidden = 768;
  uint64_t layers = 4;
  uint64_t vocab = 32000;
  bool sync = true;
};

struct Spec {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  bool replicated;  // every rank holds all of it when saving (data parallel); otherwise row-sharded
};

std::vector<Spec> TransformerState(const Args& a) {
  const uint64_t d = a.hidden, v = a.vocab;
  std::vector<Spec> s;
  auto param = [&](const std::string& name, std::vector<uint64_t> shape, bool replicated) {
    s.push_back({"model." + name, DType::kBF16, shape, replicated});
    s.push_back({"optim.exp_avg." + name, DType::kF32, shape, replicated});
    s.push_back({"optim.exp_avg_sq." + name, DType::kF32, shape, replicated});
  };
  param("embed.weight", {v, d}, false);
  for (uint64_t l = 0; l < a.layers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    param(p + "attn.qkv.weight", {3 * d, d}, false);
    param(p + "attn.out.weight", {d, d}, true);
    param(p + "mlp.up.weight", {4 * d, d}, false);
    param(p + "mlp.down.weight", {d, 4 * d}, true);
    param(p + "norm1.weight", {d}, true);
    param(p + "norm2.weight", {d}, true);
  }
  param("final_norm.weight", {d}, true);
  return s;
}

// Raw bits of element `i` of tensor `t`, independent of any sharding.
inline uint32_t Value(uint64_t t, uint64_t i) {
  uint64_t x = (t + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  return static_cast<uint32_t>(x);
}

void Fill(const Spec& spec, uint64_t t, const Box& box, void* out) {
  const bool two_d = box.ndim == 2;
  const uint64_t cols = two_d ? spec.shape[1] : 1, inner = two_d ? box.length[1] : box.length[0];
  const uint64_t rows = two_d ? box.length[0] : 1;
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = 0; c < inner; ++c) {
      uint64_t g = two_d ? (box.offset[0] + r) * cols + box.offset[1] + c : box.offset[0] + c;
      uint32_t v = Value(t, g);
      if (spec.dtype == DType::kBF16) static_cast<uint16_t*>(out)[r * inner + c] = static_cast<uint16_t>(v);
      else static_cast<uint32_t*>(out)[r * inner + c] = v;
    }
  }
}

// Part `k` of `n` of dimension `dim` (even split; the remainder goes to the last parts).
Box Part(const std::vector<uint64_t>& shape, uint32_t dim, uint64_t n, uint64_t k) {
  Box b = Box::Whole(shape).value();
  b.offset[dim] = shape[dim] * k / n;
  b.length[dim] = shape[dim] * (k + 1) / n - b.offset[dim];
  return b;
}

std::vector<uint64_t> Vec(const uint64_t* p, uint32_t n) { return std::vector<uint64_t>(p, p + n); }

// Every rank's value of a per-rank number.
std::vector<uint64_t> OverRanks(Communicator* comm, uint64_t mine) {
  WireWriter w;
  w.U64(mine);
  std::vector<std::string> all;
  std::vector<uint64_t> out;
  if (!comm->AllGather(w.Take(), &all, kDefaultCollectiveTimeout).ok()) return out;
  for (const std::string& s : all) {
    WireReader r(s);
    uint64_t v = 0;
    r.U64(&v);
    out.push_back(v);
  }
  return out;
}
uint64_t SumOverRanks(Communicator* comm, uint64_t mine) {
  uint64_t sum = 0;
  for (uint64_t v : OverRanks(comm, mine)) sum += v;
  return sum;
}
uint64_t MaxOverRanks(Communicator* comm, uint64_t mine) {
  uint64_t m = 0;
  for (uint64_t v : OverRanks(comm, mine)) m = std::max(m, v);
  return m;
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--mode") a.mode = next();
    else if (k == "--dir") a.dir = next();
    else if (k == "--hidden") a.hidden = std::stoull(next());
    else if (k == "--layers") a.layers = std::stoull(next());
    else if (k == "--vocab") a.vocab = std::stoull(next());
    else if (k == "--no-sync") a.sync = false;
    else a.mode = "help";
  }
  if (a.mode != "save" && a.mode != "load") {
    std::fprintf(stderr, "usage: %s --mode save|load [--dir D] [--hidden H] [--layers L] [--vocab V] [--no-sync]\n",
                 argv[0]);
    return 2;
  }
  std::unique_ptr<Communicator> comm = NewSingleProcessCommunicator();
  if (std::getenv("DCKPT_RANK") != nullptr) {
    auto opts = GlooOptionsFromEnv(GlooOptions{});
    auto gloo = opts.ok() ? NewGlooCommunicator(*opts) : Result<std::unique_ptr<Communicator>>(opts.status());
    if (!gloo.ok()) {
      std::fprintf(stderr, "cannot join the group: %s\n", gloo.status().ToString().c_str());
      return 1;
    }
    comm = std::move(gloo).value();
  }
  const uint64_t rank = comm->rank(), world = comm->size();
  const std::string path = a.dir + "/step-1000";
  std::vector<Spec> specs = TransformerState(a);
  State state;
  struct Piece {
    uint64_t t;
    Box box;
    std::vector<uint8_t> buf;
  };
  std::vector<Piece> pieces;
  uint64_t logical = 0;
  for (uint64_t t = 0; t < specs.size(); ++t) {
    const Spec& s = specs[t];
    logical += Box::Whole(s.shape).value().volume() * DTypeSize(s.dtype);
    if (!state.AddTensor(s.name, s.dtype, s.shape).ok()) return 1;
    Box box;
    if (a.mode == "save") {
      box = s.replicated ? Box::Whole(s.shape).value() : Part(s.shape, 0, world, rank);
    } else {
      // Resharded: sharded tensors by columns (the last dimension), replicated ones split by rows.
      box = s.replicated ? Part(s.shape, 0, world, rank) : Part(s.shape, s.shape.size() - 1, world, rank);
    }
    pieces.push_back(Piece{t, box, std::vector<uint8_t>(box.volume() * DTypeSize(s.dtype), 0xAB)});
    if (a.mode == "save") Fill(s, t, box, pieces.back().buf.data());
  }
  for (Piece& p : pieces) {
    if (!state.AddPiece(specs[p.t].name, Vec(p.box.offset, p.box.ndim), Vec(p.box.length, p.box.ndim),
                        p.buf.empty() ? nullptr : p.buf.data()).ok()) {
      return 1;
    }
  }
  uint64_t step = a.mode == "save" ? 1000 : 0;
  (void)state.AddBytes("train.step", &step, sizeof step);

  if (a.mode == "save") {
    if (rank == 0) {
      ::mkdir(a.dir.c_str(), 0755);
      (void)DefaultStorage()->RemoveAll(path);
    }
    (void)comm->Barrier(kDefaultCollectiveTimeout);
    state.SetUserMetadata("step", "1000");
    state.SetUserMetadata("framework", "distckpt-demo");
    SaveOptions so;
    so.sync = a.sync;
    auto saved = Save(path, state, comm.get(), so);
    if (!saved.ok()) {
      std::fprintf(stderr, "rank %" PRIu64 ": save failed: %s\n", rank, saved.status().ToString().c_str());
      return 1;
    }
    uint64_t held = 0;
    for (const Piece& p : pieces) held += p.buf.size();
    uint64_t held_all = SumOverRanks(comm.get(), held);
    if (rank == 0) {
      std::printf("save: %" PRIu64 " ranks held %.1f MiB (state %.1f MiB, about half replicated on every rank)\n",
                  world, held_all / 1048576.0, logical / 1048576.0);
      std::printf("  wrote %.1f MiB once (replicas deduplicated) into %u data files + %" PRIu64
                  " bytes of metadata in %.3f s: %.2f GB/s%s\n",
                  saved->total_bytes / 1048576.0, saved->num_files, saved->metadata_bytes, saved->seconds,
                  saved->total_bytes / saved->seconds / 1e9, a.sync ? " (fsync'd)" : "");
      std::printf("  committed at %s\n", path.c_str());
    }
    return 0;
  }

  auto loaded = Load(path, state, comm.get(), ReadOptions{});
  if (!loaded.ok()) {
    std::fprintf(stderr, "rank %" PRIu64 ": load failed: %s\n", rank, loaded.status().ToString().c_str());
    return 1;
  }
  uint64_t bad = step == 1000 ? 0 : 1, checked = 0;
  for (const Piece& p : pieces) {
    std::vector<uint8_t> want(p.buf.size());
    Fill(specs[p.t], p.t, p.box, want.data());
    if (want != p.buf) {
      std::fprintf(stderr, "rank %" PRIu64 ": wrong values in %s %s\n", rank, specs[p.t].name.c_str(),
                   p.box.ToString().c_str());
      ++bad;
    }
    checked += p.buf.size();
  }
  uint64_t bad_all = SumOverRanks(comm.get(), bad), checked_all = SumOverRanks(comm.get(), checked);
  uint64_t read_all = SumOverRanks(comm.get(), loaded->io.bytes_read);
  uint64_t mapped_all = SumOverRanks(comm.get(), loaded->io.bytes_mapped);
  uint64_t hashed_all = SumOverRanks(comm.get(), loaded->io.bytes_verified);
  const double slowest = MaxOverRanks(comm.get(), static_cast<uint64_t>(loaded->seconds * 1e6)) / 1e6;
  if (rank == 0) {
    std::printf("load: %" PRIu64 " ranks, resharded (sharded tensors by columns, replicated ones by rows)\n", world);
    std::printf("  loaded the %.1f MiB state in %.3f s (slowest rank): %.2f GB/s; checksums verified\n",
                logical / 1048576.0, slowest, logical / slowest / 1e9);
    std::printf("  read %.1f MiB with read calls, %.1f MiB straight from the page cache through a mapping; "
                "hashed %.1f MiB (each shared checksum block once per host)\n",
                read_all / 1048576.0, mapped_all / 1048576.0, hashed_all / 1048576.0);
    std::printf("  checked %.1f MiB on all ranks: %s\n", checked_all / 1048576.0,
                bad_all == 0 ? "every value matches" : "MISMATCH");
  }
  return bad_all == 0 ? 0 : 1;
}

}  // namespace
}  // namespace distckpt

int main(int argc, char** argv) { return distckpt::Main(argc, argv); }
