// The storage a URL names, for callers that pass a path and no storage: "s3://bucket/prefix" is S3 configured from
// the environment, a plain path the POSIX file system, any other scheme an error naming it and what would serve it.
#ifndef DISTCKPT_CORE_STORAGE_URL_URL_STORAGE_H_
#define DISTCKPT_CORE_STORAGE_URL_URL_STORAGE_H_

#include <memory>
#include <string>

#include "core/base/status.h"
#include "core/storage/storage.h"

namespace distckpt {

/// The scheme of a URL ("s3" for "s3://b/k"); "" for a plain path. A scheme is letters, digits, '+', '-' and '.',
/// starting with a letter, followed by "://".
std::string UrlScheme(const std::string& path);

/// The storage for `path`: nullptr for a plain path (the caller's default, the POSIX file system), a new S3 storage
/// for "s3://" (the environment's configuration: s3::ResolveS3Config), kUnsupported naming the scheme for any other.
Result<std::shared_ptr<Storage>> StorageForUrl(const std::string& path);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_URL_URL_STORAGE_H_
