#include "core/engine/load.h"

#include <chrono>

#include "core/base/wire.h"
#include "core/engine/coordinator_round.h"

namespace distckpt {
namespace {

std::string ShapeString(Span<const uint64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

Status LoadLocal(Reader* reader, State& state) {
  const MetadataView& meta = reader->metadata();
  const std::string& path = reader->path();
  std::vector<Reader::EntryTargets> work;
  for (const TensorEntry& t : state.tensors()) {
    auto idx = meta.Find(t.name);
    if (!idx) return NotFound("checkpoint '" + path + "' has no entry '" + t.name + "'");
    EntryView e = meta.entry(*idx);
    if (e.kind != EntryKind::kTensor) {
      return InvalidArgument("checkpoint '" + path + "': entry '" + t.name + "' is a bytes entry, not a tensor");
    }
    if (e.dtype != t.dtype) {
      return InvalidArgument("checkpoint '" + path + "': entry '" + t.name + "' is " + DTypeName(e.dtype) +
                             " in the checkpoint but " + DTypeName(t.dtype) + " in the destination");
    }
    if (!std::equal(e.shape.begin(), e.shape.end(), t.shape.begin(), t.shape.end())) {
      return InvalidArgument("checkpoint '" + path + "': entry '" + t.name + "' has shape " + ShapeString(e.shape) +
                             " in the checkpoint but " + ShapeString(t.shape) + " in the destination");
    }
    Reader::EntryTargets w{*idx, {}};
    for (const TensorPiece& p : t.pieces) w.targets.push_back(ReadTarget{p.box, p.data});
    work.push_back(std::move(w));
  }
  DCKPT_RETURN_IF_ERROR(reader->ReadMany(work));
  for (BytesEntry& b : state.bytes()) {
    DCKPT_ASSIGN_OR_RETURN(b.loaded_size, reader->ReadBytes(b.name, b.data, b.size));
  }
  return OkStatus();
}

}  // namespace

Result<LoadSummary> Load(const std::string& path, State& state, Communicator* comm, const ReadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto reader = Reader::Open(path, comm, options);
  Status st = reader.ok() ? LoadLocal(reader->get(), state) : reader.status();
  if (comm != nullptr && comm->size() > 1) {
    // Everyone learns whether everyone succeeded (and who is missing), so no rank continues with a half-loaded model.
    Status all = AgreeOnStatus(comm, st.WithContext("rank " + std::to_string(comm->rank())), options.timeout);
    if (st.ok() && !all.ok()) return all.WithContext("loading '" + path + "'");
  }
  if (!st.ok()) return st;
  LoadSummary summary;
  summary.io = (*reader)->io_stats();
  summary.entries = static_cast<uint32_t>(state.tensors().size() + state.bytes().size());
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace distckpt
