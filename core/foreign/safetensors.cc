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

std::string Q(std::string_view s) { return JsonQuote(s.substr(0, std::min<size_t>(s.size(), 200))); }

}  // namespace

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
  return ReadSafetensorsIndex(dir, dir_path, indexes[0]);
}

Result<SafetensorsLayout> ReadSafetensorsIndex(Directory* dir, const std::string& dir_path, const std::string& index) {
  SafetensorsLayout layout;
  layout.index = index;
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
                        (layout.index.empty() ? "" : " (named by '" + layout.index + "')") + " is missing (" +
                        f.status().message() + ")");
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
