// One HTTP exchange through libcurl, with AWS Signature Version 4 done by libcurl (CURLOPT_AWS_SIGV4). Easy handles
// are pooled so that connections are reused across requests. No retries here: the S3 client decides what to retry.
#ifndef DISTCKPT_CORE_STORAGE_S3_HTTP_CLIENT_H_
#define DISTCKPT_CORE_STORAGE_S3_HTTP_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/storage/s3/curl_library.h"

namespace distckpt {
namespace s3 {

struct HttpRequest {
  std::string method;  ///< GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::string> headers;  ///< "Name: value"
  /// PUT and POST: the body (borrowed; valid during Perform).
  const void* body = nullptr;
  size_t body_size = 0;
  /// GET: a successful (2xx) body goes here, at most `sink_size` bytes (more is an error), instead of into
  /// HttpResponse::body. With a 200 (not 206) answer, the first `skip_on_200` bytes of it are dropped: a server that
  /// ignored the Range header sent the object from its start.
  void* sink = nullptr;
  size_t sink_size = 0;
  uint64_t skip_on_200 = 0;
  /// Optional: told the bytes in the sink so far, as they arrive.
  const std::function<void(size_t)>* on_sunk = nullptr;
};

struct HttpResponse {
  long status = 0;                             // NOLINT(runtime/int)
  std::map<std::string, std::string> headers;  ///< lower-case names
  std::string body;                            ///< non-2xx bodies always; 2xx bodies without a sink
  size_t sunk = 0;                             ///< bytes delivered into the request's sink
  std::string Header(const std::string& lower_name) const;
};

/// A failed exchange: no complete HTTP response (connection refused or reset, timeout, a body cut short).
struct TransportError {
  Status status;
  bool retryable = true;
  size_t sunk = 0;  ///< bytes the sink received before the failure
};

struct HttpSettings {
  std::string region;         ///< for the signature
  std::string access_key_id;  ///< empty: unsigned requests
  std::string secret_access_key;
  std::string session_token;  ///< sent as x-amz-security-token
  double stall_seconds = 30;  ///< a request that moves no byte for this long fails
};

class HttpClient {
 public:
  /// Loads libcurl (kUnsupported naming it when it cannot).
  static Result<std::unique_ptr<HttpClient>> Create(HttpSettings settings);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// Sends `request` and returns the response, whatever its status; a transport failure comes back in *error (and
  /// the result is then not OK). Thread-safe.
  Result<HttpResponse> Perform(const HttpRequest& request, TransportError* error);

 private:
  HttpClient(const CurlLibrary* curl, HttpSettings settings);
  CURL* Take();
  void Give(CURL* handle);

  const CurlLibrary* const curl_;
  const HttpSettings settings_;
  std::mutex mu_;
  std::vector<CURL*> idle_;
  // The process the idle handles' connections belong to: a child forked after requests were made must not use (or
  // close) its parent's sockets, so it starts with no idle handles.
  int pid_;
};

}  // namespace s3
}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_S3_HTTP_CLIENT_H_
