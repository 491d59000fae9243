#include "core/foreign/safetensors_header.h"

#include <algorithm>
#include <set>

#include "core/base/box.h"
#include "core/foreign/json.h"

namespace distckpt {

namespace {

// safetensors' dtype names; those distckpt has no type for (F4, F6_*, F8_E8M0) are refused by name.
DType SafetensorsDType(std::string_view name) {
  static const std::pair<const char*, DType> kTable[] = {
      {"BOOL", DType::kBool},      {"U8", DType::kU8},     {"I8", DType::kI8},
      {"U16", DType::kU16},        {"I16", DType::kI16},   {"U32", DType::kU32},
      {"I32", DType::kI32},        {"U64", DType::kU64},   {"I64", DType::kI64},
      {"F16", DType::kF16},        {"BF16", DType::kBF16}, {"F32", DType::kF32},
      {"F64", DType::kF64},        {"C64", DType::kC64},   {"F8_E4M3", DType::kF8E4M3FN},
      {"F8_E5M2", DType::kF8E5M2},
  };
  for (const auto& [n, d] : kTable) {
    if (name == n) return d;
  }
  return DType::kInvalid;
}

bool IsForeignOnlyDType(std::string_view name) {
  return name == "F4" || name == "F6_E2M3" || name == "F6_E3M2" || name == "F8_E8M0";
}

std::string Q(std::string_view s) { return JsonQuote(s.substr(0, std::min<size_t>(s.size(), 200))); }

}  // namespace

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t header_len, uint64_t file_size,
                                                 const std::string& file) {
  auto bad = [&file](const std::string& msg) { return Corrupt("safetensors file '" + file + "': " + msg); };
  if (file_size < 8) return bad("is " + std::to_string(file_size) + " bytes, too short for a header");
  if (header_len > kMaxSafetensorsHeader) {
    return bad("header length " + std::to_string(header_len) + " is over safetensors' limit of " +
               std::to_string(kMaxSafetensorsHeader));
  }
  if (header_len > file_size - 8) {
    return bad("header length " + std::to_string(header_len) + " runs past the end of the file (" +
               std::to_string(file_size) + " bytes): the file is truncated or damaged");
  }
  if (json.size() != header_len) return bad("header is truncated");
  if (json.empty() || json[0] != '{') return bad("header does not start with '{'");
  // Writers pad the header with spaces so that the byte buffer is aligned; JSON allows trailing whitespace.
  DCKPT_ASSIGN_OR_RETURN(JsonValue doc, ParseJson(json, "safetensors file '" + file + "': header", 8));
  if (!doc.is_object()) return bad("header is not a JSON object");
  SafetensorsHeader h;
  h.data_start = 8 + header_len;
  const uint64_t buffer = file_size - h.data_start;
  std::set<std::string_view> seen;
  bool have_metadata = false;
  for (const auto& member : doc.members) {
    const std::string& name = member.first;
    const JsonValue& v = member.second;
    if (!seen.insert(name).second) return bad("names " + Q(name) + " twice");
    if (name == "__metadata__") {
      have_metadata = true;
      if (!v.is_object()) return bad("\"__metadata__\" is " + std::string(v.KindName()) + ", not an object");
      for (const auto& [k, s] : v.members) {
        if (!s.is_string()) return bad("\"__metadata__\" value of " + Q(k) + " is not a string");
        h.metadata.emplace_back(k, s.text);
      }
      continue;
    }
    auto where = [&](const std::string& what) { return bad("tensor " + Q(name) + ": " + what); };
    if (name.empty()) return bad("a tensor has an empty name");
    if (!v.is_object()) return where("is " + std::string(v.KindName()) + ", not an object");
    const JsonValue *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (const auto& [field, fv] : v.members) {
      const JsonValue** slot = field == "dtype"          ? &dtype
                               : field == "shape"        ? &shape
                               : field == "data_offsets" ? &offsets
                                                         : nullptr;
      if (slot == nullptr) return where("has an unknown field " + Q(field));
      if (*slot != nullptr) return where("has the field " + Q(field) + " twice");
      *slot = &fv;
    }
    if (!dtype || !shape || !offsets) {
      return where(std::string("lacks \"") + (!dtype ? "dtype" : !shape ? "shape" : "data_offsets") + "\"");
    }
    if (!dtype->is_string()) return where("dtype is not a string");
    SafetensorsTensor t;
    t.name = name;
    t.dtype = SafetensorsDType(dtype->text);
    if (t.dtype == DType::kInvalid) {
      if (IsForeignOnlyDType(dtype->text)) {
        return Status(StatusCode::kUnsupported, "safetensors file '" + file + "': tensor " + Q(name) + " has dtype " +
                                                    dtype->text + ", which distckpt has no type for");
      }
      return where("unknown dtype " + Q(dtype->text));
    }
    if (!shape->is_array()) return where("shape is not an array");
    if (shape->items.size() > kMaxDims) {
      return Status(StatusCode::kUnsupported, "safetensors file '" + file + "': tensor " + Q(name) + " has " +
                                                  std::to_string(shape->items.size()) +
                                                  " dimensions; distckpt supports at most " + std::to_string(kMaxDims));
    }
    for (const JsonValue& d : shape->items) {
      const auto n = d.AsU64();
      if (!n)
        return where("shape holds " + (d.text.empty() ? std::string(d.KindName()) : d.text) +
                     ", not a non-negative integer");
      t.shape.push_back(*n);
    }
    if (!offsets->is_array() || offsets->items.size() != 2 || !offsets->items[0].AsU64() ||
        !offsets->items[1].AsU64()) {
      return where("data_offsets is not [begin, end] of non-negative integers");
    }
    t.begin = *offsets->items[0].AsU64();
    t.end = *offsets->items[1].AsU64();
    if (t.end < t.begin)
      return where("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                   "] end before they begin");
    auto bytes = CheckedVolume(Span<const uint64_t>(t.shape.data(), t.shape.size()), DTypeSize(t.dtype));
    if (!bytes.ok()) return where("shape's byte size overflows 64 bits");
    if (*bytes != t.end - t.begin) {
      return where("holds " + std::to_string(t.end - t.begin) + " bytes but its shape of " + DTypeName(t.dtype) +
                   " needs " + std::to_string(*bytes));
    }
    h.tensors.push_back(std::move(t));
  }
  (void)have_metadata;
  std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // safetensors' rule: in order of their offsets the tensors tile the byte buffer, from 0 to its end.
  uint64_t at = 0;
  for (const SafetensorsTensor& t : h.tensors) {
    if (t.begin != at) {
      return bad("tensor " + Q(t.name) + " starts at byte " + std::to_string(t.begin) + " of the data, expected " +
                 std::to_string(at) + (t.begin < at ? " (it overlaps the tensor before it)" : " (a gap before it)"));
    }
    at = t.end;
  }
  if (at > buffer) {
    return bad("tensors end at byte " + std::to_string(at) + " of the data, past its end (" + std::to_string(buffer) +
               " bytes): the file is truncated");
  }
  if (at != buffer) {
    return bad("tensors end at byte " + std::to_string(at) + " of the data but it has " + std::to_string(buffer) +
               " bytes (bytes that no tensor holds)");
  }
  return h;
}

}  // namespace distckpt
