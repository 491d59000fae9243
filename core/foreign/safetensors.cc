#include "core/foreign/safetensors.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "core/base/box.h"
#include "core/foreign/json.h"

namespace distckpt {

namespace {

constexpr char kSuffix[] = ".safetensors";
constexpr char kIndexSuffix[] = ".safetensors.index.json";
constexpr uint64_t kMaxIndexBytes = 64ull << 20;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

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
  for (const auto& [name, v] : doc.members) {
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

Result<SafetensorsHeader> ReadSafetensorsHeader(const ReadableFile& file) {
  const uint64_t size = file.size();
  uint64_t len = 0;
  if (size >= 8) {
    unsigned char le[8];
    DCKPT_RETURN_IF_ERROR(file.ReadAt(0, le, 8));
    for (int i = 7; i >= 0; --i) len = (len << 8) | le[i];
  }
  std::string json;
  if (size >= 8 && len <= kMaxSafetensorsHeader && len <= size - 8) {
    json.resize(static_cast<size_t>(len));
    DCKPT_RETURN_IF_ERROR(file.ReadAt(8, json.data(), json.size()));
  }
  return ParseSafetensorsHeader(json, len, size, file.path());
}

Result<SafetensorsLayout> FindSafetensorsLayout(Directory* dir, const std::string& dir_path,
                                                const std::vector<std::string>& listing) {
  SafetensorsLayout layout;
  std::vector<std::string> indexes, files;
  for (const std::string& n : listing) {
    if (EndsWith(n, kIndexSuffix)) indexes.push_back(n);
    if (EndsWith(n, kSuffix) && n.size() > sizeof(kSuffix) - 1) files.push_back(n);
  }
  std::sort(indexes.begin(), indexes.end());
  std::sort(files.begin(), files.end());
  if (indexes.size() > 1) {
    std::string names;
    for (const auto& n : indexes) names += (names.empty() ? "'" : ", '") + n + "'";
    return InvalidArgument("'" + dir_path + "' holds several safetensors indexes (" + names +
                           "): open one model's file, or a directory with one index");
  }
  if (indexes.empty()) {
    layout.files = std::move(files);
    return layout;
  }
  layout.index = indexes[0];
  const std::string where = "safetensors index '" + dir_path + "/" + layout.index + "'";
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> f, dir->OpenFile(layout.index));
  if (f->size() > kMaxIndexBytes) {
    return Corrupt(where + " is " + std::to_string(f->size()) + " bytes, over the limit of " +
                   std::to_string(kMaxIndexBytes));
  }
  std::string text(static_cast<size_t>(f->size()), '\0');
  DCKPT_RETURN_IF_ERROR(f->ReadAt(0, text.data(), text.size()));
  DCKPT_ASSIGN_OR_RETURN(JsonValue doc, ParseJson(text, where, 16));
  const JsonValue* map = doc.is_object() ? doc.Find("weight_map") : nullptr;
  if (map == nullptr || !map->is_object()) return Corrupt(where + " has no \"weight_map\" object");
  std::set<std::string> named;
  for (const auto& [tensor, file] : map->members) {
    if (!file.is_string() || !IsValidFileName(file.text) || !EndsWith(file.text, kSuffix)) {
      return Corrupt(where + " maps tensor " + Q(tensor) + " to " +
                     (file.is_string() ? Q(file.text) : std::string(file.KindName())) +
                     ", not a .safetensors file in the same directory");
    }
    named.insert(file.text);
    layout.weight_map.emplace_back(tensor, file.text);
  }
  layout.files.assign(named.begin(), named.end());
  return layout;
}

Result<MetadataRecord> DescribeSafetensors(Directory* dir, const SafetensorsLayout& layout,
                                           const std::string& context) {
  MetadataRecord r;
  r.source = "safetensors";
  r.writer = "safetensors";
  r.alignment = 1;
  std::map<std::string, std::string> user;
  std::map<std::string_view, uint32_t> where_is;  // tensor -> file index
  std::vector<SafetensorsHeader> headers;
  headers.reserve(layout.files.size());
  for (uint32_t i = 0; i < layout.files.size(); ++i) {
    const std::string& name = layout.files[i];
    auto f = dir->OpenFile(name);
    if (!f.ok()) {
      if (f.status().code() == StatusCode::kNotFound) {
        return NotFound("checkpoint '" + context + "': safetensors file '" + name + "'" +
                        (layout.index.empty() ? "" : " (named by '" + layout.index + "')") + " is missing");
      }
      return f.status().WithContext("checkpoint '" + context + "'");
    }
    auto h = ReadSafetensorsHeader(**f);
    if (!h.ok()) return h.status().WithContext("checkpoint '" + context + "'");
    r.files.push_back({name, (*f)->size()});
    for (auto& kv : h->metadata) user.emplace(kv.first, kv.second);
    headers.push_back(std::move(h).value());
  }
  for (uint32_t i = 0; i < headers.size(); ++i) {
    for (const SafetensorsTensor& t : headers[i].tensors) {
      auto [it, fresh] = where_is.emplace(t.name, i);
      if (!fresh) {
        return Corrupt("checkpoint '" + context + "': tensor " + Q(t.name) + " is in both '" +
                       layout.files[it->second] + "' and '" + layout.files[i] + "'");
      }
      EntryRecord e;
      e.name = t.name;
      e.dtype = t.dtype;
      e.shape = t.shape;
      e.chunk_offsets.assign(t.shape.size(), 0);
      e.chunk_lengths = t.shape;
      e.chunks.push_back(ChunkLocation{headers[i].data_start + t.begin, t.end - t.begin, 0, i, kNoBlockTable});
      r.entries.push_back(std::move(e));
    }
  }
  // Every tensor the index maps must be in the file it names.
  for (const auto& [tensor, file] : layout.weight_map) {
    const std::string where = "checkpoint '" + context + "': safetensors index '" + layout.index + "' maps tensor " +
                              Q(tensor) + " to '" + file + "'";
    auto it = where_is.find(tensor);
    if (it == where_is.end()) return Corrupt(where + ", which does not hold it");
    if (layout.files[it->second] != file) return Corrupt(where + " but it is in '" + layout.files[it->second] + "'");
  }
  r.user.assign(user.begin(), user.end());
  return r;
}

}  // namespace distckpt
