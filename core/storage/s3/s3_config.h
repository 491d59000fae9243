// Where and how the S3 client reaches S3: what the caller gave, completed from the environment the AWS CLI reads.
#ifndef DISTCKPT_CORE_STORAGE_S3_S3_CONFIG_H_
#define DISTCKPT_CORE_STORAGE_S3_S3_CONFIG_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "core/base/status.h"

namespace distckpt {
namespace s3 {

enum class Addressing {
  kAuto,     ///< path style with a custom endpoint, virtual-hosted on AWS (path style for bucket names with dots)
  kPath,     ///< <endpoint>/<bucket>/<key>
  kVirtual,  ///< <scheme>://<bucket>.<host>/<key>
};

/// Empty strings and zeros mean "not given": ResolveS3Config fills them.
struct S3Config {
  std::string endpoint;  ///< "http://127.0.0.1:9000", "https://s3.eu-west-1.amazonaws.com" (no trailing '/')
  std::string region;
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  Addressing addressing = Addressing::kAuto;
  unsigned max_in_flight = 0;
  unsigned max_attempts = 0;
  double request_timeout_seconds = 0;
  uint64_t part_size = 0;
  uint64_t read_block_size = 0;
  /// Retries wait a random time up to min(backoff_cap, backoff_base * 2^retry) (exponential backoff, full jitter).
  std::chrono::milliseconds backoff_base{100};
  std::chrono::milliseconds backoff_cap{5000};
};

constexpr unsigned kDefaultMaxInFlight = 16;
constexpr unsigned kDefaultMaxAttempts = 6;
constexpr double kDefaultRequestTimeoutSeconds = 30;
constexpr uint64_t kDefaultPartSize = uint64_t{8} << 20;
constexpr uint64_t kMinPartSize = uint64_t{5} << 20;  // S3's smallest part but the last
constexpr uint64_t kDefaultReadBlockSize = uint64_t{4} << 20;

/// Reads an environment variable (nullptr: unset). Tests pass their own.
using GetEnv = std::function<const char*(const char*)>;

/// `given` with every field not given taken as the AWS CLI takes it: the environment (AWS_ENDPOINT_URL_S3,
/// AWS_ENDPOINT_URL, AWS_REGION, AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), then
/// the profile (AWS_PROFILE, else "default") of the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else
/// ~/.aws/credentials: aws_access_key_id, aws_secret_access_key, aws_session_token) and of the config file
/// (AWS_CONFIG_FILE, else ~/.aws/config: region, endpoint_url, and credentials too), then the defaults; and the
/// addressing decided. A profile named by AWS_PROFILE that neither file has is kInvalidArgument. kInvalidArgument for
/// an endpoint that is not http(s)://host[:port], a key id without a secret (or the reverse), or a part size below 5
/// MiB.
Result<S3Config> ResolveS3Config(S3Config given, const GetEnv& getenv);
/// The process environment.
Result<S3Config> ResolveS3Config(S3Config given);

/// The URL of `key` in `bucket` ("" key: the bucket itself), without a query.
std::string ObjectUrl(const S3Config& config, const std::string& bucket, const std::string& key);

}  // namespace s3
}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_S3_S3_CONFIG_H_
