// A strict, bounded JSON reader for the small documents foreign checkpoints carry (a safetensors header, a Hugging
// Face index). RFC 8259 only: no comments, no trailing commas, no NaN; strings must be valid UTF-8 and every \u
// escape a valid code point. Numbers keep their text, so that a 64-bit offset is read exactly (no double rounding).
// Depth and sizes are bounded by the input, so a hostile document cannot make the reader recurse or allocate much.
#ifndef DISTCKPT_CORE_FOREIGN_JSON_H_
#define DISTCKPT_CORE_FOREIGN_JSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace distckpt {

struct JsonValue {
  enum class Kind : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;                                        ///< a string's value, or a number's text as written
  std::vector<JsonValue> items;                            ///< array elements
  std::vector<std::pair<std::string, JsonValue>> members;  ///< object members in document order (names may repeat)

  bool is_object() const { return kind == Kind::kObject; }
  bool is_array() const { return kind == Kind::kArray; }
  bool is_string() const { return kind == Kind::kString; }
  /// The number as an unsigned 64-bit integer: nullopt unless it is a plain non-negative integer that fits.
  std::optional<uint64_t> AsU64() const;
  /// The first member named `name`, or nullptr.
  const JsonValue* Find(std::string_view name) const;
  /// "an object", "a string"... for messages.
  const char* KindName() const;
};

/// Parses `text` as one JSON document (surrounding whitespace allowed). Errors are kCorrupt and say where (byte
/// offset) and what; `context` (e.g. the file) prefixes them. Nesting deeper than `max_depth` is refused.
Result<JsonValue> ParseJson(std::string_view text, const std::string& context, int max_depth = 64);

/// `s` as a JSON string literal, quotes included (escapes '"', '\\', and control characters, with the short forms where
/// JSON has them; UTF-8 passes through). For messages and for writers (the safetensors exporter's headers and index).
std::string JsonQuote(std::string_view s);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_JSON_H_
