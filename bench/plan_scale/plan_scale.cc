// Save planning at scale: 1,024 simulated ranks x 1,000 tensors (~1M boxes). Times MakeGlobalPlan (which includes
// the exact-tiling validation), reports peak RSS and bytes per chunk, and times the LocalPlan / RankAssignment codecs
// that carry the plans between ranks. Single-threaded, like the planner.
//
//   bazel run -c opt //bench/plan_scale -- [--ranks=N] [--tensors=N] [--repeat=N] [--shuffle=1] [--write=DIR]
// --write=DIR also commits the planned checkpoint's metadata (zero checksums) at DIR, with sparse data files of the
// planned sizes, so that bench/run can time opening it (bench_worker --mode open) at this scale.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/common/process_stats.h"
#include "core/base/box.h"
#include "core/format/checksum.h"
#include "core/format/metadata.h"
#include "core/plan/plan_codec.h"
#include "core/plan/save_planner.h"

namespace distckpt {
namespace {

using bench::Now;

Box MakeBox(std::vector<uint64_t> off, std::vector<uint64_t> len) { return Box::Make(off, len).value(); }

// A transformer-like state: per layer, large matrices row- or column-sharded across every rank (FSDP / tensor
// parallel) and small vectors replicated on every rank (DDP-style norms and biases).
// With `shuffle`, every rank declares its tensors in its own order (defeats the planner's same-order fast path).
std::vector<LocalPlan> MakePlans(uint32_t ranks, uint32_t tensors, bool shuffle, uint64_t* boxes) {
  std::vector<LocalPlan> plans(ranks);
  *boxes = 0;
  for (uint32_t r = 0; r < ranks; ++r) {
    LocalPlan& p = plans[r];
    p.rank = r;
    p.tensors.reserve(tensors);
    for (uint32_t i = 0; i < tensors; ++i) {
      const std::string layer = "model.layers." + std::to_string(i / 10) + ".";
      LocalTensorDecl t;
      const uint64_t width = 1024 << (i % 3);
      switch (i % 10) {
        case 0:
        case 2:
        case 4:
        case 6: {  // row-sharded 2-D weight, rows_per_rank rows each
          const uint64_t rows = 1 + i % 5;
          t.name = layer + "mlp.proj_" + std::to_string(i % 10) + ".weight";
          t.dtype = DType::kBF16;
          t.shape = {rows * ranks, width};
          t.boxes.push_back(MakeBox({rows * r, 0}, {rows, width}));
          break;
        }
        case 8: {  // column-sharded (tensor parallel) 2-D weight
          t.name = layer + "attn.o_proj.weight";
          t.dtype = DType::kBF16;
          t.shape = {width, 4ull * ranks};
          t.boxes.push_back(MakeBox({0, 4ull * r}, {width, 4}));
          break;
        }
        default: {  // replicated vector: every rank holds the whole thing
          t.name = layer + "norm_" + std::to_string(i % 10) + ".weight";
          t.dtype = DType::kF32;
          t.shape = {width};
          t.boxes.push_back(MakeBox({0}, {width}));
          break;
        }
      }
      *boxes += t.boxes.size();
      p.tensors.push_back(std::move(t));
    }
    if (shuffle) std::shuffle(p.tensors.begin(), p.tensors.end(), std::mt19937(r));
    p.bytes.push_back(LocalBytesDecl{"rng_state." + std::to_string(r), 5056});
    p.bytes.push_back(LocalBytesDecl{"trainer_state", 1 << 20});
  }
  return plans;
}

// Commits `plan` at `dir` as a checkpoint: metadata with zero checksums, data files of the planned sizes (sparse).
bool WriteCheckpoint(GlobalPlan plan, const std::string& dir) {
  std::vector<ChunkChecksums> reports;
  for (const auto& tasks : plan.per_rank) {
    for (const WriteTask& t : tasks) {
      ChunkChecksums c;
      c.entry = t.entry;
      c.chunk = t.chunk;
      const uint64_t nblocks = NumChecksumBlocks(t.length, plan.metadata.checksum_block_size);
      if (nblocks > 1) c.blocks.assign(nblocks, 0);
      c.checksum = nblocks > 1 ? CombineBlockChecksums(c.blocks) : 0;
      reports.push_back(std::move(c));
    }
  }
  if (!FinalizeChecksums(reports, &plan).ok()) return false;
  plan.metadata.writer = "plan_scale";
  auto encoded = EncodeMetadata(std::move(plan.metadata));
  if (!encoded.ok()) return false;
  ::mkdir(dir.c_str(), 0755);
  auto decoded = MetadataView::Parse(std::make_shared<const std::string>(*encoded), dir);
  if (!decoded.ok()) return false;
  for (size_t f = 0; f < decoded->num_files(); ++f) {
    const std::string path = dir + "/" + std::string(decoded->file_name(f));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(decoded->file_size(f))) != 0) return false;
    ::close(fd);
  }
  FILE* out = std::fopen((dir + "/" + kMetadataFileName).c_str(), "wb");
  if (out == nullptr || std::fwrite(encoded->data(), 1, encoded->size(), out) != encoded->size()) return false;
  std::fclose(out);
  std::printf("wrote %s/%s: %zu bytes\n", dir.c_str(), kMetadataFileName, encoded->size());
  return true;
}

const char* StringFlag(int argc, char** argv, const char* name) {
  const size_t n = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') return argv[i] + n + 1;
  }
  return nullptr;
}

uint32_t Flag(int argc, char** argv, const char* name, uint32_t fallback) {
  const size_t n = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=')
      return static_cast<uint32_t>(std::atoi(argv[i] + n + 1));
  }
  return fallback;
}

int Main(int argc, char** argv) {
  const uint32_t ranks = Flag(argc, argv, "--ranks", 1024);
  const uint32_t tensors = Flag(argc, argv, "--tensors", 1000);
  const uint32_t repeat = std::max<uint32_t>(1, Flag(argc, argv, "--repeat", 3));
  const bool shuffle = Flag(argc, argv, "--shuffle", 0) != 0;

  uint64_t boxes = 0;
  double t0 = Now();
  const std::vector<LocalPlan> plans = MakePlans(ranks, tensors, shuffle, &boxes);
  const double build_s = Now() - t0;
  const uint64_t rss_inputs = bench::CurrentRssBytes();
  std::printf(
      "plan_scale: %u ranks x %u tensors%s = %llu boxes (+%u bytes entries), inputs built in %.2f s, "
      "RSS %.0f MiB\n",
      ranks, tensors, shuffle ? " (declared in per-rank random order)" : "", static_cast<unsigned long long>(boxes),
      2 * ranks, build_s, rss_inputs / 1048576.0);

  // Global planning, best of `repeat` (the machine is shared).
  std::vector<double> times;
  size_t chunks = 0, files = 0;
  uint64_t data_bytes = 0, max_load = 0, min_load = UINT64_MAX;
  uint64_t peak_delta = 0;
  double validate_s = 0;
  for (uint32_t k = 0; k < repeat; ++k) {
    t0 = Now();
    auto plan = MakeGlobalPlan(plans, SavePlanOptions{});
    const double dt = Now() - t0;
    if (!plan.ok()) {
      std::fprintf(stderr, "MakeGlobalPlan failed: %s\n", plan.status().ToString().c_str());
      return 1;
    }
    times.push_back(dt);
    if (k == 0) {
      peak_delta = bench::PeakRssBytes() - rss_inputs;
      // The validation share: CheckExactTiling again over every planned tensor, on its own.
      std::vector<Box> tiles;
      const double v0 = Now();
      for (const EntryRecord& e : plan->metadata.entries) {
        const uint32_t nd = static_cast<uint32_t>(e.shape.size());
        tiles.resize(e.chunks.size());
        for (size_t c = 0; c < e.chunks.size(); ++c) {
          tiles[c].ndim = nd;
          std::copy_n(&e.chunk_offsets[c * nd], nd, tiles[c].offset);
          std::copy_n(&e.chunk_lengths[c * nd], nd, tiles[c].length);
        }
        if (!CheckExactTiling(e.shape, tiles).ok()) return 1;
      }
      validate_s = Now() - v0;
      for (const EntryRecord& e : plan->metadata.entries) chunks += e.chunks.size();
      files = plan->metadata.files.size();
      for (const auto& tasks : plan->per_rank) {
        uint64_t load = 0;
        for (const WriteTask& t : tasks) load += t.length;
        data_bytes += load;
        max_load = std::max(max_load, load);
        min_load = std::min(min_load, load);
      }
    }
  }
  std::sort(times.begin(), times.end());
  std::printf("MakeGlobalPlan (incl. tiling validation): best %.3f s, median %.3f s over %u runs\n", times.front(),
              times[times.size() / 2], repeat);
  std::printf("  of which CheckExactTiling alone: %.3f s\n", validate_s);
  std::printf("  %zu chunks, %zu files, %.2f GiB of data; per-rank load %.1f..%.1f MiB\n", chunks, files,
              data_bytes / 1073741824.0, min_load / 1048576.0, max_load / 1048576.0);
  std::printf("  %.0f ns per input box; peak RSS %.0f MiB, planning added %.0f MiB = %.0f bytes per chunk\n",
              times.front() * 1e9 / static_cast<double>(boxes), bench::PeakRssBytes() / 1048576.0, peak_delta / 1048576.0,
              static_cast<double>(peak_delta) / static_cast<double>(chunks));

  // The collective messages: every rank's LocalPlan to the coordinator, a RankAssignment back.
  t0 = Now();
  std::vector<std::string> messages;
  messages.reserve(ranks);
  uint64_t message_bytes = 0;
  for (const LocalPlan& p : plans) {
    messages.push_back(EncodeLocalPlan(p).value());
    message_bytes += messages.back().size();
  }
  const double encode_s = Now() - t0;
  t0 = Now();
  std::vector<LocalPlan> decoded;
  decoded.reserve(ranks);
  for (const std::string& m : messages) decoded.push_back(DecodeLocalPlan(m).value());
  const double decode_s = Now() - t0;
  std::printf("EncodeLocalPlan x%u: %.3f s, %.1f MiB (%.1f bytes per declaration); DecodeLocalPlan: %.3f s\n", ranks,
              encode_s, message_bytes / 1048576.0,
              static_cast<double>(message_bytes) / static_cast<double>(ranks * (tensors + 2)), decode_s);

  auto plan = MakeGlobalPlan(decoded, SavePlanOptions{});
  if (!plan.ok()) return 1;
  t0 = Now();
  uint64_t assignment_bytes = 0;
  for (uint32_t r = 0; r < ranks; ++r) {
    const std::string m = EncodeRankAssignment(GetRankAssignment(*plan, r).value()).value();
    assignment_bytes += m.size();
    if (!DecodeRankAssignment(m).ok()) return 1;
  }
  std::printf("RankAssignment encode+decode x%u: %.3f s, %.1f MiB\n", ranks, Now() - t0, assignment_bytes / 1048576.0);
  if (const char* dir = StringFlag(argc, argv, "--write")) {
    if (!WriteCheckpoint(std::move(plan).value(), dir)) {
      std::fprintf(stderr, "cannot write the checkpoint at %s\n", dir);
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace distckpt

int main(int argc, char** argv) { return distckpt::Main(argc, argv); }
