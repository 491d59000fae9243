// One rank of the fan-out load tests and benchmark (C++ API: the fan-out option is not in the C header yet).
// The state: most bytes fully replicated (every rank holds and loads whole tensors), one tensor sharded by rows on
// save and load (each rank needs only its own rows), one saved by rows and loaded by columns (every rank needs a
// slice of every block). Every loaded value is checked exactly.
//
//   fanout_worker --mode save|load --path CKPT [--mib M] [--fanout 0|1|2] [--round-kib K] [--verify 0|1]
//                 [--map 0|1] [--fanout-off-rank R] [--timeout-ms T] [--die-rank R --die-at PERCENT] [--repeat N]
//                 [--device 0|1]
//   fanout_worker --mode corrupt --path CKPT --entry NAME     (one process: flips a byte of NAME's first chunk)
// --fanout: 0 off, 1 always (default here: every rank is on this host, where kAuto would not fan out), 2 auto.
// --device 1: the load's pieces are device pieces (cuda:0, host memory copied by the host copy engine): the bytes a
// rank reads go through pinned staging buffers, the bytes it receives from peers are copied from the exchange buffer.
// Rank and world size come from the environment (DCKPT_RANK, DCKPT_WORLD_SIZE, DCKPT_RENDEZVOUS).
// A load prints one line per repeat: "FANOUT_STATS rank=R fanout=F bytes_read=.. received=.. sent=.. delivered=..
// seconds=..". Exit codes: 0 ok, 2 wrong values, 3 a call failed ("rank R: error: ...").
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/comm/gloo/gloo.h"
#include "core/cuda/host_copy_engine.h"
#include "core/engine/load.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/engine/state.h"

namespace distckpt {
namespace {

enum class Layout { kReplicated, kRows, kCols };

struct Spec {
  std::string name;
  uint64_t rows, cols;  // f32
  Layout save, load;
};

std::vector<Spec> Specs(uint64_t mib) {
  // ~mib MiB replicated in 4 layers plus small ones; 1/8 of that sharded; a rows->columns tensor.
  const uint64_t layer_rows = std::max<uint64_t>(1, mib * (1 << 20) / 4 / 4 / 1024);
  std::vector<Spec> s;
  for (int i = 0; i < 4; ++i) {
    s.push_back({"layer" + std::to_string(i) + ".w", layer_rows, 1024, Layout::kReplicated, Layout::kReplicated});
    s.push_back({"layer" + std::to_string(i) + ".b", 1, 1024, Layout::kReplicated, Layout::kReplicated});
  }
  s.push_back({"norm", 1, 77, Layout::kReplicated, Layout::kReplicated});
  s.push_back({"shard", std::max<uint64_t>(8, layer_rows / 2), 1024, Layout::kRows, Layout::kRows});
  s.push_back({"row2col", 256, 512, Layout::kRows, Layout::kCols});
  return s;
}

uint64_t Cut(uint64_t n, int parts, int i) { return n * i / parts; }

struct Piece {
  std::vector<uint64_t> off, len;
};

Piece PieceFor(const Spec& t, Layout l, int rank, int world) {
  switch (l) {
    case Layout::kReplicated:
      return {{0, 0}, {t.rows, t.cols}};
    case Layout::kRows:
      return {{Cut(t.rows, world, rank), 0}, {Cut(t.rows, world, rank + 1) - Cut(t.rows, world, rank), t.cols}};
    case Layout::kCols:
      return {{0, Cut(t.cols, world, rank)}, {t.rows, Cut(t.cols, world, rank + 1) - Cut(t.cols, world, rank)}};
  }
  return {};
}

// Exact in f32: 24-bit integers that depend on the tensor and the element.
float Value(size_t tensor, uint64_t row, uint64_t col, uint64_t cols) {
  uint64_t x = (tensor + 1) * 0x9e3779b97f4a7c15ull ^ (row * cols + col) * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<float>(x & 0xffffff);
}

void Fill(size_t tensor, const Spec& t, const Piece& p, std::vector<float>* out) {
  out->resize(p.len[0] * p.len[1]);
  for (uint64_t r = 0; r < p.len[0]; ++r) {
    for (uint64_t c = 0; c < p.len[1]; ++c) {
      (*out)[r * p.len[1] + c] = Value(tensor, p.off[0] + r, p.off[1] + c, t.cols);
    }
  }
}

int g_rank = 0;
int g_die_rank = -1, g_die_at = -1, g_off_rank = -1;

int Fail(const char* what, const Status& st) {
  std::fprintf(stderr, "rank %d: error: %s: %s\n", g_rank, what, st.ToString().c_str());
  return 3;
}

int Corrupt(const std::string& path, const std::string& entry) {
  auto reader = Reader::Open(path, nullptr, ReadOptions{});
  if (!reader.ok()) return Fail("open", reader.status());
  const MetadataView& meta = (*reader)->metadata();
  auto idx = meta.Find(entry);
  if (!idx) return Fail("find", NotFound(entry));
  const ChunkLocation loc = meta.entry(*idx).chunk(0);
  const std::string file = path + "/" + std::string(meta.file_name(loc.file));
  const long at = static_cast<long>(loc.offset + loc.length / 2);
  FILE* f = std::fopen(file.c_str(), "r+b");
  if (f == nullptr || std::fseek(f, at, SEEK_SET) != 0) return 3;
  const int c = std::fgetc(f);
  if (c == EOF || std::fseek(f, at, SEEK_SET) != 0 || std::fputc(c ^ 0x20, f) == EOF || std::fclose(f) != 0) return 3;
  std::printf("flipped byte %ld of %s\n", at, file.c_str());
  return 0;
}

int Main(int argc, char** argv) {
  std::string mode, path, entry;
  uint64_t mib = 4, round_kib = 0;
  int fanout = 1, verify = 1, repeat = 1, map = 0, device = 0;
  long timeout_ms = 60000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") mode = v;
    else if (k == "--path") path = v;
    else if (k == "--entry") entry = v;
    else if (k == "--mib") mib = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--fanout") fanout = std::atoi(v.c_str());
    else if (k == "--verify") verify = std::atoi(v.c_str());
    else if (k == "--map") map = std::atoi(v.c_str());
    else if (k == "--device") device = std::atoi(v.c_str());
    else if (k == "--round-kib") round_kib = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--repeat") repeat = std::atoi(v.c_str());
    else if (k == "--timeout-ms") timeout_ms = std::atol(v.c_str());
    else if (k == "--die-rank") g_die_rank = std::atoi(v.c_str());
    else if (k == "--die-at") g_die_at = std::atoi(v.c_str());
    else if (k == "--fanout-off-rank") g_off_rank = std::atoi(v.c_str());
  }
  if (mode == "corrupt") return Corrupt(path, entry);
  if ((mode != "save" && mode != "load") || path.empty()) {
    std::fprintf(stderr, "usage: %s --mode save|load|corrupt --path CKPT [options]\n", argv[0]);
    return 64;
  }
  GlooOptions base;
  base.timeout = std::chrono::milliseconds(timeout_ms);
  auto gopts = GlooOptionsFromEnv(base);
  if (!gopts.ok()) return Fail("gloo options", gopts.status());
  auto comm = NewGlooCommunicator(*gopts);
  if (!comm.ok()) return Fail("gloo", comm.status());
  g_rank = (*comm)->rank();
  const int world = (*comm)->size();
  const bool save = mode == "save";
  const std::vector<Spec> specs = Specs(mib);
  for (int it = 0; it < (save ? 1 : repeat); ++it) {
    State state;
    std::vector<std::vector<float>> buffers(specs.size());
    std::vector<Piece> pieces;
    for (size_t i = 0; i < specs.size(); ++i) {
      const Spec& t = specs[i];
      Piece p = PieceFor(t, save ? t.save : t.load, g_rank, world);
      if (save) Fill(i, t, p, &buffers[i]);
      else buffers[i].assign(p.len[0] * p.len[1], -1.0f);
      pieces.push_back(p);
      Status st = state.AddTensor(t.name, DType::kF32, {t.rows, t.cols});
      const MemoryLocation cuda0{MemoryKind::kCuda, 0, nullptr};
      if (st.ok() && !buffers[i].empty()) {
        st = !save && device ? state.AddPieceIn(t.name, p.off, p.len, buffers[i].data(), cuda0)
                             : state.AddPiece(t.name, p.off, p.len, buffers[i].data());
      }
      if (!st.ok()) return Fail("building the state", st);
    }
    if (save) {
      SaveOptions opts;
      opts.timeout = std::chrono::milliseconds(timeout_ms);
      opts.checksum_block_size = 64 * 1024;
      opts.sync = false;
      auto saved = Save(path, state, comm->get(), opts);
      if (!saved.ok()) return Fail("save", saved.status());
      break;
    }
    HostCopyEngine engine;
    ReadOptions opts;
    if (device) {
      opts.copy_engine = &engine;
      opts.staging_buffer_bytes = 256 << 10;
    }
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    opts.fanout = fanout == 0 ? FanoutMode::kOff : fanout == 1 ? FanoutMode::kAlways : FanoutMode::kAuto;
    if (g_rank == g_off_rank) opts.fanout = FanoutMode::kOff;
    opts.verify = verify != 0;
    opts.map_files = map != 0;  // off by default: every byte from storage then counts in bytes_read
    if (round_kib) opts.fanout_round_bytes = round_kib << 10;
    opts.progress = [](uint64_t done, uint64_t total) {
      const uint64_t pct = total ? done * 100 / total : 100;
      if (g_rank == g_die_rank && static_cast<int>(pct) >= g_die_at) {
        std::fprintf(stderr, "rank %d: dying at %d%% as asked\n", g_rank, static_cast<int>(pct));
        std::fflush(stderr);
        raise(SIGKILL);
      }
      return 0;
    };
    auto loaded = Load(path, state, comm->get(), opts);
    if (!loaded.ok()) return Fail("load", loaded.status());
    int bad = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<float> want;
      Fill(i, specs[i], pieces[i], &want);
      if (std::memcmp(want.data(), buffers[i].data(), want.size() * sizeof(float)) != 0) {
        std::fprintf(stderr, "rank %d: wrong values in '%s'\n", g_rank, specs[i].name.c_str());
        ++bad;
      }
    }
    if (bad) return 2;
    const IoStats& io = loaded->io;
    std::printf("FANOUT_STATS rank=%d fanout=%d bytes_read=%" PRIu64 " mapped=%" PRIu64 " received=%" PRIu64 " sent=%" PRIu64
                " delivered=%" PRIu64 " verified=%" PRIu64 " device_copies=%" PRIu64 " seconds=%.6f\n",
                g_rank, fanout, io.bytes_read, io.bytes_mapped, io.bytes_received_from_peers, io.bytes_sent_to_peers,
                io.bytes_delivered, io.bytes_verified, engine.device_copies_issued(), loaded->seconds);
    std::fflush(stdout);
  }
  std::printf("rank %d/%d: %s ok\n", g_rank, world, mode.c_str());
  return 0;
}

}  // namespace
}  // namespace distckpt

int main(int argc, char** argv) { return distckpt::Main(argc, argv); }
