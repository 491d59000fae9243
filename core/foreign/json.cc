#include "core/foreign/json.h"

#include <cstdio>
#include <cstring>

#include "core/base/utf8.h"

namespace distckpt {

namespace {

class Parser {
 public:
  Parser(std::string_view text, const std::string& context, int max_depth)
      : s_(text), context_(context), max_depth_(max_depth) {}

  Result<JsonValue> Run() {
    JsonValue v;
    SkipSpace();
    if (!Value(&v, 0)) return error_;
    SkipSpace();
    if (i_ != s_.size()) {
      Fail("unexpected " + Here() + " after the document");
      return error_;
    }
    return v;
  }

 private:
  bool Fail(const std::string& what) {
    if (error_.ok()) {
      error_ = Corrupt((context_.empty() ? "" : context_ + ": ") + "invalid JSON at byte " + std::to_string(i_) + ": " +
                       what);
    }
    return false;
  }
  std::string Here() const {
    if (i_ >= s_.size()) return "end of input";
    const auto c = static_cast<unsigned char>(s_[i_]);
    if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
    char buf[16];
    std::snprintf(buf, sizeof buf, "byte 0x%02x", c);
    return buf;
  }
  void SkipSpace() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool Literal(const char* word) {
    const size_t n = std::strlen(word);
    if (s_.compare(i_, n, word) != 0) return Fail("unexpected " + Here());
    i_ += n;
    return true;
  }

  bool Value(JsonValue* v, int depth) {
    if (depth > max_depth_) return Fail("nesting deeper than " + std::to_string(max_depth_));
    if (i_ >= s_.size()) return Fail("unexpected end of input");
    switch (s_[i_]) {
      case '{':
        return Object(v, depth);
      case '[':
        return Array(v, depth);
      case '"':
        v->kind = JsonValue::Kind::kString;
        return String(&v->text);
      case 't':
        v->kind = JsonValue::Kind::kBool;
        v->boolean = true;
        return Literal("true");
      case 'f':
        v->kind = JsonValue::Kind::kBool;
        return Literal("false");
      case 'n':
        return Literal("null");
      default:
        return Number(v);
    }
  }

  bool Object(JsonValue* v, int depth) {
    v->kind = JsonValue::Kind::kObject;
    ++i_;
    SkipSpace();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    for (;;) {
      SkipSpace();
      if (i_ >= s_.size() || s_[i_] != '"') return Fail("expected a member name, found " + Here());
      std::string name;
      if (!String(&name)) return false;
      SkipSpace();
      if (i_ >= s_.size() || s_[i_] != ':') return Fail("expected ':', found " + Here());
      ++i_;
      SkipSpace();
      v->members.emplace_back(std::move(name), JsonValue());
      if (!Value(&v->members.back().second, depth + 1)) return false;
      SkipSpace();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return true;
      }
      return Fail("expected ',' or '}', found " + Here());
    }
  }

  bool Array(JsonValue* v, int depth) {
    v->kind = JsonValue::Kind::kArray;
    ++i_;
    SkipSpace();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    for (;;) {
      SkipSpace();
      v->items.emplace_back();
      if (!Value(&v->items.back(), depth + 1)) return false;
      SkipSpace();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return true;
      }
      return Fail("expected ',' or ']', found " + Here());
    }
  }

  static int Hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool Hex4(uint32_t* out) {
    if (s_.size() - i_ < 4) return Fail("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const int h = Hex(s_[i_ + k]);
      if (h < 0) return Fail("invalid \\u escape");
      v = (v << 4) | static_cast<uint32_t>(h);
    }
    i_ += 4;
    *out = v;
    return true;
  }
  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xc0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xe0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      *out += static_cast<char>(0xf0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      *out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  bool String(std::string* out) {
    const size_t start = ++i_;
    // Fast path: a run without escapes is copied whole (and its UTF-8 checked once).
    size_t run = start;
    for (;;) {
      if (i_ >= s_.size()) return Fail("unterminated string starting at byte " + std::to_string(start - 1));
      const auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"' || c == '\\') {
        const std::string_view piece = s_.substr(run, i_ - run);
        if (!IsValidUtf8(piece)) return Fail("string is not valid UTF-8");
        out->append(piece.data(), piece.size());
        if (c == '"') {
          ++i_;
          return true;
        }
        ++i_;
        if (i_ >= s_.size()) return Fail("truncated escape");
        const char e = s_[i_++];
        switch (e) {
          case '"':
          case '\\':
          case '/':
            *out += e;
            break;
          case 'b':
            *out += '\b';
            break;
          case 'f':
            *out += '\f';
            break;
          case 'n':
            *out += '\n';
            break;
          case 'r':
            *out += '\r';
            break;
          case 't':
            *out += '\t';
            break;
          case 'u': {
            uint32_t cp;
            if (!Hex4(&cp)) return false;
            if (cp >= 0xdc00 && cp <= 0xdfff) return Fail("unpaired low surrogate in \\u escape");
            if (cp >= 0xd800 && cp <= 0xdbff) {
              uint32_t lo;
              if (s_.compare(i_, 2, "\\u") != 0) return Fail("unpaired high surrogate in \\u escape");
              i_ += 2;
              if (!Hex4(&lo)) return false;
              if (lo < 0xdc00 || lo > 0xdfff) return Fail("unpaired high surrogate in \\u escape");
              cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            AppendUtf8(cp, out);
            break;
          }
          default:
            --i_;
            return Fail("invalid escape \\" + Here());
        }
        run = i_;
        continue;
      }
      if (c < 0x20) return Fail("control character in a string");
      ++i_;
    }
  }

  bool Number(JsonValue* v) {
    const size_t start = i_;
    auto digits = [&] {
      const size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ > from;
    };
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ < s_.size() && s_[i_] == '0') {
      ++i_;
    } else if (!digits()) {
      return Fail("unexpected " + Here());
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (!digits()) return Fail("expected a digit after '.'");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) return Fail("expected a digit in the exponent");
    }
    v->kind = JsonValue::Kind::kNumber;
    v->text.assign(s_.substr(start, i_ - start));
    return true;
  }

  std::string_view s_;
  const std::string& context_;
  const int max_depth_;
  size_t i_ = 0;
  Status error_;
};

}  // namespace

std::optional<uint64_t> JsonValue::AsU64() const {
  if (kind != Kind::kNumber || text.empty() || text.size() > 20) return std::nullopt;
  if (text.size() > 1 && text[0] == '0') return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;  // negative, fraction or exponent
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

const JsonValue* JsonValue::Find(std::string_view name) const {
  for (const auto& m : members) {
    if (m.first == name) return &m.second;
  }
  return nullptr;
}

const char* JsonValue::KindName() const {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "a boolean";
    case Kind::kNumber:
      return "a number";
    case Kind::kString:
      return "a string";
    case Kind::kArray:
      return "an array";
    case Kind::kObject:
      return "an object";
  }
  return "a value";
}

Result<JsonValue> ParseJson(std::string_view text, const std::string& context, int max_depth) {
  return Parser(text, context, max_depth).Run();
}

std::string JsonQuote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace distckpt
