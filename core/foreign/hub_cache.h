// The Hugging Face hub cache (what huggingface_hub downloads into, ~/.cache/huggingface/hub), read in place. A
// repository `models--org--name/` holds `blobs/<hash>` (the files' bytes), `refs/<ref>` (a file holding a revision)
// and `snapshots/<revision>/`, whose files are relative symbolic links into `blobs/`. A reader that opens a directory
// without metadata.dckpt asks this package whether it is a snapshot (then its links into blobs/ are followed, and only
// those: Directory::OpenAsHubCacheSnapshot) or a repository (then refs/main's snapshot is read).
#ifndef DISTCKPT_CORE_FOREIGN_HUB_CACHE_H_
#define DISTCKPT_CORE_FOREIGN_HUB_CACHE_H_

#include <memory>
#include <string>

#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {

/// The ref a repository is read at when it is opened itself.
constexpr char kHubCacheDefaultRef[] = "main";

/// Whether `revision` (the text of a refs/ file) is a revision name a snapshot directory can have: a plain name of
/// at most 255 printable ASCII characters, no '/' or '\\', not "." or "..".
bool IsHubCacheRevision(const std::string& revision);

/// Where a checkpoint directory `*dir` (at `*dir_path`), which holds no metadata.dckpt, is read when it is in a hub
/// cache: a snapshot (or a directory below one) becomes the Directory that follows its links into the repository's
/// blobs/; a repository (it holds blobs/ and snapshots/) becomes its snapshot that refs/main names, and `*dir_path`
/// that snapshot's path. Anything else is left as it is. Errors name `path` (the checkpoint as the caller gave it)
/// and the file at fault: kCorrupt for a refs/main that does not hold a revision name, kNotFound for a repository
/// without refs/main (listing its snapshots) or whose snapshot is missing.
Status ResolveHubCache(std::unique_ptr<Directory>* dir, std::string* dir_path, const std::string& path,
                       Storage* storage);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_HUB_CACHE_H_
