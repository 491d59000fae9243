#include "core/storage/s3/s3_wire.h"

#include <cstdlib>

namespace distckpt {
namespace s3 {
namespace {

bool Unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == '~';
}

// Appends the UTF-8 encoding of code point `cp` (invalid ones become U+FFFD).
void AppendUtf8(unsigned long cp, std::string* out) {  // NOLINT(runtime/int)
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string XmlUnescape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    const size_t end = s.find(';', i);
    if (end == std::string::npos || end - i > 12) {
      out.push_back('&');
      continue;
    }
    const std::string name = s.substr(i + 1, end - i - 1);
    if (name == "amp") out.push_back('&');
    else if (name == "lt") out.push_back('<');
    else if (name == "gt") out.push_back('>');
    else if (name == "quot") out.push_back('"');
    else if (name == "apos") out.push_back('\'');
    else if (name.size() > 1 && name[0] == '#') {
      const bool hex = name[1] == 'x' || name[1] == 'X';
      char* stop = nullptr;
      const std::string digits = name.substr(hex ? 2 : 1);
      const unsigned long cp = std::strtoul(digits.c_str(), &stop, hex ? 16 : 10);  // NOLINT(runtime/int)
      if (digits.empty() || *stop != '\0') {
        out.append(s, i, end - i + 1);
      } else {
        AppendUtf8(cp, &out);
      }
    } else {
      out.append(s, i, end - i + 1);  // unknown entity: kept as written
    }
    i = end;
  }
  return out;
}

// A bucket name S3 could hold (3-63 characters of a-z 0-9 . -), loosely: enough to refuse what would change the
// request's host or path.
bool PlausibleBucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_' ||
          (c >= 'A' && c <= 'Z'))) {
      return false;
    }
  }
  return true;
}

}  // namespace

Result<S3Location> ParseS3Url(const std::string& url) {
  constexpr char kScheme[] = "s3://";
  if (url.compare(0, sizeof(kScheme) - 1, kScheme) != 0) {
    return InvalidArgument("'" + url + "' is not an s3:// URL (s3://bucket/key)");
  }
  const std::string rest = url.substr(sizeof(kScheme) - 1);
  const size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) loc.key = rest.substr(slash + 1);
  if (!PlausibleBucket(loc.bucket)) {
    return InvalidArgument("'" + url + "': '" + loc.bucket +
                           "' is not an S3 bucket name (3 to 63 letters, digits, '.', '-')");
  }
  return loc;
}

std::string UriEncode(const std::string& s, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (Unreserved(c) || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::vector<std::string> XmlBlocks(const std::string& xml, const std::string& tag) {
  std::vector<std::string> out;
  const std::string open = "<" + tag, close = "</" + tag + ">";
  size_t at = 0;
  while ((at = xml.find(open, at)) != std::string::npos) {
    const size_t after = at + open.size();
    if (after >= xml.size()) break;
    const char next = xml[after];
    if (next != '>' && next != ' ' && next != '/' && next != '\t' && next != '\n' && next != '\r') {
      at = after;  // a longer tag name with this prefix
      continue;
    }
    const size_t gt = xml.find('>', after);
    if (gt == std::string::npos) break;
    if (xml[gt - 1] == '/') {  // <tag/>
      out.emplace_back();
      at = gt + 1;
      continue;
    }
    const size_t end = xml.find(close, gt + 1);
    if (end == std::string::npos) break;
    out.push_back(xml.substr(gt + 1, end - gt - 1));
    at = end + close.size();
  }
  return out;
}

std::vector<std::string> XmlElements(const std::string& xml, const std::string& tag) {
  std::vector<std::string> out = XmlBlocks(xml, tag);
  for (std::string& s : out) s = XmlUnescape(s);
  return out;
}

std::string XmlElement(const std::string& xml, const std::string& tag) {
  std::vector<std::string> all = XmlElements(xml, tag);
  return all.empty() ? std::string() : std::move(all[0]);
}

std::string XmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

ListPage ParseListPage(const std::string& xml) {
  ListPage page;
  // Keys are inside <Contents>; the response's own <Prefix> (the prefix asked for) sits outside <CommonPrefixes>.
  for (const std::string& contents : XmlBlocks(xml, "Contents")) page.keys.push_back(XmlElement(contents, "Key"));
  for (const std::string& common : XmlBlocks(xml, "CommonPrefixes")) {
    page.prefixes.push_back(XmlElement(common, "Prefix"));
  }
  if (XmlElement(xml, "IsTruncated") == "true") page.next_token = XmlElement(xml, "NextContinuationToken");
  return page;
}

std::string CompleteMultipartBody(const std::vector<std::string>& etags) {
  std::string body = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    body +=
        "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + XmlEscape(etags[i]) + "</ETag></Part>";
  }
  return body + "</CompleteMultipartUpload>";
}

S3ErrorBody ParseErrorBody(const std::string& body) {
  S3ErrorBody e;
  const std::vector<std::string> errors = XmlBlocks(body, "Error");
  if (errors.empty()) return e;
  const std::string& error = errors[0];
  e.code = XmlElement(error, "Code");
  e.message = XmlElement(error, "Message");
  e.request_id = XmlElement(error, "RequestId");
  return e;
}

}  // namespace s3
}  // namespace distckpt
