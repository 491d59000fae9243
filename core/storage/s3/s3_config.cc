#include "core/storage/s3/s3_config.h"

#include <cstdlib>

#include "core/storage/s3/s3_wire.h"

namespace distckpt {
namespace s3 {
namespace {

std::string FirstSet(const GetEnv& getenv, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = getenv(n);
    if (v != nullptr && *v != '\0') return v;
  }
  return {};
}

// "http://host:port/" -> "http://host:port"; kInvalidArgument for what is not http(s)://host[:port].
Result<std::string> CheckEndpoint(std::string endpoint) {
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const size_t sep = endpoint.find("://");
  const std::string scheme = sep == std::string::npos ? "" : endpoint.substr(0, sep);
  const std::string host = sep == std::string::npos ? "" : endpoint.substr(sep + 3);
  if ((scheme != "http" && scheme != "https") || host.empty() || host.find('/') != std::string::npos ||
      host.find_first_of(" ?#@") != std::string::npos) {
    return InvalidArgument("S3 endpoint '" + endpoint + "' is not http(s)://host[:port]");
  }
  return endpoint;
}

}  // namespace

Result<S3Config> ResolveS3Config(S3Config c, const GetEnv& getenv) {
  if (c.region.empty()) c.region = FirstSet(getenv, {"AWS_REGION", "AWS_DEFAULT_REGION"});
  if (c.region.empty()) c.region = "us-east-1";
  const bool custom = !c.endpoint.empty() || !FirstSet(getenv, {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}).empty();
  if (c.endpoint.empty()) c.endpoint = FirstSet(getenv, {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"});
  if (c.endpoint.empty()) c.endpoint = "https://s3." + c.region + ".amazonaws.com";
  DCKPT_ASSIGN_OR_RETURN(c.endpoint, CheckEndpoint(c.endpoint));
  if (c.access_key_id.empty() && c.secret_access_key.empty()) {
    c.access_key_id = FirstSet(getenv, {"AWS_ACCESS_KEY_ID"});
    c.secret_access_key = FirstSet(getenv, {"AWS_SECRET_ACCESS_KEY"});
    if (c.session_token.empty()) c.session_token = FirstSet(getenv, {"AWS_SESSION_TOKEN"});
  }
  if (c.access_key_id.empty() != c.secret_access_key.empty()) {
    return InvalidArgument(
        std::string("S3 credentials: an access key id without a secret access key, or the "
                    "reverse (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go together)"));
  }
  if (c.addressing == Addressing::kAuto) c.addressing = custom ? Addressing::kPath : Addressing::kVirtual;
  if (c.max_in_flight == 0) c.max_in_flight = kDefaultMaxInFlight;
  if (c.max_attempts == 0) c.max_attempts = kDefaultMaxAttempts;
  if (!(c.request_timeout_seconds > 0)) c.request_timeout_seconds = kDefaultRequestTimeoutSeconds;
  if (c.part_size == 0) c.part_size = kDefaultPartSize;
  if (c.part_size < kMinPartSize) {
    return InvalidArgument("S3 part size " + std::to_string(c.part_size) + " is below S3's minimum of 5 MiB");
  }
  if (c.read_block_size == 0) c.read_block_size = kDefaultReadBlockSize;
  return c;
}

Result<S3Config> ResolveS3Config(S3Config given) {
  return ResolveS3Config(std::move(given), [](const char* name) { return std::getenv(name); });
}

std::string ObjectUrl(const S3Config& config, const std::string& bucket, const std::string& key) {
  const std::string path = "/" + UriEncode(key, /*keep_slash=*/true);
  // A bucket name with dots breaks the TLS certificate of a virtual host: path style then.
  if (config.addressing == Addressing::kVirtual && bucket.find('.') == std::string::npos) {
    const size_t sep = config.endpoint.find("://") + 3;
    return config.endpoint.substr(0, sep) + bucket + "." + config.endpoint.substr(sep) + path;
  }
  return config.endpoint + "/" + UriEncode(bucket, false) + path;
}

}  // namespace s3
}  // namespace distckpt
