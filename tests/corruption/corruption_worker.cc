// The corruption suite's worker, on the C ABI only. Saves a checkpoint that exercises every part of the format, or
// checks a (possibly damaged) copy of one completely: every value of every tensor through a resharded load and
// through partial reads, the bytes entries, the user metadata, the structure string, the entry table and a full
// verify. Run in its own process by corruption_test.cc, so that a crash or a hang is an outcome the test observes.
//
//   corruption_worker --mode save --path CKPT [--variant V]   (collective over Gloo: DCKPT_RANK etc. from launch)
//   corruption_worker --mode check --path CKPT [--variant V]  (one process; with DCKPT_WORLD_SIZE > 1, collective)
//
// `--variant` shifts every value, so that two checkpoints of one layout differ in every byte of data.
// Exit codes: 0 every value exact; 2 some value differs and no call failed (wrong data: never acceptable);
// 3 a dckpt call failed (its error is printed on stderr as "error: <call>: <message>").
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"

namespace {

struct Spec {
  const char* name;
  int dtype;
  std::vector<uint64_t> shape;
  bool replicated;  // every rank saves all of it; otherwise rows are split between the ranks
};

// Multi-block chunks (the checkpoint is saved with 4 KiB checksum blocks), a 0-d and an empty tensor, replicated and
// sharded ones, and every kind of dtype width.
const std::vector<Spec>& Specs() {
  static const std::vector<Spec> specs = {
      {"layers.0.emb", DCKPT_DTYPE_BF16, {300, 64}, false},  {"layers.0.w", DCKPT_DTYPE_F32, {128, 96}, false},
      {"layers.1.w", DCKPT_DTYPE_F64, {40, 33}, false},       {"ids", DCKPT_DTYPE_I64, {1000}, false},
      {"mask", DCKPT_DTYPE_BOOL, {77}, true},                 {"scale", DCKPT_DTYPE_F64, {}, true},
      {"empty", DCKPT_DTYPE_F32, {0, 5}, true},               {"fp8", DCKPT_DTYPE_F8_E4M3FN, {513}, false},
      {"cplx", DCKPT_DTYPE_C64, {40, 3}, false},              {"norm", DCKPT_DTYPE_F16, {96}, true},
  };
  return specs;
}

const char* const kBlobs[][2] = {{"rng_state", "0123456789abcdef"}, {"optimizer.schedule", ""}};
const char* const kStructure = "{\"model\": {\"layers\": [\"layers.0\", \"layers.1\"]}, \"note\": \"corruption\"}";

uint8_t ValueByte(const char* name, uint64_t linear, uint64_t k, uint64_t variant) {
  uint64_t h = 1469598103934665603ull ^ (variant * 0x9e3779b97f4a7c15ull);
  for (const char* c = name; *c; ++c) h = (h ^ static_cast<uint8_t>(*c)) * 1099511628211ull;
  return static_cast<uint8_t>((h >> 24) + linear * 29 + k * 101 + (linear >> 7) + variant * 7);
}

uint64_t Volume(const std::vector<uint64_t>& v) {
  uint64_t n = 1;
  for (uint64_t x : v) n *= x;
  return n;
}

// The bytes of the box [off, off + len) of `t`, row-major.
std::vector<uint8_t> Expected(const Spec& t, const std::vector<uint64_t>& off, const std::vector<uint64_t>& len,
                              uint64_t variant) {
  const uint64_t item = dckpt_dtype_size(t.dtype), n = Volume(len);
  std::vector<uint8_t> out(n * item);
  std::vector<uint64_t> idx(len.size());
  for (uint64_t e = 0; e < n; ++e) {
    uint64_t rem = e, linear = 0;
    for (int d = static_cast<int>(len.size()) - 1; d >= 0; --d) {
      idx[d] = rem % len[d];
      rem /= len[d];
    }
    for (size_t d = 0; d < len.size(); ++d) linear = linear * t.shape[d] + off[d] + idx[d];
    for (uint64_t k = 0; k < item; ++k) out[e * item + k] = ValueByte(t.name, linear, k, variant);
  }
  return out;
}

// Rows [lo, hi) of dimension 0 for part `i` of `n` (uneven: part i gets a share proportional to i + 1).
void Rows(const Spec& t, int i, int n, std::vector<uint64_t>* off, std::vector<uint64_t>* len) {
  *off = std::vector<uint64_t>(t.shape.size(), 0);
  *len = t.shape;
  if (t.replicated || t.shape.empty()) return;
  auto cut = [&](int k) { return t.shape[0] * (static_cast<uint64_t>(k) * (k + 1) / 2) / (n * (n + 1) / 2); };
  (*off)[0] = cut(i);
  (*len)[0] = cut(i + 1) - cut(i);
}

int Fail(const char* what, int rc) {
  std::fprintf(stderr, "error: %s: %s (%s)\n", what, dckpt_error_last(), dckpt_status_name(rc));
  return 3;
}

#define CALL(what, expr)                 \
  do {                                   \
    const int rc_ = (expr);              \
    if (rc_ != DCKPT_OK) return Fail(what, rc_); \
  } while (0)

// Owners that free a handle on every return, the failing ones included: the sanitizer builds check for leaks at exit.
using CommOwner = std::unique_ptr<dckpt_comm, decltype(&dckpt_comm_free)>;
using StateOwner = std::unique_ptr<dckpt_state, decltype(&dckpt_state_free)>;
using ReaderOwner = std::unique_ptr<dckpt_reader, decltype(&dckpt_reader_free)>;

int g_wrong = 0;
void Wrong(const std::string& what) {
  std::fprintf(stderr, "WRONG DATA: %s\n", what.c_str());
  ++g_wrong;
}

int Save(const std::string& path, uint64_t variant) {
  dckpt_comm* comm = nullptr;
  CALL("dckpt_comm_new_gloo", dckpt_comm_new_gloo(&comm, nullptr));
  CommOwner comm_owner(comm, &dckpt_comm_free);
  int rank = 0, world = 1;
  dckpt_comm_rank(&rank, comm);
  dckpt_comm_size(&world, comm);
  dckpt_state* state = nullptr;
  CALL("dckpt_state_new", dckpt_state_new(&state));
  StateOwner state_owner(state, &dckpt_state_free);
  std::vector<std::vector<uint8_t>> buffers;
  buffers.reserve(Specs().size());
  for (const Spec& t : Specs()) {
    std::vector<uint64_t> off, len;
    Rows(t, rank, world, &off, &len);
    buffers.push_back(Expected(t, off, len, variant));
    CALL("add_tensor", dckpt_state_add_tensor(state, t.name, t.dtype, t.shape.size(), t.shape.data()));
    CALL("add_piece", dckpt_state_add_piece(state, t.name, off.data(), len.data(),
                                            buffers.back().empty() ? nullptr : buffers.back().data()));
  }
  for (const auto& blob : kBlobs) {
    CALL("add_bytes", dckpt_state_add_bytes(state, blob[0], const_cast<char*>(blob[1]), std::strlen(blob[1])));
  }
  CALL("set_user", dckpt_state_set_user(state, "step", variant == 0 ? "777" : "778"));
  CALL("set_user", dckpt_state_set_user(state, "framework", "corruption-suite"));
  CALL("set_structure", dckpt_state_set_structure(state, kStructure, std::strlen(kStructure)));
  dckpt_save_options opts = DCKPT_SAVE_OPTIONS_INIT;
  opts.checksum_block_size = 4096;
  opts.sync = 0;
  CALL("dckpt_save", dckpt_save(nullptr, path.c_str(), state, comm, &opts));
  return 0;
}

// A resharded load: 2-D tensors by column halves, everything else whole; or, collectively, each rank its columns.
int CheckLoad(const std::string& path, uint64_t variant, dckpt_comm* comm, int rank, int world) {
  dckpt_state* state = nullptr;
  CALL("dckpt_state_new", dckpt_state_new(&state));
  StateOwner state_owner(state, &dckpt_state_free);
  struct Piece {
    const Spec* t;
    std::vector<uint64_t> off, len;
    std::vector<uint8_t> got;
  };
  std::vector<Piece> pieces;
  pieces.reserve(2 * Specs().size());
  for (const Spec& t : Specs()) {
    CALL("add_tensor", dckpt_state_add_tensor(state, t.name, t.dtype, t.shape.size(), t.shape.data()));
    const int parts = t.shape.size() == 2 ? 2 * world : world;
    for (int p = 0; p < parts; ++p) {
      if (p % world != rank) continue;
      Piece piece{&t, std::vector<uint64_t>(t.shape.size(), 0), t.shape, {}};
      if (!t.shape.empty()) {
        const size_t d = t.shape.size() - 1;
        piece.off[d] = t.shape[d] * p / parts;
        piece.len[d] = t.shape[d] * (p + 1) / parts - piece.off[d];
      }
      piece.got.assign(Volume(piece.len) * dckpt_dtype_size(t.dtype), 0xA5);
      pieces.push_back(std::move(piece));
      Piece& q = pieces.back();
      CALL("add_piece", dckpt_state_add_piece(state, t.name, q.off.data(), q.len.data(),
                                              q.got.empty() ? nullptr : q.got.data()));
    }
  }
  std::vector<std::vector<char>> blobs;
  for (const auto& blob : kBlobs) {
    blobs.emplace_back(64, '\x5a');
    CALL("add_bytes", dckpt_state_add_bytes(state, blob[0], blobs.back().data(), blobs.back().size()));
  }
  CALL("dckpt_load", dckpt_load(nullptr, path.c_str(), state, comm, nullptr));
  for (const Piece& p : pieces) {
    if (p.got != Expected(*p.t, p.off, p.len, variant)) Wrong(std::string("load of '") + p.t->name + "'");
  }
  for (size_t i = 0; i < blobs.size(); ++i) {
    uint64_t size = 0;
    CALL("bytes_size", dckpt_state_bytes_size(&size, state, kBlobs[i][0]));
    if (size != std::strlen(kBlobs[i][1]) || std::memcmp(blobs[i].data(), kBlobs[i][1], size) != 0) {
      Wrong(std::string("bytes entry '") + kBlobs[i][0] + "'");
    }
  }
  return 0;
}

// Everything through a reader: the entry table, user metadata, structure, every row of every tensor, bytes, verify.
int CheckReader(const std::string& path, uint64_t variant) {
  dckpt_reader* r = nullptr;
  CALL("dckpt_reader_open", dckpt_reader_open(&r, path.c_str(), nullptr, nullptr));
  ReaderOwner reader_owner(r, &dckpt_reader_free);
  dckpt_checkpoint_info info = DCKPT_CHECKPOINT_INFO_INIT;
  CALL("dckpt_reader_info", dckpt_reader_info(&info, r));
  if (info.num_entries != Specs().size() + 2) Wrong("number of entries " + std::to_string(info.num_entries));
  if (info.format_major != 1 || info.format_minor != 2) Wrong("format version");
  if (std::string(info.writer) != std::string("distckpt ") + dckpt_version_string()) {
    Wrong(std::string("writer '") + info.writer + "'");
  }
  if (info.num_files != 3 || info.checksum_block_size != 4096) Wrong("file count or checksum block size");
  // Every entry the table lists is one this checkpoint was saved with, of the right kind.
  for (size_t i = 0; i < info.num_entries; ++i) {
    dckpt_entry_info e = DCKPT_ENTRY_INFO_INIT;
    CALL("entry", dckpt_reader_entry(&e, r, i));
    bool known = false;
    for (const Spec& t : Specs()) known = known || (std::strcmp(e.name, t.name) == 0 && e.kind == DCKPT_ENTRY_TENSOR);
    for (const auto& blob : kBlobs) known = known || (std::strcmp(e.name, blob[0]) == 0 && e.kind == DCKPT_ENTRY_BYTES);
    if (!known) Wrong(std::string("unknown entry '") + e.name + "'");
  }
  const char* value = nullptr;
  CALL("user step", dckpt_reader_user_get(&value, r, "step"));
  if (std::strcmp(value, variant == 0 ? "777" : "778") != 0) Wrong(std::string("user step = ") + value);
  CALL("user framework", dckpt_reader_user_get(&value, r, "framework"));
  if (std::strcmp(value, "corruption-suite") != 0) Wrong(std::string("user framework = ") + value);
  size_t nuser = 0;
  CALL("num_user", dckpt_reader_num_user(&nuser, r));
  if (nuser != 2) Wrong("number of user keys");
  const char* structure = nullptr;
  size_t structure_size = 0;
  CALL("structure", dckpt_reader_structure(&structure, &structure_size, r));
  if (std::string(structure, structure_size) != kStructure) Wrong("structure");
  for (const Spec& t : Specs()) {
    size_t index = 0;
    CALL("find", dckpt_reader_find(&index, r, t.name));
    dckpt_entry_info e = DCKPT_ENTRY_INFO_INIT;
    CALL("entry", dckpt_reader_entry(&e, r, index));
    if (e.dtype != t.dtype || e.ndim != t.shape.size() || !std::equal(t.shape.begin(), t.shape.end(), e.shape)) {
      Wrong(std::string("dtype or shape of '") + t.name + "'");
      continue;
    }
    // One row at a time: partial reads that cut through chunks and checksum blocks.
    const uint64_t rows = t.shape.empty() ? 1 : t.shape[0];
    for (uint64_t row = 0; row < rows; ++row) {
      std::vector<uint64_t> off(t.shape.size(), 0), len = t.shape;
      if (!t.shape.empty()) off[0] = row, len[0] = 1;
      const std::vector<uint8_t> want = Expected(t, off, len, variant);
      std::vector<uint8_t> got(want.size(), 0x3c);
      CALL("dckpt_reader_read", dckpt_reader_read(r, t.name, t.shape.size(), off.data(), len.data(), got.data(),
                                                  got.size()));
      if (got != want) {
        Wrong(std::string("row ") + std::to_string(row) + " of '" + t.name + "'");
        break;
      }
    }
  }
  for (const auto& blob : kBlobs) {
    std::vector<char> got(64);
    uint64_t size = 0;
    CALL("dckpt_reader_read_bytes", dckpt_reader_read_bytes(&size, r, blob[0], got.data(), got.size()));
    if (size != std::strlen(blob[1]) || std::memcmp(got.data(), blob[1], size) != 0) {
      Wrong(std::string("bytes entry '") + blob[0] + "' through the reader");
    }
  }
  CALL("dckpt_reader_verify", dckpt_reader_verify(r, nullptr, nullptr));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, path;
  uint64_t variant = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") mode = v;
    else if (k == "--path") path = v;
    else if (k == "--variant") variant = std::strtoull(v.c_str(), nullptr, 10);
  }
  if (path.empty() || (mode != "save" && mode != "check")) {
    std::fprintf(stderr, "usage: %s --mode save|check --path CKPT [--variant V]\n", argv[0]);
    return 64;
  }
  if (mode == "save") return Save(path, variant);
  const char* world_env = std::getenv("DCKPT_WORLD_SIZE");
  int rc = 0;
  if (world_env != nullptr && std::atoi(world_env) > 1) {
    dckpt_comm* comm = nullptr;
    CALL("dckpt_comm_new_gloo", dckpt_comm_new_gloo(&comm, nullptr));
    CommOwner comm_owner(comm, &dckpt_comm_free);
    int rank = 0, world = 1;
    dckpt_comm_rank(&rank, comm);
    dckpt_comm_size(&world, comm);
    rc = CheckLoad(path, variant, comm, rank, world);
  } else {
    rc = CheckLoad(path, variant, nullptr, 0, 1);
    if (rc == 0) rc = CheckReader(path, variant);
  }
  if (rc != 0) return rc;
  if (g_wrong > 0) return 2;
  std::printf("exact\n");
  return 0;
}
