#include "core/storage/url/url_storage.h"

#include <unistd.h>

#include <cctype>
#include <mutex>

#include "core/storage/s3/s3_storage.h"

namespace distckpt {
namespace {

// S3 storage configured from the environment, shared by the calls made while the environment says the same thing, so
// that they share libcurl's connections (a tool that stats a hundred checkpoints opens one connection pool, not a
// hundred). The last one stays alive between calls.
Result<std::shared_ptr<Storage>> EnvironmentS3Storage() {
  DCKPT_ASSIGN_OR_RETURN(s3::S3Config config, s3::ResolveS3Config(s3::S3Config{}));
  const std::string key = config.endpoint + '\n' + config.region + '\n' + config.access_key_id + '\n' +
                          config.secret_access_key + '\n' + config.session_token + '\n' +
                          std::to_string(static_cast<int>(config.addressing)) + '\n' +
                          std::to_string(::getpid());  // a forked child makes its own (the parent's may be mid-call)
  static std::mutex mu;
  static std::string* last_key = new std::string();
  static std::shared_ptr<Storage>* last = new std::shared_ptr<Storage>();
  std::lock_guard<std::mutex> lock(mu);
  if (*last != nullptr && *last_key == key) return *last;
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<Storage> made, NewS3Storage(config));
  *last = std::shared_ptr<Storage>(std::move(made));
  *last_key = key;
  return *last;
}

}  // namespace

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
    Result<std::shared_ptr<Storage>> s = EnvironmentS3Storage();
    if (!s.ok()) return s.status().WithContext(path);
    return s;
  }
  return Unsupported(path + ": distckpt has no storage for '" + scheme +
                     "://' URLs (it serves s3:// and local paths; a local file:// URL is its plain path); other "
                     "storage plugs in through dckpt_storage_new_callbacks (Python: distckpt.FsspecStorage over any "
                     "fsspec file system; Rust: the Storage trait; Go: distckpt.NewStorage)");
}

}  // namespace distckpt
