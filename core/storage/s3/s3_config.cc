#include "core/storage/s3/s3_config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>

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

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return {};
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

// The keys of section `section` of the INI file at `path` (lower-case names); empty when the file or the section is
// missing. Comments (# ;) and indented sub-keys (a service's nested settings) are skipped.
std::map<std::string, std::string> IniSection(const std::string& path, const std::string& section, bool* found) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!line.empty() && (line[0] == ' ' || line[0] == '\t')) continue;
    const std::string t = Trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      inside = Trim(t.substr(1, t.size() - 2)) == section;
      if (inside) *found = true;
      continue;
    }
    const size_t eq = t.find('=');
    if (!inside || eq == std::string::npos) continue;
    std::string key = Trim(t.substr(0, eq));
    std::transform(key.begin(), key.end(), key.begin(), [](unsigned char ch) { return std::tolower(ch); });
    out[key] = Trim(t.substr(eq + 1));
  }
  return out;
}

// The profile's settings as the AWS CLI finds them: the shared credentials file's [name] over the config file's
// [name] ([default], or [profile name] for another). kInvalidArgument for a profile named by AWS_PROFILE that
// neither file has.
Result<std::map<std::string, std::string>> Profile(const GetEnv& getenv) {
  std::string name = FirstSet(getenv, {"AWS_PROFILE", "AWS_DEFAULT_PROFILE"});
  const bool named = !name.empty();
  if (!named) name = "default";
  const std::string home = FirstSet(getenv, {"HOME"});
  std::string credentials = FirstSet(getenv, {"AWS_SHARED_CREDENTIALS_FILE"});
  std::string config = FirstSet(getenv, {"AWS_CONFIG_FILE"});
  if (credentials.empty() && !home.empty()) credentials = home + "/.aws/credentials";
  if (config.empty() && !home.empty()) config = home + "/.aws/config";
  bool found = false;
  std::map<std::string, std::string> settings;
  if (!config.empty()) settings = IniSection(config, name == "default" ? name : "profile " + name, &found);
  if (!credentials.empty()) {
    for (auto& [k, v] : IniSection(credentials, name, &found)) settings[k] = v;
  }
  if (named && !found) {
    return InvalidArgument("AWS profile '" + name + "' (AWS_PROFILE) is in neither " + credentials + " nor " + config);
  }
  return settings;
}

std::string Setting(const std::map<std::string, std::string>& profile, const char* key) {
  auto it = profile.find(key);
  return it == profile.end() ? std::string() : it->second;
}

}  // namespace

Result<S3Config> ResolveS3Config(S3Config c, const GetEnv& getenv) {
  DCKPT_ASSIGN_OR_RETURN(const auto profile, Profile(getenv));
  if (c.region.empty()) c.region = FirstSet(getenv, {"AWS_REGION", "AWS_DEFAULT_REGION"});
  if (c.region.empty()) c.region = Setting(profile, "region");
  if (c.region.empty()) c.region = "us-east-1";
  if (c.endpoint.empty()) c.endpoint = FirstSet(getenv, {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"});
  if (c.endpoint.empty()) c.endpoint = Setting(profile, "endpoint_url");
  const bool custom = !c.endpoint.empty();
  if (c.endpoint.empty()) c.endpoint = "https://s3." + c.region + ".amazonaws.com";
  DCKPT_ASSIGN_OR_RETURN(c.endpoint, CheckEndpoint(c.endpoint));
  if (c.access_key_id.empty() && c.secret_access_key.empty()) {
    c.access_key_id = FirstSet(getenv, {"AWS_ACCESS_KEY_ID"});
    c.secret_access_key = FirstSet(getenv, {"AWS_SECRET_ACCESS_KEY"});
    if (c.session_token.empty()) c.session_token = FirstSet(getenv, {"AWS_SESSION_TOKEN"});
  }
  if (c.access_key_id.empty() && c.secret_access_key.empty()) {
    c.access_key_id = Setting(profile, "aws_access_key_id");
    c.secret_access_key = Setting(profile, "aws_secret_access_key");
    if (c.session_token.empty()) c.session_token = Setting(profile, "aws_session_token");
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
