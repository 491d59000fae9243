// libcurl, loaded at run time with dlopen("libcurl.so.4"), so that one libdistckpt.so serves machines with and without
// it: nothing links against libcurl, and only S3 storage loads it. The declarations below mirror curl/curl.h for the
// handful of entry points and option numbers the S3 client uses (curl's ABI has kept them since 7.x: option numbers
// are never reused). A setopt the loaded libcurl does not know fails with its error, which the client reports.
#ifndef DISTCKPT_CORE_STORAGE_S3_CURL_LIBRARY_H_
#define DISTCKPT_CORE_STORAGE_S3_CURL_LIBRARY_H_

#include <cstddef>
#include <string>

#include "core/base/status.h"

namespace distckpt {
namespace s3 {

// Mirrors of curl.h's types: an easy handle and a header list are opaque; CURLcode, CURLoption and CURLINFO are ints.
struct CURL;
struct curl_slist;
using CURLcode = int;
using CURLoption = int;
using CURLINFO = int;
using curl_off_t = long long;  // NOLINT(runtime/int): curl.h's type on LP64
using curl_write_callback = size_t (*)(char* data, size_t size, size_t nmemb, void* user);
using curl_read_callback = size_t (*)(char* data, size_t size, size_t nmemb, void* user);

constexpr CURLcode kCurlOk = 0;  // CURLE_OK
// CURLoption = type base + number: LONG 0, OBJECTPOINT/STRINGPOINT/SLISTPOINT 10000, FUNCTIONPOINT 20000, OFF_T 30000.
namespace opt {
constexpr CURLoption kWriteData = 10001;           // CURLOPT_WRITEDATA
constexpr CURLoption kUrl = 10002;                 // CURLOPT_URL
constexpr CURLoption kUserPwd = 10005;             // CURLOPT_USERPWD
constexpr CURLoption kReadData = 10009;            // CURLOPT_READDATA
constexpr CURLoption kErrorBuffer = 10010;         // CURLOPT_ERRORBUFFER
constexpr CURLoption kWriteFunction = 20011;       // CURLOPT_WRITEFUNCTION
constexpr CURLoption kReadFunction = 20012;        // CURLOPT_READFUNCTION
constexpr CURLoption kPostFields = 10015;          // CURLOPT_POSTFIELDS
constexpr CURLoption kLowSpeedLimit = 19;          // CURLOPT_LOW_SPEED_LIMIT
constexpr CURLoption kLowSpeedTime = 20;           // CURLOPT_LOW_SPEED_TIME
constexpr CURLoption kHttpHeader = 10023;          // CURLOPT_HTTPHEADER
constexpr CURLoption kHeaderData = 10029;          // CURLOPT_HEADERDATA
constexpr CURLoption kCustomRequest = 10036;       // CURLOPT_CUSTOMREQUEST
constexpr CURLoption kNoBody = 44;                 // CURLOPT_NOBODY
constexpr CURLoption kUpload = 46;                 // CURLOPT_UPLOAD
constexpr CURLoption kPost = 47;                   // CURLOPT_POST
constexpr CURLoption kHeaderFunction = 20079;      // CURLOPT_HEADERFUNCTION
constexpr CURLoption kHttpGet = 80;                // CURLOPT_HTTPGET
constexpr CURLoption kBufferSize = 98;             // CURLOPT_BUFFERSIZE
constexpr CURLoption kNoSignal = 99;               // CURLOPT_NOSIGNAL
constexpr CURLoption kInFileSizeLarge = 30115;     // CURLOPT_INFILESIZE_LARGE
constexpr CURLoption kPostFieldSizeLarge = 30120;  // CURLOPT_POSTFIELDSIZE_LARGE
constexpr CURLoption kTcpNoDelay = 121;            // CURLOPT_TCP_NODELAY
constexpr CURLoption kConnectTimeoutMs = 156;      // CURLOPT_CONNECTTIMEOUT_MS
constexpr CURLoption kTcpKeepAlive = 213;          // CURLOPT_TCP_KEEPALIVE
constexpr CURLoption kAwsSigV4 = 10305;            // CURLOPT_AWS_SIGV4 (libcurl 7.75)
}  // namespace opt
constexpr CURLINFO kInfoResponseCode = 0x200002;  // CURLINFO_RESPONSE_CODE (CURLINFO_LONG + 2)
constexpr long kGlobalDefault = 3;                // NOLINT(runtime/int): CURL_GLOBAL_DEFAULT (SSL | WIN32)
constexpr size_t kReadAbort = 0x10000000;         // CURL_READFUNC_ABORT
constexpr size_t kErrorSize = 256;                // CURL_ERROR_SIZE

/// The entry points, resolved once by symbol name. A missing one makes the load fail (kUnsupported naming it).
struct CurlLibrary {
  CURLcode (*curl_global_init)(long flags);  // NOLINT(runtime/int)
  CURL* (*curl_easy_init)();
  void (*curl_easy_cleanup)(CURL* curl);
  void (*curl_easy_reset)(CURL* curl);
  CURLcode (*curl_easy_setopt)(CURL* curl, CURLoption option, ...);
  CURLcode (*curl_easy_perform)(CURL* curl);
  CURLcode (*curl_easy_getinfo)(CURL* curl, CURLINFO info, ...);
  const char* (*curl_easy_strerror)(CURLcode code);
  curl_slist* (*curl_slist_append)(curl_slist* list, const char* header);
  void (*curl_slist_free_all)(curl_slist* list);
  char* (*curl_version)();
};

/// The file loaded: $DCKPT_CURL_LIBRARY, else "libcurl.so.4".
std::string CurlLibraryName();

/// libcurl, loaded and globally initialised on the first call (thread-safe; later calls return the same result). Never
/// unloaded. kUnsupported, naming the file and how to get it, when it cannot be loaded or lacks an entry point.
Result<const CurlLibrary*> LoadCurl();

}  // namespace s3
}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_S3_CURL_LIBRARY_H_
