// The S3 ObjectClient: requests, retries, and what S3's answers mean (s3_storage.h describes the protocol).
#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "core/storage/s3/http_client.h"
#include "core/storage/s3/s3_storage.h"
#include "core/storage/s3/s3_wire.h"

namespace distckpt {
namespace s3 {
namespace {

// A listing of more pages than this (of up to 1000 names each) is refused: a server looping through tokens.
constexpr size_t kMaxListPages = 100000;

// Error codes S3 answers when the request may succeed if sent again.
bool RetryableCode(const std::string& code) {
  static const char* const kCodes[] = {
      "SlowDown",           "Throttling",           "ThrottlingException",        "RequestTimeout",  "InternalError",
      "ServiceUnavailable", "RequestLimitExceeded", "ConditionalRequestConflict", "OperationAborted"};
  return std::any_of(std::begin(kCodes), std::end(kCodes), [&](const char* c) { return code == c; });
}

bool RetryableStatus(long status) {  // NOLINT(runtime/int)
  return status == 500 || status == 502 || status == 503 || status == 504 || status == 408 || status == 429;
}

bool IsCredentialCode(const std::string& code) {
  return code == "AccessDenied" || code == "SignatureDoesNotMatch" || code == "InvalidAccessKeyId" ||
         code == "InvalidToken" || code == "ExpiredToken" || code == "TokenRefreshRequired";
}

// What Send tells beyond the answer: the tries made, and S3's error code when it failed with one.
struct SendInfo {
  unsigned attempts = 0;
  std::string code;
};

// One request as messages name it: "PUT s3://bucket/key".
struct Call {
  std::string verb;  // "GET", "PUT part 3 of", ...
  std::string url;   // s3://bucket/key
  std::string Name() const { return "S3 " + verb + " " + url; }
};

class S3Client;

// A file of at most one part: gathered in memory, sent as one PUT on close.
class SingleUpload final : public ObjectUpload {
 public:
  SingleUpload(S3Client* client, std::string object_url, std::string url)
      : client_(client), object_url_(std::move(object_url)), url_(std::move(url)) {}
  Status Write(uint64_t offset, const void* data, size_t size) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (data_.size() < offset + size) data_.resize(offset + size);
    std::copy_n(static_cast<const char*>(data), size, &data_[offset]);
    return OkStatus();
  }
  Status Sync() override { return OkStatus(); }
  Status Close(uint64_t size, bool discard) override;

 private:
  S3Client* const client_;
  const std::string object_url_;  // the request URL
  const std::string url_;         // s3://bucket/key, for messages
  std::mutex mu_;
  std::string data_;
};

class PartUpload final : public ObjectPartUpload {
 public:
  PartUpload(S3Client* client, const std::string& object_url, std::string url, const std::string& upload_id)
      : client_(client),
        object_url_(object_url),
        url_(std::move(url)),
        upload_query_("uploadId=" + UriEncode(upload_id, false)) {}
  Status UploadPart(unsigned number, const void* data, size_t size) override;
  Status Complete() override;
  Status Abort() override;

 private:
  S3Client* const client_;
  const std::string object_url_;    // the request URL
  const std::string url_;           // s3://bucket/key, for messages
  const std::string upload_query_;  // "uploadId=<encoded id>"
  std::mutex mu_;
  std::vector<std::string> etags_;
  uint64_t bytes_ = 0;
};

class S3Client final : public ObjectClient {
 public:
  S3Client(S3Config config, std::unique_ptr<HttpClient> http) : config_(std::move(config)), http_(std::move(http)) {}

  std::string name() const override { return "s3"; }
  bool has_parts() const override { return true; }
  uint64_t min_part_size() const override { return config_.part_size; }

  Result<std::unique_ptr<ObjectUpload>> Create(const std::string& path, uint64_t size_hint) override {
    DCKPT_ASSIGN_OR_RETURN(std::string url, UrlOf(path));
    return std::unique_ptr<ObjectUpload>(new SingleUpload(this, std::move(url), path));
  }

  Result<uint64_t> Size(const std::string& path) override {
    DCKPT_ASSIGN_OR_RETURN(std::string url, UrlOf(path));
    HttpRequest req{"HEAD", url, {}};
    DCKPT_ASSIGN_OR_RETURN(HttpResponse r, Send(&req, Call{"HEAD", path}));
    const std::string length = r.Header("content-length");
    char* end = nullptr;
    const unsigned long long n = std::strtoull(length.c_str(), &end, 10);  // NOLINT(runtime/int)
    if (length.empty() || *end != '\0') {
      return Corrupt(Call{"HEAD", path}.Name() + ": the answer has no Content-Length ('" + length + "')");
    }
    return static_cast<uint64_t>(n);
  }

  Result<size_t> Read(const std::string& path, uint64_t offset, void* data, size_t size) override {
    return ReadArriving(path, offset, data, size, [](size_t) {});
  }

  Result<size_t> ReadArriving(const std::string& path, uint64_t offset, void* data, size_t size,
                              const std::function<void(size_t)>& arrived) override {
    DCKPT_ASSIGN_OR_RETURN(const std::string url, UrlOf(path));
    size_t got = 0;
    for (unsigned attempt = 1;; ++attempt) {
      if (got == size) return got;
      const uint64_t at = offset + got;
      const std::string range = std::to_string(at) + "-" + std::to_string(at + (size - got) - 1);
      const Call call{"GET", path + " (bytes " + range + ")"};
      HttpRequest req{"GET", url, {"Range: bytes=" + range}};
      req.sink = static_cast<char*>(data) + got;
      req.sink_size = size - got;
      req.skip_on_200 = at;
      const std::function<void(size_t)> sunk = [&](size_t n) { arrived(got + n); };
      req.on_sunk = &sunk;
      TransportError err;
      Result<HttpResponse> r = http_->Perform(req, &err);
      if (!r.ok()) {
        got += err.sunk;  // a read cut short resumes after what arrived
        if (!err.retryable || attempt >= config_.max_attempts) return Failed(call, err.status, attempt);
        Backoff(attempt);
        continue;
      }
      if (r->status == 206) {
        // The bytes must be the ones asked for: "Content-Range: bytes <at>-<end>/<size>".
        const std::string range_header = r->Header("content-range");
        const std::string expect = "bytes " + std::to_string(at) + "-";
        if (range_header.compare(0, expect.size(), expect) != 0) {
          return Corrupt(call.Name() + ": the server answered with Content-Range '" + range_header + "'");
        }
      }
      if (r->status == 206 || r->status == 200) return got + r->sunk;  // fewer than asked: the end of the object
      if (r->status == 416) return got;                                // at or past the end
      if (!Retryable(*r) || attempt >= config_.max_attempts) return HttpError(call, *r, attempt);
      Backoff(attempt);
    }
  }

  Result<std::vector<std::string>> List(const std::string& dir) override {
    DCKPT_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(dir));
    const std::string prefix = loc.key.empty() ? "" : loc.key + "/";
    std::vector<std::string> names;
    std::string token;
    size_t pages = 0;
    do {
      if (++pages > kMaxListPages) {
        return Corrupt(Call{"LIST", dir}.Name() + ": more than " + std::to_string(kMaxListPages) +
                       " pages (the server keeps answering with continuation tokens)");
      }
      // Query parameters in the order Signature Version 4 signs them (sorted by name), values encoded.
      std::string query = token.empty() ? "" : "continuation-token=" + UriEncode(token, false) + "&";
      query += "delimiter=%2F&list-type=2&prefix=" + UriEncode(prefix, false);
      HttpRequest req{"GET", ObjectUrl(config_, loc.bucket, "") + "?" + query, {}};
      DCKPT_ASSIGN_OR_RETURN(HttpResponse r, Send(&req, Call{"LIST", dir}));
      ListPage page = ParseListPage(r.body);
      for (const std::string& key : page.keys) {
        if (key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0) {
          names.push_back(key.substr(prefix.size()));
        }
      }
      for (const std::string& p : page.prefixes) {
        if (p.size() > prefix.size() + 1 && p.compare(0, prefix.size(), prefix) == 0 && p.back() == '/') {
          names.push_back(p.substr(prefix.size(), p.size() - prefix.size() - 1));
        }
      }
      if (!page.next_token.empty() && page.next_token == token) {
        return Corrupt(Call{"LIST", dir}.Name() + ": the server repeats the continuation token");
      }
      token = page.next_token;
    } while (!token.empty());
    return names;
  }

  Status Remove(const std::string& path) override {
    DCKPT_ASSIGN_OR_RETURN(std::string url, UrlOf(path));
    HttpRequest req{"DELETE", url, {}};
    SendInfo info;
    Result<HttpResponse> r = Send(&req, Call{"DELETE", path}, &info);
    if (!r.ok() && r.status().code() == StatusCode::kNotFound && info.code != "NoSuchBucket") return OkStatus();
    return r.status();
  }

  Status Commit(const std::string& path, const std::string& data, bool replace) override {
    DCKPT_ASSIGN_OR_RETURN(std::string url, UrlOf(path));
    const Call call{replace ? "PUT" : "PUT (If-None-Match: *)", path};
    HttpRequest req{"PUT", url, {}};
    if (!replace) req.headers.push_back("If-None-Match: *");
    req.body = data.data();
    req.body_size = data.size();
    SendInfo info;
    Result<HttpResponse> r = Send(&req, call, &info);
    if (r.ok() || replace || r.status().code() != StatusCode::kExists || info.attempts == 1) return r.status();
    // 412 after a try whose answer was lost: if that try landed, the object holds exactly these bytes.
    DCKPT_ASSIGN_OR_RETURN(uint64_t size, Size(path));
    if (size == data.size()) {
      std::string now(data.size(), '\0');
      DCKPT_ASSIGN_OR_RETURN(size_t got, Read(path, 0, &now[0], now.size()));
      if (got == now.size() && now == data) return OkStatus();
    }
    return r.status();
  }

  Result<std::unique_ptr<ObjectPartUpload>> BeginParts(const std::string& path, uint64_t size_hint) override {
    DCKPT_ASSIGN_OR_RETURN(std::string url, UrlOf(path));
    HttpRequest req{"POST", url + "?uploads=", {}};
    const Call call{"CreateMultipartUpload", path};
    DCKPT_ASSIGN_OR_RETURN(HttpResponse r, Send(&req, call));
    std::string id = XmlElement(r.body, "UploadId");
    if (id.empty()) return Corrupt(call.Name() + ": the answer has no UploadId");
    return std::unique_ptr<ObjectPartUpload>(new PartUpload(this, url, path, id));
  }

  /// Sends `req` until it gets an answer that is no reason to retry, or max_attempts tries; a non-2xx answer is an
  /// error. *info (optional): the tries made and S3's error code.
  Result<HttpResponse> Send(HttpRequest* req, const Call& call, SendInfo* info = nullptr) {
    SendInfo ignored;
    SendInfo& out = info != nullptr ? *info : ignored;
    for (unsigned attempt = 1;; ++attempt) {
      out.attempts = attempt;
      TransportError err;
      Result<HttpResponse> r = http_->Perform(*req, &err);
      if (!r.ok()) {
        if (!err.retryable || attempt >= config_.max_attempts) return Failed(call, err.status, attempt);
      } else if (r->status >= 200 && r->status < 300 && ParseErrorBody(r->body).code.empty()) {
        return r;  // (CompleteMultipartUpload can answer 200 with an error document: not a success)
      } else if (!Retryable(*r) || attempt >= config_.max_attempts) {
        out.code = ParseErrorBody(r->body).code;
        return HttpError(call, *r, attempt);
      }
      Backoff(attempt);
    }
  }

 private:
  // The request URL of the object at `path` (s3://bucket/key).
  Result<std::string> UrlOf(const std::string& path) const {
    DCKPT_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(path));
    return ObjectUrl(config_, loc.bucket, loc.key);
  }

  static bool Retryable(const HttpResponse& r) {
    return RetryableStatus(r.status) || RetryableCode(ParseErrorBody(r.body).code);
  }

  void Backoff(unsigned attempt) const {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    const unsigned shift = std::min(attempt - 1, 20u);
    const auto cap = std::min<int64_t>(config_.backoff_cap.count(), config_.backoff_base.count() << shift);
    std::uniform_int_distribution<int64_t> wait(0, std::max<int64_t>(cap, 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(wait(rng)));
  }

  std::string Tries(unsigned attempts) const {
    return attempts > 1 ? " (after " + std::to_string(attempts) + " attempts)" : "";
  }

  Status Failed(const Call& call, const Status& transport, unsigned attempts) const {
    return Status(transport.code(),
                  call.Name() + " at " + config_.endpoint + ": " + transport.message() + Tries(attempts));
  }

  Status HttpError(const Call& call, const HttpResponse& r, unsigned attempts) const {
    const S3ErrorBody e = ParseErrorBody(r.body);
    StatusCode code = StatusCode::kIo;
    if (r.status == 404) code = StatusCode::kNotFound;
    if (r.status == 412) code = StatusCode::kExists;
    std::string msg = call.Name() + ": HTTP " + std::to_string(r.status);
    if (!e.code.empty()) msg += " " + e.code;
    if (!e.message.empty()) msg += ": " + e.message;
    if (e.code == "NoSuchBucket") {
      Result<S3Location> loc = ParseS3Url(call.url);
      if (loc.ok()) msg += " (bucket '" + loc->bucket + "' does not exist at " + config_.endpoint + ")";
    }
    if (IsCredentialCode(e.code) || r.status == 403) {
      msg += std::string(" (credentials: ") +
             (config_.access_key_id.empty() ? "none, requests unsigned; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                                            : "access key id " + config_.access_key_id +
                                                  " from the options or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY") +
             ")";
    }
    if (!e.request_id.empty()) msg += " [request id " + e.request_id + "]";
    return Status(code, msg + Tries(attempts));
  }

  const S3Config config_;
  const std::unique_ptr<HttpClient> http_;
};

Status SingleUpload::Close(uint64_t size, bool discard) {
  if (discard) return OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  data_.resize(size);
  HttpRequest req{"PUT", object_url_, {}};
  req.body = data_.data();
  req.body_size = data_.size();
  Status st = client_->Send(&req, Call{"PUT", url_}).status();
  std::string().swap(data_);
  return st;
}

Status PartUpload::UploadPart(unsigned number, const void* data, size_t size) {
  if (number == 0) return InvalidArgument("S3 part numbers start at 1");
  HttpRequest req{"PUT", object_url_ + "?partNumber=" + std::to_string(number) + "&" + upload_query_, {}};
  req.body = data;
  req.body_size = size;
  DCKPT_ASSIGN_OR_RETURN(HttpResponse r,
                         client_->Send(&req, Call{"UploadPart " + std::to_string(number) + " of", url_}));
  std::string etag = r.Header("etag");
  if (etag.empty())
    return Corrupt("S3 UploadPart " + std::to_string(number) + " of " + url_ + ": no ETag in the answer");
  std::lock_guard<std::mutex> lock(mu_);
  if (etags_.size() < number) etags_.resize(number);
  etags_[number - 1] = std::move(etag);
  bytes_ += size;
  return OkStatus();
}

Status PartUpload::Complete() {
  std::string body;
  uint64_t bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < etags_.size(); ++i) {
      if (etags_[i].empty())
        return Internal("S3 CompleteMultipartUpload of " + url_ + ": part " + std::to_string(i + 1) +
                        " was never sent");
    }
    body = CompleteMultipartBody(etags_);
    bytes = bytes_;
  }
  HttpRequest req{"POST", object_url_ + "?" + upload_query_, {"Content-Type: application/xml"}};
  req.body = body.data();
  req.body_size = body.size();
  SendInfo info;
  Result<HttpResponse> r = client_->Send(&req, Call{"CompleteMultipartUpload", url_}, &info);
  if (r.ok() || info.attempts == 1 || info.code != "NoSuchUpload") return r.status();
  // NoSuchUpload after a try whose answer was lost: that try completed it if the object has the parts' size.
  Result<uint64_t> size = client_->Size(url_);
  if (size.ok() && *size == bytes) return OkStatus();
  return r.status();
}

Status PartUpload::Abort() {
  HttpRequest req{"DELETE", object_url_ + "?" + upload_query_, {}};
  SendInfo info;
  Result<HttpResponse> r = client_->Send(&req, Call{"AbortMultipartUpload", url_}, &info);
  if (!r.ok() && info.code == "NoSuchUpload") return OkStatus();
  return r.status();
}

}  // namespace

Result<std::shared_ptr<ObjectClient>> NewS3Client(const S3Config& config) {
  HttpSettings settings{config.region, config.access_key_id, config.secret_access_key, config.session_token,
                        config.request_timeout_seconds};
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> http, HttpClient::Create(std::move(settings)));
  return std::shared_ptr<ObjectClient>(std::make_shared<S3Client>(config, std::move(http)));
}

}  // namespace s3

Result<std::unique_ptr<Storage>> NewS3Storage(const s3::S3Config& given) {
  DCKPT_ASSIGN_OR_RETURN(s3::S3Config config, s3::ResolveS3Config(given));
  DCKPT_ASSIGN_OR_RETURN(std::shared_ptr<ObjectClient> client, s3::NewS3Client(config));
  ObjectStorageOptions options;
  options.max_in_flight = config.max_in_flight;
  options.part_size = config.part_size;
  options.read_block_size = config.read_block_size;
  return NewObjectStorage(std::move(client), std::move(options));
}

}  // namespace distckpt
