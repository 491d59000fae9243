// What S3 puts on the wire besides HTTP itself: s3:// URLs, the encoding of keys and query values in request URLs, and
// the few XML documents the client reads (listings, multipart upload ids, errors) and writes (the part list).
#ifndef DISTCKPT_CORE_STORAGE_S3_S3_WIRE_H_
#define DISTCKPT_CORE_STORAGE_S3_S3_WIRE_H_

#include <string>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace distckpt {
namespace s3 {

/// "s3://bucket/key/part" -> {"bucket", "key/part"}; "s3://bucket" and "s3://bucket/" -> {"bucket", ""}.
/// kInvalidArgument for anything else (another scheme, no bucket, a bucket name S3 would refuse).
struct S3Location {
  std::string bucket;
  std::string key;
};
Result<S3Location> ParseS3Url(const std::string& url);

/// RFC 3986 percent-encoding of every byte but the unreserved ones (A-Z a-z 0-9 - _ . ~), and '/' too when
/// `keep_slash` (object keys in a URL path). The form AWS Signature Version 4 expects, so that the request signed is
/// the request sent.
std::string UriEncode(const std::string& s, bool keep_slash);

/// The text of every element <tag>...</tag> of `xml` (outermost first, entities decoded; <tag/> is ""). Enough for
/// S3's flat responses: elements of one name are not nested in each other.
std::vector<std::string> XmlElements(const std::string& xml, const std::string& tag);
/// The same, undecoded: the inner XML of each element, to look inside.
std::vector<std::string> XmlBlocks(const std::string& xml, const std::string& tag);
/// The first of XmlElements, or "" when there is none.
std::string XmlElement(const std::string& xml, const std::string& tag);
/// Escapes & < > " ' for element text.
std::string XmlEscape(const std::string& text);

/// One page of a ListObjectsV2 response: the keys and common prefixes directly below the prefix asked for.
struct ListPage {
  std::vector<std::string> keys;
  std::vector<std::string> prefixes;
  std::string next_token;  // empty: the last page
};
ListPage ParseListPage(const std::string& xml);

/// The body of CompleteMultipartUpload for parts 1..etags.size().
std::string CompleteMultipartBody(const std::vector<std::string>& etags);

/// S3's error document: <Error><Code>NoSuchKey</Code><Message>...</Message><RequestId>...</RequestId></Error>.
struct S3ErrorBody {
  std::string code, message, request_id;
};
/// Empty fields when `body` is not an S3 error document.
S3ErrorBody ParseErrorBody(const std::string& body);

}  // namespace s3
}  // namespace distckpt

#endif  // DISTCKPT_CORE_STORAGE_S3_S3_WIRE_H_
