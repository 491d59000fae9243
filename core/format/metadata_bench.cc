// Measures EncodeMetadata and MetadataView::Parse (verifier + every semantic check) on a large checkpoint:
// 1000 tensors of 1024 chunks each (~1M chunks). Not a test: run it by hand,
//   bazel run -c opt //core/format:metadata_bench
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "core/format/metadata.h"

namespace distckpt {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// grid_rows x grid_cols chunks per tensor, 2-D tensors of f32, chunks spread over `nfiles` files.
MetadataRecord MakeRecord(int ntensors, uint64_t grid_rows, uint64_t grid_cols, uint32_t nfiles) {
  MetadataRecord r;
  r.writer = "metadata_bench";
  const uint64_t rows_per = 8, cols_per = 16;  // 512-byte chunks
  std::vector<uint64_t> next(nfiles, 0);
  for (int t = 0; t < ntensors; ++t) {
    EntryRecord e;
    e.name = "layers." + std::to_string(t) + ".weight";
    e.dtype = DType::kF32;
    e.shape = {grid_rows * rows_per, grid_cols * cols_per};
    for (uint64_t i = 0; i < grid_rows; ++i) {
      for (uint64_t j = 0; j < grid_cols; ++j) {
        e.chunk_offsets.insert(e.chunk_offsets.end(), {i * rows_per, j * cols_per});
        e.chunk_lengths.insert(e.chunk_lengths.end(), {rows_per, cols_per});
        const uint32_t f = static_cast<uint32_t>((i * grid_cols + j) % nfiles);
        e.chunks.push_back({next[f], rows_per * cols_per * 4, 12345, f, kNoBlockTable});
        next[f] += kChunkAlignment;
      }
    }
    r.entries.push_back(std::move(e));
  }
  for (uint32_t f = 0; f < nfiles; ++f) {
    char name[32];
    std::snprintf(name, sizeof(name), "data-%05u.bin", f);
    r.files.push_back({name, next[f]});
  }
  r.user = {{"step", "1000"}, {"framework", "bench"}};
  return r;
}

void Run(const char* label, int ntensors, uint64_t rows, uint64_t cols) {
  MetadataRecord r = MakeRecord(ntensors, rows, cols, 64);
  auto t0 = std::chrono::steady_clock::now();
  Result<std::string> buf = EncodeMetadata(r);
  const double encode = Seconds(t0);
  if (!buf.ok()) {
    std::fprintf(stderr, "encode failed: %s\n", buf.status().ToString().c_str());
    std::exit(1);
  }
  auto shared = std::make_shared<const std::string>(std::move(*buf));
  double best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    t0 = std::chrono::steady_clock::now();
    Result<MetadataView> view = MetadataView::Parse(shared, "bench");
    best = std::min(best, Seconds(t0));
    if (!view.ok()) {
      std::fprintf(stderr, "parse failed: %s\n", view.status().ToString().c_str());
      std::exit(1);
    }
  }
  const uint64_t chunks = static_cast<uint64_t>(ntensors) * rows * cols;
  std::printf("%-28s %8llu chunks  %6.1f MiB  encode(incl. validation) %7.1f ms  parse+validate %7.1f ms  (%.0f ns/chunk)\n",
              label, static_cast<unsigned long long>(chunks), shared->size() / 1048576.0, encode * 1e3, best * 1e3,
              best * 1e9 / chunks);
}

}  // namespace
}  // namespace distckpt

int main() {
  distckpt::Run("1000 tensors x 32x32 grid", 1000, 32, 32);
  distckpt::Run("1000 tensors x 1024 rows", 1000, 1024, 1);
  distckpt::Run("10 tensors x 100000 rows", 10, 100000, 1);
  distckpt::Run("100000 tensors x 1 chunk", 100000, 1, 1);
  return 0;
}
