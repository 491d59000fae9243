#include "core/engine/load.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/base/wire.h"
#include "core/engine/coordinator_round.h"
#include "core/engine/fanout.h"
#include "core/engine/shared_verify.h"

namespace distckpt {
namespace {

std::string ShapeString(Span<const uint64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// Plans every tensor piece of `state` into `batch` (nothing is read yet).
Status PlanTensors(Reader* reader, State& state, ReadBatch* batch) {
  const MetadataView& meta = reader->metadata();
  const std::string& path = reader->path();
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
    std::vector<ReadTarget> targets;
    for (const TensorPiece& p : t.pieces) {
      if (p.read_only) {
        return InvalidArgument("loading '" + path + "': tensor '" + t.name + "' piece " + p.box.ToString() +
                               " was added as read-only (dckpt_state_add_piece_const); a load needs a writable "
                               "buffer (dckpt_state_add_piece)");
      }
      targets.push_back(ReadTarget{p.box, p.data, p.memory});
    }
    DCKPT_RETURN_IF_ERROR(batch->Add(*idx, targets));
  }
  return OkStatus();
}

// What this rank will verify, for ShareVerification.
Result<VerifyClaim> Claim(Reader* reader, ReadBatch* batch) {
  VerifyClaim claim;
  DCKPT_ASSIGN_OR_RETURN(claim.ranges, batch->VerifiedRanges());
  for (const FileRange& r : claim.ranges) {
    if (!claim.identities.empty() && claim.identities.back().first == r.file) continue;
    DCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, reader->File(r.file));
    claim.identities.emplace_back(r.file, IdentityDigest(file->CacheIdentity()));
  }
  return claim;
}

// What this rank reads and through which caches, for the fan-out.
Status Needs(Reader* reader, ReadBatch* batch, FanoutNeeds* needs) {
  DCKPT_ASSIGN_OR_RETURN(needs->ranges, batch->NeededRanges());
  std::vector<uint32_t> files;
  for (const ChunkRange& r : needs->ranges) files.push_back(reader->metadata().entry(r.entry).chunk(r.chunk).file);
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  for (uint32_t f : files) {
    DCKPT_ASSIGN_OR_RETURN(const ReadableFile* file, reader->File(f));
    needs->identities.emplace_back(f, IdentityDigest(file->CacheIdentity()));
  }
  needs->take_part = true;
  return OkStatus();
}

// The load proper, for a reader that opened, or failed to open with `st`: every rank takes part in the collectives
// whatever its state, so that they stay matched.
Result<LoadSummary> Run(Reader* reader, Status st, const std::string& path, State& state, Communicator* comm,
                        const ReadOptions& options, const ProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  const bool collective = comm != nullptr && comm->size() > 1;
  // The reader's own options say whether to verify: never for a foreign checkpoint, which has no checksums.
  const bool verify = reader != nullptr ? reader->options().verify : options.verify;
  std::unique_ptr<ReadBatch> batch;
  if (st.ok()) {
    batch = std::make_unique<ReadBatch>(reader);
    st = PlanTensors(reader, state, batch.get());
  }
  for (const BytesEntry& b : state.bytes()) {
    if (st.ok() && b.read_only) {
      st = InvalidArgument("loading '" + path + "': bytes entry '" + b.name +
                           "' was added as read-only "
                           "(dckpt_state_add_bytes_const); a load needs a writable buffer (dckpt_state_add_bytes)");
    }
  }
  bool ran = false;
  if (collective) {
    // First the plans (a rank that failed sends its error instead, and nobody starts reading): the ranges this rank
    // reads, for the fan-out, or else the ones it verifies, for shared verification. At the end the outcome.
    VerifyClaim claim;
    FanoutNeeds needs;
    needs.verify = verify;
    needs.always = options.fanout == FanoutMode::kAlways;
    needs.round_bytes = options.fanout_round_bytes;
    if (st.ok() && options.fanout != FanoutMode::kOff) {
      auto made = Needs(reader, batch.get(), &needs);
      if (!made.ok()) st = made;
    }
    if (st.ok() && verify && options.share_verification) {
      auto made = Claim(reader, batch.get());
      if (made.ok()) claim = std::move(made).value();
      else st = made.status();
    }
    const uint64_t block = reader != nullptr ? reader->metadata().checksum_block_size() : 1;
    auto plan = ExchangeLoadPlans(comm, st, claim, needs, block, options.timeout);
    if (!plan.ok()) return st.ok() ? plan.status().WithContext("loading '" + path + "'") : st;
    batch->SetVerifyFilter(std::move(plan->filter));
    if (plan->fanout) {
      bool comm_failed = false;
      Status fanned = RunFanoutLoad(comm, batch.get(), *plan, st, progress, options.timeout, &comm_failed);
      if (!fanned.ok() && st.ok()) {
        st = fanned.code() == StatusCode::kPeer || comm_failed ? fanned.WithContext("loading '" + path + "'") : fanned;
      }
      if (comm_failed) return st;
      ran = true;
    }
  }
  if (st.ok() && !ran) st = batch->Run(progress);
  if (st.ok()) {
    for (BytesEntry& b : state.bytes()) {
      auto size = reader->ReadBytes(b.name, b.data, b.size);
      if (!size.ok()) {
        st = size.status();
        break;
      }
      b.loaded_size = *size;
    }
  }
  if (collective) {
    // Everyone learns whether everyone succeeded (and who is missing), so no rank continues with a half-loaded model.
    // A block another rank verified for this one is covered here too: its mismatch fails every rank.
    Status all = AgreeOnStatus(comm, st, options.timeout);
    if (st.ok() && !all.ok()) return all.WithContext("loading '" + path + "'");
  }
  if (!st.ok()) return st;
  LoadSummary summary;
  summary.io = reader->io_stats();
  summary.entries = static_cast<uint32_t>(state.tensors().size() + state.bytes().size());
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace

Result<LoadSummary> Load(const std::string& path, State& state, Communicator* comm, const ReadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  // Only the files this rank reads are opened (a load on many ranks would otherwise open every file on every rank),
  // through the directory opened with the metadata, so a checkpoint replaced mid-load fails the load instead of
  // mixing two checkpoints.
  auto reader = Reader::Open(path, comm, options, FilePinning::kOnFirstUse);
  auto summary =
      Run(reader.ok() ? reader->get() : nullptr, reader.status(), path, state, comm, options, options.progress);
  if (summary.ok()) {
    summary->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return summary;
}

Result<LoadSummary> Load(Reader* reader, State& state, Communicator* comm, const ProgressFn& progress) {
  if (reader == nullptr) return InvalidArgument("Load: null reader");
  return Run(reader, OkStatus(), reader->path(), state, comm, reader->options(), progress);
}

}  // namespace distckpt
