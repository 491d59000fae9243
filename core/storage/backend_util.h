// Helpers shared by the storage backends so that they word paths and errors identically. Not for use outside
// core/storage: the public interface is storage.h.
#ifndef DISTCKPT_CORE_STORAGE_BACKEND_UTIL_H_
#define DISTCKPT_CORE_STORAGE_BACKEND_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace distckpt {

std::string ParentDir(const std::string& path);  // declared with its contract in storage.h

namespace internal_storage {

/// "'<path>'", as every backend quotes paths in its messages.
std::string Quoted(const std::string& path);
/// The components of `path` after lexical normalisation: empty components and "." dropped, ".." removes the one
/// before it (and stops at the root). "//a/./b/../c/" -> {"a", "c"}.
std::vector<std::string> LexicalComponents(const std::string& path);

/// "a/b//" -> "a/b"; "/" stays "/".
std::string StripTrailingSlashes(const std::string& path);
using ::distckpt::ParentDir;

/// kCorrupt "data file '<path>' is truncated: wanted N bytes at offset O, file has S bytes".
Status TruncatedFileError(const std::string& path, uint64_t offset, size_t size, uint64_t file_size);
/// kState for a call on a WritableFile after Close().
Status ClosedFileError(const std::string& path, const char* operation);
/// kInvalidArgument unless [offset, offset + size) fits in a signed 64-bit file offset.
Status CheckRange(const std::string& path, uint64_t offset, size_t size);

}  // namespace internal_storage
}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_BACKEND_UTIL_H_
