// One rank of the multi-process tests, using the C ABI only. Saves (layout A) or loads (layout B) a state whose
// tensors cover every resharding case: row <-> column, 1-D <-> 2-D block, uneven splits (some ranks hold nothing),
// replicated <-> sharded, scalars and a bytes entry. Every loaded value is checked.
//
//   reshard_worker --mode save|load --path CKPT [--timeout-ms T] [--die-rank R --die-at PERCENT]
//                  [--stall-rank R --stall-at PERCENT]
//   reshard_worker --mode corrupt --path CKPT --entry NAME     (one process: flips a byte of NAME's first chunk)
// Rank and world size come from the environment (DCKPT_RANK, DCKPT_WORLD_SIZE, DCKPT_RENDEZVOUS).
// Exit codes: 0 ok, 2 wrong values, 3 a dckpt call failed (the error is printed as "rank R: error: ...").
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"

namespace {

struct Piece {
  std::vector<uint64_t> off, len;
};

enum class Layout { kRows, kCols, kBlock2D, kReplicated };

struct TensorSpec {
  const char* name;
  int dtype;
  std::vector<uint64_t> shape;
  Layout save;
  Layout load;
};

const std::vector<TensorSpec>& Specs() {
  static const std::vector<TensorSpec> specs = {
      {"row2col", DCKPT_DTYPE_F32, {37, 29}, Layout::kRows, Layout::kCols},
      {"col2row", DCKPT_DTYPE_BF16, {33, 41}, Layout::kCols, Layout::kRows},
      {"oned2block", DCKPT_DTYPE_F32, {24, 18}, Layout::kRows, Layout::kBlock2D},
      {"block2oned", DCKPT_DTYPE_I32, {30, 22}, Layout::kBlock2D, Layout::kCols},
      {"repl2shard", DCKPT_DTYPE_I64, {40, 8}, Layout::kReplicated, Layout::kRows},
      {"shard2repl", DCKPT_DTYPE_F64, {16, 16}, Layout::kRows, Layout::kReplicated},
      {"scalar", DCKPT_DTYPE_F32, {}, Layout::kReplicated, Layout::kReplicated},
      {"tiny", DCKPT_DTYPE_U8, {7}, Layout::kRows, Layout::kRows},
      {"vector", DCKPT_DTYPE_F16, {1001}, Layout::kRows, Layout::kReplicated},
      {"big", DCKPT_DTYPE_F32, {512, 1024}, Layout::kRows, Layout::kCols},
      {"embed", DCKPT_DTYPE_BF16, {1000, 64}, Layout::kRows, Layout::kBlock2D},
  };
  return specs;
}

// Uneven cut points: part i gets a share proportional to i + 1.
uint64_t Cut(uint64_t n, int parts, int i) {
  uint64_t tri = static_cast<uint64_t>(parts) * (parts + 1) / 2;
  uint64_t upto = static_cast<uint64_t>(i) * (i + 1) / 2;
  return n * upto / tri;
}

Piece PieceFor(const TensorSpec& t, Layout layout, int rank, int world) {
  Piece p{std::vector<uint64_t>(t.shape.size(), 0), t.shape};
  if (t.shape.empty() || layout == Layout::kReplicated) return p;
  auto split = [&](size_t dim, int parts, int i) {
    p.off[dim] = Cut(t.shape[dim], parts, i);
    p.len[dim] = Cut(t.shape[dim], parts, i + 1) - p.off[dim];
  };
  if (layout == Layout::kRows || t.shape.size() == 1) {
    split(0, world, rank);
  } else if (layout == Layout::kCols) {
    split(t.shape.size() - 1, world, rank);
  } else {  // 2-D block grid pr x pc
    int pr = 1;
    for (int d = 1; d * d <= world; ++d) {
      if (world % d == 0) pr = d;
    }
    int pc = world / pr;
    split(0, pr, rank / pc);
    split(1, pc, rank % pc);
  }
  return p;
}

uint64_t Volume(const Piece& p) {
  uint64_t v = 1;
  for (uint64_t l : p.len) v *= l;
  return v;
}

uint8_t ValueByte(const char* name, uint64_t linear, uint64_t k) {
  uint64_t h = 1469598103934665603ull;
  for (const char* c = name; *c; ++c) h = (h ^ static_cast<uint8_t>(*c)) * 1099511628211ull;
  return static_cast<uint8_t>((h >> 20) + linear * 13 + k * 101 + (linear >> 9));
}

void Fill(const TensorSpec& t, const Piece& p, std::vector<uint8_t>* buf) {
  const uint64_t item = dckpt_dtype_size(t.dtype), n = Volume(p);
  buf->assign(n * item, 0);
  std::vector<uint64_t> idx(p.len.size());
  for (uint64_t e = 0; e < n; ++e) {
    uint64_t rem = e, linear = 0;
    for (int d = static_cast<int>(p.len.size()) - 1; d >= 0; --d) {
      idx[d] = rem % p.len[d];
      rem /= p.len[d];
    }
    for (size_t d = 0; d < p.len.size(); ++d) linear = linear * t.shape[d] + p.off[d] + idx[d];
    for (uint64_t k = 0; k < item; ++k) (*buf)[e * item + k] = ValueByte(t.name, linear, k);
  }
}

int g_rank = 0;
int g_die_rank = -1, g_die_at = -1, g_stall_rank = -1, g_stall_at = -1;

int Progress(uint64_t done, uint64_t total, void*) {
  uint64_t pct = total ? done * 100 / total : 100;
  if (g_rank == g_die_rank && static_cast<int>(pct) >= g_die_at) {
    std::fprintf(stderr, "rank %d: dying at %d%% as asked\n", g_rank, static_cast<int>(pct));
    std::fflush(stderr);
    raise(SIGKILL);
  }
  if (g_rank == g_stall_rank && static_cast<int>(pct) >= g_stall_at) {
    std::fprintf(stderr, "rank %d: stalling at %d%% as asked\n", g_rank, static_cast<int>(pct));
    std::fflush(stderr);
    raise(SIGSTOP);
  }
  return 0;
}

int Fail(const char* what, int rc) {
  std::fprintf(stderr, "rank %d: error: %s: %s (%s)\n", g_rank, what, dckpt_error_last(), dckpt_status_name(rc));
  return 3;
}

}  // namespace

// --mode corrupt --entry NAME: flips one byte in the middle of the entry's first chunk (no communicator).
int Corrupt(const std::string& path, const std::string& entry) {
  dckpt_reader* reader = nullptr;
  int rc = dckpt_reader_open(&reader, path.c_str(), nullptr, nullptr);
  if (rc != DCKPT_OK) return Fail("dckpt_reader_open", rc);
  size_t index = 0;
  dckpt_chunk_info chunk = DCKPT_CHUNK_INFO_INIT;
  rc = dckpt_reader_find(&index, reader, entry.c_str());
  if (rc == DCKPT_OK) rc = dckpt_reader_chunk(&chunk, reader, index, 0);
  if (rc != DCKPT_OK) {
    rc = Fail("finding the chunk", rc);
    dckpt_reader_free(reader);
    return rc;
  }
  const std::string file = path + "/" + chunk.file;
  const off_t at = static_cast<off_t>(chunk.file_offset + chunk.length / 2);
  dckpt_reader_free(reader);
  FILE* f = std::fopen(file.c_str(), "r+b");
  if (f == nullptr || std::fseek(f, at, SEEK_SET) != 0) return 3;
  const int c = std::fgetc(f);
  if (c == EOF || std::fseek(f, at, SEEK_SET) != 0 || std::fputc(c ^ 0x20, f) == EOF || std::fclose(f) != 0) return 3;
  std::printf("flipped byte %lld of %s\n", static_cast<long long>(at), file.c_str());
  return 0;
}

int main(int argc, char** argv) {
  std::string mode, path, entry;
  uint64_t timeout_ms = 0;
  int fanout = DCKPT_FANOUT_AUTO;  // --fanout auto|off|always
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") mode = v;
    else if (k == "--path") path = v;
    else if (k == "--entry") entry = v;
    else if (k == "--timeout-ms") timeout_ms = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--fanout") fanout = v == "always" ? DCKPT_FANOUT_ALWAYS : v == "off" ? DCKPT_FANOUT_OFF : DCKPT_FANOUT_AUTO;
    else if (k == "--die-rank") g_die_rank = std::atoi(v.c_str());
    else if (k == "--die-at") g_die_at = std::atoi(v.c_str());
    else if (k == "--stall-rank") g_stall_rank = std::atoi(v.c_str());
    else if (k == "--stall-at") g_stall_at = std::atoi(v.c_str());
  }
  if (mode == "corrupt" && !path.empty()) return Corrupt(path, entry);
  if ((mode != "save" && mode != "load") || path.empty()) {
    std::fprintf(stderr, "usage: %s --mode save|load --path CKPT [--timeout-ms T] [--die-rank R --die-at PCT]\n",
                 argv[0]);
    return 64;
  }
  dckpt_gloo_options gopts;
  dckpt_gloo_options_init(&gopts, DCKPT_GLOO_OPTIONS_VERSION);
  gopts.timeout_ms = timeout_ms;
  dckpt_comm* comm = nullptr;
  int rc = dckpt_comm_new_gloo(&comm, &gopts);
  if (rc != DCKPT_OK) return Fail("dckpt_comm_new_gloo", rc);
  // Freed on every return, the failing ones included: the sanitizer builds check for leaks at exit.
  std::unique_ptr<dckpt_comm, decltype(&dckpt_comm_free)> comm_owner(comm, &dckpt_comm_free);
  int world = 1;
  dckpt_comm_rank(&g_rank, comm);
  dckpt_comm_size(&world, comm);

  const bool save = mode == "save";
  dckpt_state* state = nullptr;
  dckpt_state_new(&state);
  std::unique_ptr<dckpt_state, decltype(&dckpt_state_free)> state_owner(state, &dckpt_state_free);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<Piece> pieces;
  buffers.reserve(Specs().size());
  for (const TensorSpec& t : Specs()) {
    Piece p = PieceFor(t, save ? t.save : t.load, g_rank, world);
    buffers.emplace_back();
    if (save) Fill(t, p, &buffers.back());
    else buffers.back().assign(Volume(p) * dckpt_dtype_size(t.dtype), 0xCD);
    pieces.push_back(p);
    rc = dckpt_state_add_tensor(state, t.name, t.dtype, t.shape.size(), t.shape.data());
    if (rc == DCKPT_OK) {
      rc = dckpt_state_add_piece(state, t.name, p.off.data(), p.len.data(),
                                 buffers.back().empty() ? nullptr : buffers.back().data());
    }
    if (rc != DCKPT_OK) return Fail("building the state", rc);
  }
  uint64_t step = save ? 777 : 0;
  dckpt_state_add_bytes(state, "step", &step, sizeof step);

  if (save) {
    dckpt_save_options opts;
    dckpt_save_options_init(&opts, DCKPT_SAVE_OPTIONS_VERSION);
    opts.timeout_ms = timeout_ms;
    opts.checksum_block_size = 64 * 1024;
    opts.progress = Progress;
    rc = dckpt_save(nullptr, path.c_str(), state, comm, &opts);
    if (rc != DCKPT_OK) return Fail("dckpt_save", rc);
  } else {
    dckpt_read_options opts;
    dckpt_read_options_init(&opts, DCKPT_READ_OPTIONS_VERSION);
    opts.timeout_ms = timeout_ms;
    opts.progress = Progress;
    opts.fanout = fanout;
    dckpt_io_stats stats = DCKPT_IO_STATS_INIT;
    rc = dckpt_load(&stats, path.c_str(), state, comm, &opts);
    if (rc != DCKPT_OK) return Fail("dckpt_load", rc);
    std::printf("rank %d: read %llu bytes from storage, %llu mapped, %llu received from peers, %llu sent to peers\n",
                g_rank, static_cast<unsigned long long>(stats.bytes_read),
                static_cast<unsigned long long>(stats.bytes_mapped),
                static_cast<unsigned long long>(stats.bytes_received_from_peers),
                static_cast<unsigned long long>(stats.bytes_sent_to_peers));
    int bad = 0;
    for (size_t i = 0; i < Specs().size(); ++i) {
      std::vector<uint8_t> want;
      Fill(Specs()[i], pieces[i], &want);
      if (want != buffers[i]) {
        std::fprintf(stderr, "rank %d: wrong values in '%s'\n", g_rank, Specs()[i].name);
        ++bad;
      }
    }
    if (step != 777) {
      std::fprintf(stderr, "rank %d: wrong step %llu\n", g_rank, static_cast<unsigned long long>(step));
      ++bad;
    }
    if (bad) return 2;
  }
  std::printf("rank %d/%d: %s ok\n", g_rank, world, mode.c_str());
  return 0;
}
