// Writes the golden checkpoint of the current format version under tests/golden/ (v<major>_<minor>_all_dtypes; the
// 1.0 one is v1_all_dtypes). Run once per format version, never to "fix" a test, and never over a committed golden:
//   bazel run //tests/golden:make_golden -- $PWD/tests/golden
// With --incremental BASE, the format 2.0 golden instead (v2_0_all_dtypes): the same values saved as an incremental
// save of the sibling golden BASE, with the first tensor split into one more piece, so that its chunks are written
// (they differ in their boxes) and every other chunk is a reference into BASE.
// With --compressed, the format 3.0 golden (v3_0_all_dtypes): the same values as the 1.2 one, saved with
// compression (zstd level 3), so that every chunk that shrinks is stored compressed.
// The committed checkpoints must stay readable forever (golden_test).
#include <cstdio>
#include <string>
#include <vector>

#include "core/engine/save.h"
#include "core/format/metadata.h"
#include "core/storage/storage.h"
#include "tests/golden/golden_values.h"

namespace distckpt {
namespace golden {
namespace {

int Main(int argc, char** argv) {
  const bool compressed = argc == 3 && std::string(argv[2]) == "--compressed";
  if (argc != 2 && !compressed && !(argc == 4 && std::string(argv[2]) == "--incremental")) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR [--incremental BASE | --compressed]\n", argv[0]);
    return 2;
  }
  const std::string base = argc == 4 ? argv[3] : "";
  const auto version = [](int major, int minor) { return "/v" + std::to_string(major) + "_" + std::to_string(minor); };
  const std::string path = std::string(argv[1]) +
                           (compressed     ? version(kFormatMajorCompression, kFormatMinorCompression)
                            : base.empty() ? version(kFormatMajor, kFormatMinor)
                                           : version(kFormatMajorReferences, kFormatMinorReferences)) +
                           "_all_dtypes";
  bool first = true;
  State state;
  std::vector<std::vector<uint8_t>> buffers;
  for (const GoldenTensor& t : AllDtypesTensors()) {
    if (!state.AddTensor(t.name, t.dtype, t.shape).ok()) return 1;
    const uint64_t item = DTypeSize(t.dtype);
    const uint64_t rows = t.shape.empty() ? 1 : t.shape[0];
    uint64_t row_elems = 1;
    for (size_t d = 1; d < t.shape.size(); ++d) row_elems *= t.shape[d];
    const uint64_t pieces = t.row_pieces + (!base.empty() && first && rows > t.row_pieces ? 1 : 0);
    first = false;
    for (uint64_t p = 0; p < pieces; ++p) {
      std::vector<uint64_t> off(t.shape.size(), 0), len = t.shape;
      uint64_t lo = rows * p / pieces, hi = rows * (p + 1) / pieces;
      if (!t.shape.empty()) {
        off[0] = lo;
        len[0] = hi - lo;
      }
      buffers.emplace_back((hi - lo) * row_elems * item);
      for (uint64_t e = 0; e < (hi - lo) * row_elems; ++e) {
        for (uint64_t k = 0; k < item; ++k) buffers.back()[e * item + k] = GoldenByte(t.name, lo * row_elems + e, k);
      }
      if (!state.AddPiece(t.name, off, len, buffers.back().data()).ok()) return 1;
    }
  }
  std::string blob = GoldenBytesValue();
  if (!state.AddBytes("train.state", blob.data(), blob.size()).ok()) return 1;
  state.SetUserMetadata("step", "42");
  state.SetUserMetadata("framework", "golden");
  state.SetStructure("{\"golden\": true}");
  SaveOptions so;
  so.checksum_block_size = 4096;
  so.base = base;
  if (compressed) {
    so.compression = Codec::kZstdGrouped;
    so.compression_level = 3;  // with match finding: the golden values are too few for the entropy coder alone
  }
  auto r = Save(path, state, nullptr, so);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("wrote %s (%u entries)\n", path.c_str(), r->num_entries);
  return 0;
}

}  // namespace
}  // namespace golden
}  // namespace distckpt

int main(int argc, char** argv) { return distckpt::golden::Main(argc, argv); }
