#include "core/foreign/hub_cache.h"

#include <utility>
#include <vector>

#include "core/foreign/json.h"

namespace distckpt {

namespace {

// refs/main holds a commit hash (40 hex digits); anything much longer is not a ref.
constexpr uint64_t kMaxRefBytes = 256;

}  // namespace

bool IsHubCacheRevision(const std::string& revision) {
  if (revision.empty() || revision.size() > 255 || revision == "." || revision == "..") return false;
  for (unsigned char c : revision) {
    if (c <= 0x20 || c >= 0x7f || c == '/' || c == '\\') return false;
  }
  return true;
}

Status ResolveHubCache(std::unique_ptr<Directory>* dir, std::string* dir_path, const std::string& path,
                       Storage* storage) {
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<Directory> snapshot, (*dir)->OpenAsHubCacheSnapshot());
  if (snapshot != nullptr) {
    *dir = std::move(snapshot);
    return OkStatus();
  }
  DCKPT_ASSIGN_OR_RETURN(bool has_blobs, (*dir)->Exists("blobs"));
  DCKPT_ASSIGN_OR_RETURN(bool has_snapshots, (*dir)->Exists("snapshots"));
  if (!has_blobs || !has_snapshots) return OkStatus();

  // A repository: read at the snapshot refs/main names.
  const std::string repo = "hub cache repository '" + path + "'";
  const std::string ref_path = *dir_path + "/refs/" + kHubCacheDefaultRef;
  auto refs = (*dir)->OpenSubdirectory("refs");
  auto ref = refs.ok() ? (*refs)->OpenFile(kHubCacheDefaultRef) : Result<std::unique_ptr<ReadableFile>>(refs.status());
  if (!ref.ok()) {
    if (ref.status().code() != StatusCode::kNotFound) return ref.status().WithContext(repo);
    std::string names;
    auto listed = storage->ListDir(*dir_path + "/snapshots");
    if (listed.ok()) {
      for (const std::string& n : *listed) names += (names.empty() ? "" : ", ") + ("'" + n + "'");
    }
    return NotFound(repo + " has no refs/" + kHubCacheDefaultRef + " (it was downloaded at a revision, not a branch)" +
                    ": open one of its snapshots, '" + *dir_path + "/snapshots/<revision>'" +
                    (names.empty() ? std::string(" (it has none)") : "; its revisions: " + names));
  }
  if ((*ref)->size() > kMaxRefBytes) {
    return Corrupt(repo + ": '" + ref_path + "' is " + std::to_string((*ref)->size()) + " bytes, not a revision name");
  }
  std::string revision(static_cast<size_t>((*ref)->size()), '\0');
  DCKPT_RETURN_IF_ERROR((*ref)->ReadAt(0, revision.data(), revision.size()));
  if (!revision.empty() && revision.back() == '\n') revision.pop_back();  // written by hand with echo
  if (!IsHubCacheRevision(revision)) {
    return Corrupt(repo + ": '" + ref_path + "' holds " + JsonQuote(revision.substr(0, 80)) +
                   ", which is not a revision name (a plain name: no '/', not '..'); it must name a directory of " +
                   "snapshots/");
  }
  const std::string snapshot_path = *dir_path + "/snapshots/" + revision;
  auto snapshots = (*dir)->OpenSubdirectory("snapshots");
  auto opened = snapshots.ok() ? (*snapshots)->OpenSubdirectory(revision)
                               : Result<std::unique_ptr<Directory>>(snapshots.status());
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) {
      return NotFound(repo + ": refs/" + kHubCacheDefaultRef + " names revision '" + revision + "', but '" +
                      snapshot_path + "' does not exist (an interrupted download?)");
    }
    return opened.status().WithContext(repo);
  }
  DCKPT_ASSIGN_OR_RETURN(snapshot, (*opened)->OpenAsHubCacheSnapshot());
  if (snapshot == nullptr) {
    return Internal(repo + ": '" + snapshot_path + "' is not below the repository's snapshots directory");
  }
  *dir = std::move(snapshot);
  *dir_path = snapshot_path;
  return OkStatus();
}

}  // namespace distckpt
