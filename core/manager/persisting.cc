// CheckpointManager::Persist: a complete step of the node-local tier becomes one ordinary checkpoint in persistent
// storage (core/manager/persist.h says how the work is split), and the persisted steps beyond keep_persistent go.
#include <algorithm>
#include <memory>
#include <optional>

#include "core/base/wire.h"
#include "core/engine/base_checkpoint.h"
#include "core/engine/coordinator_round.h"
#include "core/engine/incremental.h"
#include "core/manager/manager.h"
#include "core/manager/manager_util.h"
#include "core/manager/part.h"
#include "core/manager/persist.h"
#include "core/plan/plan_codec.h"
#include "core/tools/leftovers.h"

namespace distckpt {

using namespace manager_internal;  // NOLINT: the package's own helpers

namespace {

// The answer of a coordinator round: rank 0's status, then (when OK) `body`.
Status ReadAnswer(const Result<std::string>& answer, int me, std::string* body) {
  if (!answer.ok()) return answer.status();
  WireReader r(answer.value());
  Status st;
  if (!GetStatus(&r, &st) || (st.ok() && !r.Str(body))) return Internal("persist: malformed answer from rank 0");
  if (!st.ok() && me != 0 && st.code() != StatusCode::kPeer) {
    return Status(StatusCode::kPeer, "rank 0 failed: " + st.message());
  }
  return st;
}

std::string Answer(const Status& st, const std::string& body) {
  WireWriter w;
  PutStatus(&w, st);
  if (st.ok()) w.Str(body);
  return w.Take();
}

}  // namespace

// Rank 0 creates the staging checkpoint and, persisting incrementally, opens the newest persisted step before this
// one as the base. Every rank's part metadata goes to rank 0, which plans who writes what (PlanPersist); each rank
// copies its chunks into its data file; rank 0 merges the patched parts and commits. Returns the status of the
// collectives; *outcome: whether the step was persisted.
Status CheckpointManager::Persist(uint64_t step, Status* outcome) {
  const int me = comm_->rank(), size = comm_->size();
  const std::string path = options_.persistent_path + "/" + StepName(step);
  std::string hello;
  std::optional<StagedCheckpoint> staged;
  std::unique_ptr<IncrementalBase> base;
  if (me == 0) {
    const std::string nonce = NewNonce();
    // A step persisted again (a run after a restore) must not break a later persisted step that refers to it.
    Status st = CheckNoDependents(persistent_, path, "persisting again");
    if (st.ok()) {
      auto created = StagedCheckpoint::Create(persistent_, path, nonce, /*overwrite=*/true);
      if (created.ok()) staged.emplace(std::move(created).value());
      else st = created.status();
    }
    if (st.ok() && options_.persist_incremental) {
      // The newest committed persisted step before this one; none (or one that cannot be a base): written whole.
      auto names = persistent_->ListDir(options_.persistent_path);
      std::vector<uint64_t> steps;
      if (names.ok()) {
        for (const std::string& n : names.value()) {
          uint64_t s;
          if (ParseNumbered(n, "step-", 10, &s) && s < step) steps.push_back(s);
        }
      }
      std::sort(steps.rbegin(), steps.rend());
      for (uint64_t s : steps) {
        auto there = persistent_->Exists(options_.persistent_path + "/" + StepName(s) + "/" + kMetadataFileName);
        if (!there.ok() || !there.value()) continue;
        auto opened = IncrementalBase::Open(persistent_, path, StepName(s), options_.persist_full_every);
        if (opened.ok()) base = std::move(opened).value();
        break;
      }
    }
    WireWriter w;
    PutStatus(&w, st);
    w.Str(nonce);
    hello = w.Take();
  }
  DCKPT_RETURN_IF_ERROR(comm_->Broadcast(&hello, 0, options_.timeout));
  WireReader hr(hello);
  std::string nonce;
  Status st;
  if (!GetStatus(&hr, &st) || !hr.Str(&nonce)) return Internal("persist: malformed message from rank 0");
  if (!st.ok()) {
    *outcome = me == 0 ? st : Status(StatusCode::kPeer, "rank 0 could not start '" + path + "': " + st.message());
    *outcome = outcome->WithContext("persisting '" + path + "'");
    return OkStatus();
  }
  if (me != 0) staged.emplace(StagedCheckpoint::Join(persistent_, path, nonce, true));

  // This rank's part, to rank 0, which plans.
  const std::string part_dir = PartDir(step, me);
  std::string metadata;
  auto meta = local_->ReadFile(part_dir + "/" + kMetadataFileName, kMaxMetadataBytes);
  if (meta.ok()) metadata = meta.value();
  Result<Part> part = meta.ok() ? ParsePart(metadata, part_dir) : Result<Part>(meta.status());
  std::vector<Part> parts;  // rank 0
  PersistPlan plan;
  auto planned = CoordinatorRound(comm_, part.ok() ? OkStatus() : part.status(), metadata, options_.timeout,
                                  [&](std::vector<std::string>& reports) {
                                    Status result;
                                    auto parsed = ParseParts(step, reports);
                                    if (parsed.ok()) parts = std::move(parsed).value();
                                    else result = parsed.status();
                                    std::string encoded;
                                    if (result.ok()) {
                                      const MetadataRecord& first = parts[0].record;
                                      ReuseFn reuse;
                                      if (base && base->active()) {
                                        reuse = base->Reuse(first.checksum_block_size, first.alignment);
                                      }
                                      auto p = PlanPersist(&parts, reuse);
                                      if (p.ok()) plan = std::move(p).value();
                                      else result = p.status();
                                      encoded = EncodePlan(plan);
                                    }
                                    return Answer(result, encoded);
                                  });
  std::string encoded_plan;
  st = ReadAnswer(planned, me, &encoded_plan);
  if (!st.ok()) {  // every rank has the same answer: every rank stops here
    if (me == 0) (void)staged->Abort();
    *outcome = st.WithContext("persisting '" + path + "'");
    return OkStatus();
  }
  if (me != 0) {
    // A plan this rank cannot read fails this rank alone: it still takes part in the last round, which fails them all.
    auto decoded = DecodePlan(encoded_plan, static_cast<uint32_t>(size));
    if (decoded.ok()) plan = std::move(decoded).value();
    else st = decoded.status();
  }
  plan.writes.resize(size);

  // This rank's chunks, into its data file (numbered after those of the ranks below it that write one).
  const std::vector<uint32_t>& writes = plan.writes[me];
  std::vector<ChunkChecksums> placed;
  uint64_t stored = 0;
  if (st.ok() && !writes.empty()) {
    uint32_t index = 0;
    for (int r = 0; r < me; ++r) index += plan.writes[r].empty() ? 0 : 1;
    auto out = persistent_->CreateFile(staged->StagingFile(staged->FileName(DataFileName(index))));
    if (!out.ok()) {
      st = out.status();
    } else {
      ThreadPool pool(options_.threads ? options_.threads : DefaultManagerThreads());
      PersistWriteOptions wo;
      wo.compression = options_.persist_compression;
      wo.compression_level = options_.persist_compression_level;
      wo.pool = &pool;
      auto written = WritePersistedChunks(local_, part_dir, part.value(), writes, out.value().get(), wo, &stored);
      if (written.ok()) placed = std::move(written).value();
      else st = written.status();
      if (st.ok()) st = out.value()->Sync();
      Status closed = out.value()->Close();
      if (st.ok()) st = closed;
    }
  }
  // Rank 0 merges the parts with where every chunk went, and commits; the ranks learn the outcome.
  const std::string report = EncodeChunkReports(OkStatus(), placed, stored);
  auto answer = CoordinatorRound(comm_, st, report, options_.timeout, [&](std::vector<std::string>& reports) {
    Status result;
    for (int r = 0; r < size && result.ok(); ++r) {
      Status peer;
      std::vector<ChunkChecksums> written;
      result = DecodeChunkReports(reports[r], &peer, &written);
      if (result.ok() && !plan.writes[r].empty()) result = ApplyWrites(written, plan.writes[r], &parts[r], path);
    }
    if (result.ok() && base) {
      for (Part& p : parts) base->Finish(&p.record);
    }
    if (result.ok()) {
      const StagedCheckpoint& sc = *staged;
      auto merged = MergeParts(parts, path, [&](const std::string& name) { return sc.FileName(name); });
      if (!merged.ok()) result = merged.status();
      // The base must still be the one compared with (a prune or a rerun could have replaced it meanwhile).
      if (result.ok() && base) result = base->CheckUnchanged(persistent_);
      if (result.ok()) result = staged->CommitWithMetadata(merged.value());
    }
    if (!result.ok()) (void)staged->Abort();
    return Answer(result, "");
  });
  std::string none;
  Status result = ReadAnswer(answer, me, &none);
  if (!answer.ok() && me == 0) (void)staged->Abort();
  result = result.ok() ? result : result.WithContext("persisting '" + path + "'");
  *outcome = result;
  if (result.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_persisted += stored;
    if (me == 0) stats_.bytes_persist_reused += plan.bytes_reused;
  }
  if (result.ok() && me == 0 && options_.keep_persistent > 0) PrunePersistent(step);
  return OkStatus();
}

// Older persisted steps beyond keep_persistent go, newest first (so a step that only older steps to go refer to can
// go too); a step a kept one refers to stays (RemoveCheckpoint refuses it). Only names this manager writes are touched.
void CheckpointManager::PrunePersistent(uint64_t step) {
  auto names = persistent_->ListDir(options_.persistent_path);
  if (!names.ok()) return;
  std::vector<uint64_t> steps;
  for (const std::string& n : names.value()) {
    uint64_t s;
    if (ParseNumbered(n, "step-", 10, &s) && s <= step) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  const size_t keep = static_cast<size_t>(options_.keep_persistent);
  if (steps.size() <= keep) return;
  for (size_t i = steps.size() - keep; i-- > 0;) {
    (void)RemoveCheckpoint(persistent_, options_.persistent_path + "/" + StepName(steps[i]));
  }
}

}  // namespace distckpt
