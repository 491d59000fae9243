#include "core/storage/url/url_storage.h"

#include <cctype>

#include "core/storage/s3/s3_storage.h"

namespace distckpt {

std::string UrlScheme(const std::string& path) {
  const size_t sep = path.find("://");
  if (sep == std::string::npos || sep == 0 || !std::isalpha(static_cast<unsigned char>(path[0]))) return {};
  for (size_t i = 0; i < sep; ++i) {
    const char c = path[i];
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') return {};
  }
  return path.substr(0, sep);
}

Result<std::shared_ptr<Storage>> StorageForUrl(const std::string& path) {
  const std::string scheme = UrlScheme(path);
  if (scheme.empty()) return std::shared_ptr<Storage>();
  if (scheme == "s3") {
    Result<std::unique_ptr<Storage>> s = NewS3Storage(s3::S3Config{});
    if (!s.ok()) return s.status().WithContext(path);
    return std::shared_ptr<Storage>(std::move(s).value());
  }
  return Unsupported(path + ": distckpt has no storage for '" + scheme +
                     "://' URLs (it serves s3:// and local paths; a local file:// URL is its plain path); other "
                     "storage plugs in through dckpt_storage_new_callbacks (Python: distckpt.FsspecStorage over any "
                     "fsspec file system; Rust: the Storage trait; Go: distckpt.NewStorage)");
}

}  // namespace distckpt
