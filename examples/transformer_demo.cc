// The main job: save a transformer-like training state sharded one way, load it sharded another way, check every
// value, and print a summary. Single process for now: the "ranks" are pieces held by one process.
//
//   bazel run -c opt //examples:transformer_demo -- --dir /tmp/distckpt-demo --save-shards 4 --load-shards 3
#include <sys/stat.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/storage/storage.h"

namespace distckpt {
namespace {

struct Args {
  std::string dir = "/tmp/distckpt-demo";
  uint64_t save_shards = 4;
  uint64_t load_shards = 3;
  uint64_t hidden = 1024;
  uint64_t layers = 4;
  uint64_t vocab = 32000;
  bool sync = true;
};

struct Spec {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  bool sharded;  // row-sharded across shards; otherwise replicated (saved from shard 0 only in one process)
};

std::vector<Spec> TransformerState(const Args& a) {
  const uint64_t d = a.hidden, v = a.vocab;
  std::vector<Spec> s;
  auto param = [&](const std::string& name, std::vector<uint64_t> shape, bool sharded) {
    s.push_back({"model." + name, DType::kBF16, shape, sharded});
    s.push_back({"optim.exp_avg." + name, DType::kF32, shape, sharded});
    s.push_back({"optim.exp_avg_sq." + name, DType::kF32, shape, sharded});
  };
  param("embed.weight", {v, d}, true);
  for (uint64_t l = 0; l < a.layers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    param(p + "attn.qkv.weight", {3 * d, d}, true);
    param(p + "attn.out.weight", {d, d}, false);
    param(p + "mlp.up.weight", {4 * d, d}, true);
    param(p + "mlp.down.weight", {d, 4 * d}, false);
    param(p + "norm1.weight", {d}, false);
    param(p + "norm2.weight", {d}, false);
  }
  param("final_norm.weight", {d}, false);
  return s;
}

// Value of element `i` of tensor `t`, as raw bits of the element (bf16 or f32), independent of any sharding.
inline uint32_t Value(uint64_t t, uint64_t i) {
  uint64_t x = (t + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  return static_cast<uint32_t>(x);
}

void Fill(const Spec& spec, uint64_t t, const Box& box, void* out) {
  const uint64_t cols = box.ndim == 2 ? spec.shape[1] : 1;
  const uint64_t inner = box.ndim == 2 ? box.length[1] : box.length[0];
  const uint64_t rows = box.ndim == 2 ? box.length[0] : 1;
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = 0; c < inner; ++c) {
      uint64_t g = box.ndim == 2 ? (box.offset[0] + r) * cols + box.offset[1] + c : box.offset[0] + c;
      uint32_t v = Value(t, g);
      if (spec.dtype == DType::kBF16) static_cast<uint16_t*>(out)[r * inner + c] = static_cast<uint16_t>(v);
      else static_cast<uint32_t*>(out)[r * inner + c] = v;
    }
  }
}

uint64_t Check(const Spec& spec, uint64_t t, const Box& box, const void* got) {
  std::vector<uint8_t> want(box.volume() * DTypeSize(spec.dtype));
  Fill(spec, t, box, want.data());
  return std::memcmp(want.data(), got, want.size()) == 0 ? 0 : 1;
}

// Splits dimension `dim` of `shape` into `n` uneven parts (the last ones get the remainder).
std::vector<Box> Split(const std::vector<uint64_t>& shape, uint64_t n, uint32_t dim) {
  Box whole = Box::Whole(shape).value();
  std::vector<Box> out;
  for (uint64_t k = 0; k < n; ++k) {
    Box b = whole;
    b.offset[dim] = shape[dim] * k / n;
    b.length[dim] = shape[dim] * (k + 1) / n - b.offset[dim];
    if (b.length[dim] > 0) out.push_back(b);
  }
  return out;
}

std::vector<uint64_t> ToVec(const uint64_t* p, uint32_t n) { return std::vector<uint64_t>(p, p + n); }

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
    if (k == "--dir") a.dir = next();
    else if (k == "--save-shards") a.save_shards = std::stoull(next());
    else if (k == "--load-shards") a.load_shards = std::stoull(next());
    else if (k == "--hidden") a.hidden = std::stoull(next());
    else if (k == "--layers") a.layers = std::stoull(next());
    else if (k == "--vocab") a.vocab = std::stoull(next());
    else if (k == "--no-sync") a.sync = false;
    else {
      std::fprintf(stderr, "usage: %s [--dir D] [--save-shards N] [--load-shards M] [--hidden H] [--layers L] "
                           "[--vocab V] [--no-sync]\n", argv[0]);
      return 2;
    }
  }
  ::mkdir(a.dir.c_str(), 0755);
  const std::string path = a.dir + "/step-1000";
  (void)DefaultStorage()->RemoveAll(path);
  std::vector<Spec> specs = TransformerState(a);

  // Save: sharded tensors split by rows into save_shards pieces; replicated ones as a single piece.
  State save;
  std::vector<std::vector<uint8_t>> buffers;
  uint64_t total = 0;
  for (uint64_t t = 0; t < specs.size(); ++t) {
    const Spec& s = specs[t];
    if (!save.AddTensor(s.name, s.dtype, s.shape).ok()) return 1;
    for (const Box& b : s.sharded ? Split(s.shape, a.save_shards, 0) : Split(s.shape, 1, 0)) {
      buffers.emplace_back(b.volume() * DTypeSize(s.dtype));
      Fill(s, t, b, buffers.back().data());
      total += buffers.back().size();
      if (!save.AddPiece(s.name, ToVec(b.offset, b.ndim), ToVec(b.length, b.ndim), buffers.back().data()).ok()) return 1;
    }
  }
  uint64_t step = 1000;
  (void)save.AddBytes("train.step", &step, sizeof step);
  save.SetUserMetadata("step", "1000");
  save.SetUserMetadata("framework", "distckpt-demo");
  SaveOptions so;
  so.sync = a.sync;
  auto saved = Save(path, save, nullptr, so);
  if (!saved.ok()) {
    std::fprintf(stderr, "save failed: %s\n", saved.status().ToString().c_str());
    return 1;
  }
  buffers.clear();

  // Load: sharded tensors split by COLUMNS into load_shards pieces (a different sharding), replicated ones whole.
  State load;
  struct Dest {
    uint64_t t;
    Box box;
    std::vector<uint8_t> buf;
  };
  std::vector<Dest> dests;
  for (uint64_t t = 0; t < specs.size(); ++t) {
    const Spec& s = specs[t];
    if (!load.AddTensor(s.name, s.dtype, s.shape).ok()) return 1;
    uint32_t dim = static_cast<uint32_t>(s.shape.size() - 1);
    for (const Box& b : s.sharded ? Split(s.shape, a.load_shards, dim) : Split(s.shape, 1, 0)) {
      dests.push_back(Dest{t, b, std::vector<uint8_t>(b.volume() * DTypeSize(s.dtype), 0xAB)});
    }
  }
  for (Dest& d : dests) {
    if (!load.AddPiece(specs[d.t].name, ToVec(d.box.offset, d.box.ndim), ToVec(d.box.length, d.box.ndim),
                       d.buf.data()).ok()) {
      return 1;
    }
  }
  uint64_t step_back = 0;
  (void)load.AddBytes("train.step", &step_back, sizeof step_back);
  auto loaded = Load(path, load, nullptr, ReadOptions{});
  if (!loaded.ok()) {
    std::fprintf(stderr, "load failed: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  uint64_t bad = 0;
  for (const Dest& d : dests) bad += Check(specs[d.t], d.t, d.box, d.buf.data());
  if (step_back != step) ++bad;

  std::printf("distckpt demo: %zu tensors + 1 bytes entry, %.1f MiB\n", specs.size(), total / 1048576.0);
  std::printf("  save  %" PRIu64 " row shards -> %u file(s), %.3f s, %.2f GB/s%s\n", a.save_shards, saved->num_files,
              saved->seconds, total / saved->seconds / 1e9, a.sync ? " (fsync'd)" : "");
  std::printf("  load  %" PRIu64 " column shards (resharded), %.3f s, %.2f GB/s, %.1f MiB read, checksums verified\n",
              a.load_shards, loaded->seconds, total / loaded->seconds / 1e9, loaded->io.bytes_read / 1048576.0);
  std::printf("  check %zu pieces: %s\n", dests.size(), bad == 0 ? "every value matches" : "MISMATCH");
  std::printf("  committed at %s (metadata %" PRIu64 " bytes)\n", path.c_str(), saved->metadata_bytes);
  return bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace distckpt

int main(int argc, char** argv) { return distckpt::Main(argc, argv); }
