#include "tests/faults/test_state.h"

#include <algorithm>

#include "core/engine/load.h"
#include "core/engine/reader.h"

namespace distckpt {
namespace testing_util {
namespace {

uint8_t Byte(const std::string& name, uint64_t i, uint64_t variant) {
  // "model.emb" stands for frozen weights: the same in every variant of a thousand (incremental saves refer to it).
  if (name == "model.emb") variant /= 1000;
  uint64_t h = 14695981039346656037ull ^ variant;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return static_cast<uint8_t>((h >> 29) + i * 131 + (i >> 11) + variant * 17);
}

}  // namespace

TestState::TestState(bool for_save, int rank, int world, uint64_t variant, uint64_t mib) : variant_(variant) {
  const uint64_t rows = std::max<uint64_t>(8, mib * 1024 / 2);  // model.w: half the state, rows of 1 KiB
  tensors_ = {{"model.w", DType::kF32, {rows, 256}, {}, {}, {}},
              {"model.emb", DType::kBF16, {rows, 512}, {}, {}, {}},
              {"model.bias", DType::kF32, {256}, {}, {}, {}},
              {"model.scale", DType::kF64, {}, {}, {}, {}}};
  for (Tensor& t : tensors_) {
    const bool replicated = t.shape.size() < 2;
    t.off.assign(t.shape.size(), 0);
    t.len = t.shape;
    if (!replicated) {
      t.off[0] = t.shape[0] * rank / world;
      t.len[0] = t.shape[0] * (rank + 1) / world - t.off[0];
    }
    uint64_t row_bytes = DTypeSize(t.dtype), rows_here = t.shape.empty() ? 1 : t.len[0];
    for (size_t d = 1; d < t.shape.size(); ++d) row_bytes *= t.shape[d];
    const uint64_t first = t.shape.empty() ? 0 : t.off[0] * row_bytes;
    t.data.resize(rows_here * row_bytes);
    for (uint64_t b = 0; b < t.data.size(); ++b) t.data[b] = for_save ? Byte(t.name, first + b, variant) : 0xEE;
    if (status_.ok()) status_ = state_.AddTensor(t.name, t.dtype, t.shape);
    if (status_.ok()) status_ = state_.AddPiece(t.name, t.off, t.len, t.data.empty() ? nullptr : t.data.data());
  }
  blob_ = "optimizer state " + std::to_string(variant);
  blob_in_.assign(64, 0);
  if (status_.ok()) {
    status_ = for_save ? state_.AddBytes("optim.state", blob_.data(), blob_.size())
                       : state_.AddBytes("optim.state", blob_in_.data(), blob_in_.size());
  }
  state_.SetUserMetadata("step", std::to_string(variant));
}

std::string TestState::Mismatch() const {
  std::string out;
  for (const Tensor& t : tensors_) {
    uint64_t row_bytes = DTypeSize(t.dtype);
    for (size_t d = 1; d < t.shape.size(); ++d) row_bytes *= t.shape[d];
    const uint64_t first = t.shape.empty() ? 0 : t.off[0] * row_bytes;
    for (uint64_t b = 0; b < t.data.size(); ++b) {
      if (t.data[b] != Byte(t.name, first + b, variant_)) {
        out += "wrong values in '" + t.name + "' at byte " + std::to_string(b) + "; ";
        break;
      }
    }
  }
  if (state_.bytes()[0].loaded_size != blob_.size() || std::string(blob_in_.data(), blob_.size()) != blob_) {
    out += "wrong bytes entry; ";
  }
  return out;
}

void TestState::DropBuffers() {
  for (Tensor& t : tensors_) std::vector<uint8_t>().swap(t.data);
}

std::string CheckCheckpoint(const std::string& path, uint64_t variant, uint64_t mib) {
  auto reader = Reader::Open(path, nullptr, ReadOptions{});
  if (!reader.ok()) return reader.status().ToString();
  return CheckCheckpoint(reader->get(), variant, mib);
}

std::string CheckCheckpoint(Reader* reader, uint64_t variant, uint64_t mib) {
  TestState loaded(/*for_save=*/false, 0, 1, variant, mib);
  if (!loaded.status().ok()) return loaded.status().ToString();
  auto summary = Load(reader, loaded.state(), nullptr, ProgressFn());
  if (!summary.ok()) return summary.status().ToString();
  std::string why = loaded.Mismatch();
  auto step = reader->metadata().FindUser("step");
  if (!step || *step != std::to_string(variant)) why += "wrong user metadata; ";
  return why;
}

}  // namespace testing_util
}  // namespace distckpt
