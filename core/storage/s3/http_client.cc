#include "core/storage/s3/http_client.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <utility>

namespace distckpt {
namespace s3 {
namespace {

// Bodies kept in memory (errors, listings, upload ids) stop growing here: S3 never sends more for them.
constexpr size_t kMaxBody = size_t{64} << 20;

struct Exchange {
  const HttpRequest* request;
  HttpResponse* response;
  size_t upload_pos = 0;
  uint64_t skipped = 0;
  bool overflow = false;
};

bool Success(long status) { return status >= 200 && status < 300; }  // NOLINT(runtime/int)

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* x = static_cast<Exchange*>(user);
  const size_t len = size * count;
  std::string line(data, len);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  if (line.compare(0, 5, "HTTP/") == 0) {
    // A new response (the one after a 100 Continue, or a redirect's): its headers start afresh.
    const size_t sp = line.find(' ');
    x->response->status = sp == std::string::npos ? 0 : std::strtol(line.c_str() + sp + 1, nullptr, 10);
    x->response->headers.clear();
    return len;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return len;
  std::string name = line.substr(0, colon);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  size_t v = colon + 1;
  while (v < line.size() && (line[v] == ' ' || line[v] == '\t')) ++v;
  x->response->headers[name] = line.substr(v);
  return len;
}

size_t OnWrite(char* data, size_t size, size_t count, void* user) {
  auto* x = static_cast<Exchange*>(user);
  const size_t len = size * count;
  const HttpRequest& req = *x->request;
  HttpResponse& resp = *x->response;
  if (req.sink != nullptr && Success(resp.status)) {
    size_t take = len;
    const char* from = data;
    if (resp.status == 200 && x->skipped < req.skip_on_200) {
      const size_t drop = static_cast<size_t>(std::min<uint64_t>(take, req.skip_on_200 - x->skipped));
      x->skipped += drop;
      from += drop;
      take -= drop;
    }
    if (take > req.sink_size - resp.sunk) {
      if (resp.status != 200) {  // a 206 longer than the range asked for
        x->overflow = true;
        return 0;  // aborts the transfer
      }
      take = req.sink_size - resp.sunk;  // the whole object: the rest is beyond the range
    }
    std::memcpy(static_cast<char*>(req.sink) + resp.sunk, from, take);
    resp.sunk += take;
    if (req.on_sunk != nullptr && take > 0) (*req.on_sunk)(resp.sunk);
    return len;
  }
  if (resp.body.size() + len > kMaxBody) {
    x->overflow = true;
    return 0;
  }
  resp.body.append(data, len);
  return len;
}

size_t OnRead(char* buffer, size_t size, size_t count, void* user) {
  auto* x = static_cast<Exchange*>(user);
  const size_t n = std::min(size * count, x->request->body_size - x->upload_pos);
  if (n > 0) std::memcpy(buffer, static_cast<const char*>(x->request->body) + x->upload_pos, n);
  x->upload_pos += n;
  return n;
}

// CURLcodes that no retry can fix: the request itself is wrong, or this libcurl cannot make it.
bool RetryableCurlCode(CURLcode rc) {
  switch (rc) {
    case 1:   // CURLE_UNSUPPORTED_PROTOCOL
    case 3:   // CURLE_URL_MALFORMAT
    case 4:   // CURLE_NOT_BUILT_IN
    case 27:  // CURLE_OUT_OF_MEMORY
    case 43:  // CURLE_BAD_FUNCTION_ARGUMENT
    case 48:  // CURLE_UNKNOWN_OPTION
    case 60:  // CURLE_PEER_FAILED_VERIFICATION
      return false;
    default:
      return true;
  }
}

}  // namespace

std::string HttpResponse::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

Result<std::unique_ptr<HttpClient>> HttpClient::Create(HttpSettings settings) {
  DCKPT_ASSIGN_OR_RETURN(const CurlLibrary* curl, LoadCurl());
  return std::unique_ptr<HttpClient>(new HttpClient(curl, std::move(settings)));
}

HttpClient::HttpClient(const CurlLibrary* curl, HttpSettings settings)
    : curl_(curl), settings_(std::move(settings)), pid_(::getpid()) {}

HttpClient::~HttpClient() {
  if (pid_ != ::getpid()) return;  // a forked child: the handles are the parent's (left alone, never closed here)
  for (CURL* h : idle_) curl_->curl_easy_cleanup(h);
}

CURL* HttpClient::Take() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pid_ != ::getpid()) {
      // Forked since the handles were pooled: their connections are the parent's sockets. Dropped without
      // curl_easy_cleanup, which could write on them (a TLS close) under the parent's feet.
      idle_.clear();
      pid_ = ::getpid();
    }
    if (!idle_.empty()) {
      CURL* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  return curl_->curl_easy_init();
}

void HttpClient::Give(CURL* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(handle);
}

Result<HttpResponse> HttpClient::Perform(const HttpRequest& req, TransportError* error) {
  const std::string what = req.method + " " + req.url;
  CURL* h = Take();
  if (h == nullptr) {
    *error = TransportError{Status(StatusCode::kNoMemory, what + ": curl_easy_init failed"), false};
    return error->status;
  }
  const CurlLibrary& c = *curl_;
  c.curl_easy_reset(h);  // keeps the handle's connections
  HttpResponse resp;
  Exchange x{&req, &resp};
  char errbuf[kErrorSize] = {0};
  curl_slist* headers = nullptr;
  CURLcode bad = kCurlOk;
  const char* bad_option = nullptr;
  auto set = [&](CURLoption option, auto value, const char* name) {
    if (bad != kCurlOk) return;
    const CURLcode rc = c.curl_easy_setopt(h, option, value);
    if (rc != kCurlOk) {
      bad = rc;
      bad_option = name;
    }
  };
  const long stall = std::max(1L, static_cast<long>(settings_.stall_seconds + 0.5));  // NOLINT(runtime/int)
  set(opt::kUrl, req.url.c_str(), "CURLOPT_URL");
  set(opt::kNoSignal, 1L, "CURLOPT_NOSIGNAL");
  set(opt::kTcpNoDelay, 1L, "CURLOPT_TCP_NODELAY");
  set(opt::kTcpKeepAlive, 1L, "CURLOPT_TCP_KEEPALIVE");
  set(opt::kConnectTimeoutMs, std::min(stall, 10L) * 1000L, "CURLOPT_CONNECTTIMEOUT_MS");
  set(opt::kLowSpeedLimit, 1L, "CURLOPT_LOW_SPEED_LIMIT");
  set(opt::kLowSpeedTime, stall, "CURLOPT_LOW_SPEED_TIME");
  // Large receive buffers for large bodies: fewer, larger copies (512 KiB is libcurl's largest).
  if (req.sink_size >= (size_t{4} << 20)) set(opt::kBufferSize, 512L * 1024L, "CURLOPT_BUFFERSIZE");
  set(opt::kErrorBuffer, static_cast<char*>(errbuf), "CURLOPT_ERRORBUFFER");
  set(opt::kHeaderFunction, &OnHeader, "CURLOPT_HEADERFUNCTION");
  set(opt::kHeaderData, static_cast<void*>(&x), "CURLOPT_HEADERDATA");
  set(opt::kWriteFunction, &OnWrite, "CURLOPT_WRITEFUNCTION");
  set(opt::kWriteData, static_cast<void*>(&x), "CURLOPT_WRITEDATA");
  std::vector<std::string> lines = req.headers;
  // The payload is not hashed (UNSIGNED-PAYLOAD, as the AWS SDKs do for streamed bodies); libcurl signs this header's
  // value as the payload hash. (No "Expect:" to turn off 100-continue: libcurl would sign the header it then drops.)
  lines.push_back("x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (!settings_.session_token.empty()) lines.push_back("x-amz-security-token: " + settings_.session_token);
  for (const std::string& line : lines) headers = c.curl_slist_append(headers, line.c_str());
  set(opt::kHttpHeader, headers, "CURLOPT_HTTPHEADER");
  std::string userpwd;
  std::string sigv4;
  if (!settings_.access_key_id.empty()) {
    userpwd = settings_.access_key_id + ":" + settings_.secret_access_key;
    sigv4 = "aws:amz:" + settings_.region + ":s3";
    set(opt::kAwsSigV4, sigv4.c_str(), "CURLOPT_AWS_SIGV4");
    set(opt::kUserPwd, userpwd.c_str(), "CURLOPT_USERPWD");
  }
  if (req.method == "GET") {
    set(opt::kHttpGet, 1L, "CURLOPT_HTTPGET");
  } else if (req.method == "HEAD") {
    set(opt::kNoBody, 1L, "CURLOPT_NOBODY");
  } else if (req.method == "PUT") {
    set(opt::kUpload, 1L, "CURLOPT_UPLOAD");
    set(opt::kReadFunction, &OnRead, "CURLOPT_READFUNCTION");
    set(opt::kReadData, static_cast<void*>(&x), "CURLOPT_READDATA");
    set(opt::kInFileSizeLarge, static_cast<curl_off_t>(req.body_size), "CURLOPT_INFILESIZE_LARGE");
  } else if (req.method == "POST") {
    set(opt::kPost, 1L, "CURLOPT_POST");
    set(opt::kPostFields, req.body != nullptr ? static_cast<const char*>(req.body) : "", "CURLOPT_POSTFIELDS");
    set(opt::kPostFieldSizeLarge, static_cast<curl_off_t>(req.body_size), "CURLOPT_POSTFIELDSIZE_LARGE");
  } else {
    set(opt::kCustomRequest, req.method.c_str(), "CURLOPT_CUSTOMREQUEST");
  }
  CURLcode rc = bad;
  if (bad == kCurlOk) rc = c.curl_easy_perform(h);
  c.curl_slist_free_all(headers);
  if (bad != kCurlOk) {
    curl_->curl_easy_cleanup(h);
    *error = TransportError{
        Unsupported(what + ": " + CurlLibraryName() + " (" + c.curl_version() + ") refused " + bad_option + ": " +
                    c.curl_easy_strerror(bad) + " (S3 storage needs libcurl 7.75 or later)"),
        false};
    return error->status;
  }
  if (rc != kCurlOk) {
    curl_->curl_easy_cleanup(h);  // the connection may be in any state: not reused
    std::string detail = errbuf[0] != '\0' ? errbuf : c.curl_easy_strerror(rc);
    if (x.overflow) detail = "the response was longer than the " + std::to_string(req.sink_size) + " bytes asked for";
    const StatusCode code = rc == 28 ? StatusCode::kTimeout : StatusCode::kIo;  // CURLE_OPERATION_TIMEDOUT
    *error = TransportError{Status(code, what + ": " + detail), !x.overflow && RetryableCurlCode(rc), resp.sunk};
    return error->status;
  }
  long status = 0;  // NOLINT(runtime/int)
  c.curl_easy_getinfo(h, kInfoResponseCode, &status);
  if (status != 0) resp.status = status;
  Give(h);
  return resp;
}

}  // namespace s3
}  // namespace distckpt
