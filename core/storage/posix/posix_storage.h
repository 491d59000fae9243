// The POSIX filesystem backend. Users get it through storage.h (NewPosixStorage, DefaultStorage); this header only
// exposes internals that the backend's own tests reach into.
#ifndef DISTCKPT_CORE_STORAGE_POSIX_POSIX_STORAGE_H_
#define DISTCKPT_CORE_STORAGE_POSIX_POSIX_STORAGE_H_

#include <string>

#include "core/base/status.h"

namespace distckpt {
namespace internal_storage {

/// The no-replace rename used where renameat2(RENAME_NOREPLACE) is unavailable (kernels before 3.15, filesystems
/// that reject the flag). Files: link + unlink, atomic. Directories: check, then rename; racy, see the definition.
Status PosixRenameNoReplaceFallback(const std::string& from, const std::string& to);

}  // namespace internal_storage
}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_POSIX_POSIX_STORAGE_H_
