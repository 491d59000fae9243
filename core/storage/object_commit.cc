// The metadata-last commit protocol (CommitProtocol::kMetadataLast, FORMAT.md section 6.2): for storage without an
// atomic rename (object stores), any backend can run it. Every file of a save carries the save's nonce in its name,
// the metadata is written last and its appearance is the commit; nothing is ever renamed.
#include <string>
#include <vector>

#include "core/storage/backend_util.h"
#include "core/storage/storage.h"

namespace distckpt {
namespace {

constexpr char kMetadataName[] = "metadata.dckpt";

// The names directly below `dir`; none when nothing is there.
Result<std::vector<std::string>> NamesBelow(Storage* storage, const std::string& dir) {
  auto names = storage->ListDir(dir);
  if (!names.ok() && names.status().code() == StatusCode::kNotFound) return std::vector<std::string>{};
  return names;
}

}  // namespace

Result<StagedCheckpoint> StagedCheckpoint::CreateMetadataLast(Storage* storage, const std::string& final_path,
                                                              const std::string& nonce, bool overwrite) {
  const std::string context = "starting a save to checkpoint '" + final_path + "'";
  if (storage->commit_protocol() == CommitProtocol::kRename) {
    // A file system running this protocol: the checkpoint is a directory, made here (its parents too, if missing).
    const std::string parent = internal_storage::ParentDir(final_path);
    DCKPT_RETURN_IF_ERROR(
        CreateDirectories(storage, parent)
            .WithContext("creating the parent directory '" + parent + "' of checkpoint '" + final_path + "'"));
    Status made = storage->CreateDir(final_path);
    if (!made.ok() && made.code() != StatusCode::kExists) return made.WithContext(context);
  }
  auto names = NamesBelow(storage, final_path);
  if (!names.ok()) return names.status().WithContext(context);
  for (const std::string& name : *names) {
    if (name == kMetadataName) {
      if (!overwrite) {
        return Status(StatusCode::kExists,
                      "checkpoint '" + final_path + "' already exists; pass overwrite or choose another path");
      }
      continue;
    }
    // Markers and data files of other saves (running, abandoned or superseded) are distckpt's own; anything else
    // means the path is not (only) a checkpoint, and is never written over.
    if (ParseObjectMarkerName(name, nullptr) || ParseNoncedFileName(name, nullptr)) continue;
    return Status(StatusCode::kExists, "'" + final_path + "' holds '" + name +
                                           "', which is not part of a distckpt checkpoint; only a checkpoint or an "
                                           "empty path is written over (nothing was written)");
  }
  // The marker goes first: every data file of this save exists only while its marker does, until the commit.
  const std::string marker = final_path + "/" + ObjectMarkerName(nonce);
  DCKPT_RETURN_IF_ERROR(storage->WriteFileDurably(marker, StagingMarkerText(final_path)).WithContext(context));
  return StagedCheckpoint(storage, final_path, final_path, overwrite, nonce, "", CommitProtocol::kMetadataLast);
}

Status StagedCheckpoint::CommitMetadataLast(const std::string& metadata) {
  const std::string context = "committing checkpoint '" + final_path_ + "'";
  // Data files are durable (every rank synced its own); make their names durable before the metadata names them.
  DCKPT_RETURN_IF_ERROR(storage_->SyncDir(final_path_).WithContext(context));
  Status published = storage_->Publish(final_path_ + "/" + kMetadataName, metadata, overwrite_);
  if (published.code() == StatusCode::kExists) {
    return Status(StatusCode::kExists, context + ": another save committed a checkpoint at '" + final_path_ +
                                           "' while this save was running; this save committed nothing");
  }
  DCKPT_RETURN_IF_ERROR(published.WithContext(context));
  DCKPT_RETURN_IF_ERROR(storage_->SyncDir(final_path_).WithContext(context));
  // Committed. What follows is cleanup: a failure leaves garbage that prune recognises, never a wrong checkpoint.
  (void)storage_->RemoveAll(final_path_ + "/" + ObjectMarkerName(nonce_));
  auto names = NamesBelow(storage_, final_path_);
  if (!names.ok()) return OkStatus();
  for (const std::string& name : *names) {
    std::string nonce;
    if (!ParseNoncedFileName(name, &nonce) || nonce == nonce_) continue;
    // Files of the replaced checkpoint, or of a save that died after its commit. A save still running has its marker
    // (written before any of its files): asked again right before the removal, so a listing that raced with that
    // save's start cannot remove its files.
    auto live = storage_->Exists(final_path_ + "/" + ObjectMarkerName(nonce));
    if (!live.ok() || *live) continue;
    (void)storage_->RemoveAll(final_path_ + "/" + name);
  }
  return OkStatus();
}

Status StagedCheckpoint::AbortMetadataLast() {
  const std::string context = "aborting the save to checkpoint '" + final_path_ + "'";
  auto names = NamesBelow(storage_, final_path_);
  if (!names.ok()) return names.status().WithContext(context);
  Status first;
  for (const std::string& name : *names) {
    std::string nonce;
    if (!ParseNoncedFileName(name, &nonce) || nonce != nonce_) continue;
    Status st = storage_->RemoveAll(final_path_ + "/" + name);
    if (first.ok() && !st.ok()) first = st.WithContext(context);
  }
  // The marker last: until it is gone, what is left is recognisably this save's.
  Status st = storage_->RemoveAll(final_path_ + "/" + ObjectMarkerName(nonce_));
  if (first.ok() && !st.ok()) first = st.WithContext(context);
  return first;
}

}  // namespace distckpt
