#include "core/engine/base_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace distckpt {

namespace {

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string SiblingPath(const std::string& checkpoint, std::string_view name) {
  const std::string parent = ParentDir(checkpoint);
  if (parent == ".") return std::string(name);  // a bare name (or an object key without a prefix)
  return parent + (parent.back() == '/' ? "" : "/") + std::string(name);
}

Result<std::string> SiblingName(const std::string& path, const std::string& base) {
  const std::string name = BaseName(base);
  const bool bare = base.find('/') == std::string::npos;
  if (!IsValidFileName(name) || (!bare && ParentDir(base) != ParentDir(path))) {
    return InvalidArgument("the base checkpoint '" + base + "' must be a sibling of '" + path + "' (in '" +
                           ParentDir(path) + "'), named by its path there or by its name: a checkpoint refers to " +
                           "its base by name (FORMAT.md 4.1)");
  }
  if (name == BaseName(path)) {
    return InvalidArgument("the checkpoint '" + path + "' cannot be its own base");
  }
  return name;
}

Result<std::unique_ptr<ReadableFile>> OpenMetadataFile(Directory* dir, const std::string& path) {
  auto file = dir->OpenFile(kMetadataFileName);
  if (file.ok()) {
    if ((*file)->size() >= kMaxMetadataBytes) {
      return Corrupt("'" + (*file)->path() + "' is " + std::to_string((*file)->size()) +
                     " bytes, over the metadata limit of " + std::to_string(kMaxMetadataBytes - 1));
    }
    return file;
  }
  if (file.status().code() != StatusCode::kNotFound) return file.status();
  auto staging = dir->Exists(kStagingMarkerName);
  if (staging.ok() && *staging) {
    return NotFound("'" + path +
                    "' is an incomplete checkpoint (a staging directory that was never committed); "
                    "it can be removed");
  }
  return NotFound("'" + path + "' is not a checkpoint: it has no " + kMetadataFileName);
}

Result<std::unique_ptr<ReadableFile>> OpenDataFileOfSize(Directory* dir, const std::string& name, uint64_t size,
                                                         const std::string& fpath, const std::string& missing) {
  auto opened = dir->OpenFile(name);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) return Corrupt("data file '" + fpath + "' " + missing);
    return opened.status();
  }
  if ((*opened)->size() != size) {
    return Corrupt("data file '" + fpath + "' has " + std::to_string((*opened)->size()) +
                   " bytes but the metadata says " + std::to_string(size) +
                   ((*opened)->size() < size ? " (truncated)" : " (modified)"));
  }
  return opened;
}

Result<std::string> ReadWhole(const ReadableFile& file) {
  std::string bytes(static_cast<size_t>(file.size()), '\0');
  DCKPT_RETURN_IF_ERROR(file.ReadAt(0, bytes.data(), bytes.size()));
  return bytes;
}

Result<BaseCheckpoint> OpenBaseCheckpoint(Storage* storage, const std::string& path) {
  auto dir = storage->OpenDirectory(path);
  if (dir.status().code() == StatusCode::kNotFound) {
    return NotFound("base checkpoint '" + path + "' does not exist (" + dir.status().message() + ")");
  }
  DCKPT_RETURN_IF_ERROR(dir.status());
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file, OpenMetadataFile(dir->get(), path));
  DCKPT_ASSIGN_OR_RETURN(std::string bytes, ReadWhole(*file));
  DCKPT_ASSIGN_OR_RETURN(MetadataView meta, MetadataView::Parse(std::make_shared<const std::string>(std::move(bytes)),
                                                                "base checkpoint '" + path + "'"));
  BaseCheckpoint base{path, std::move(dir).value(), std::move(meta)};
  if (!base.meta.checksum()) {
    return InvalidArgument("base checkpoint '" + path + "' is of format 1.0, whose metadata has no checksum to " +
                           "refer to; save it again (or save without a base)");
  }
  return base;
}

Result<BaseCheckpoint> OpenReferencedBase(Storage* storage, const std::string& path, const MetadataView& meta,
                                          size_t k) {
  const std::string name(meta.base_name(k));
  const std::string where = "checkpoint '" + path + "' refers to base checkpoint '" + name + "'";
  if (name == BaseName(path)) return Corrupt(where + ", which is itself");
  auto base = OpenBaseCheckpoint(storage, SiblingPath(path, name));
  if (!base.ok()) {
    const StatusCode code = base.status().code() == StatusCode::kNotFound ? StatusCode::kCorrupt : base.status().code();
    return Status(code,
                  where + ", which cannot be read (it was removed, moved or damaged): " + base.status().message());
  }
  const uint64_t want_sum = meta.base_metadata_checksum(k), want_size = meta.base_metadata_size(k);
  if (*base->meta.checksum() != want_sum || base->meta.buffer_size() != want_size) {
    return Corrupt(where + ", whose metadata changed since it was referred to (recorded " + Hex(want_sum) + ", " +
                   std::to_string(want_size) + " bytes; found " + Hex(*base->meta.checksum()) + ", " +
                   std::to_string(base->meta.buffer_size()) + " bytes): the base was replaced or overwritten, and " +
                   "the chunks kept there are not the ones this checkpoint saved");
  }
  return base;
}

Result<std::unique_ptr<ReadableFile>> OpenReferencedFile(const std::string& path, const MetadataView& meta,
                                                         uint32_t index, const BaseCheckpoint& base) {
  const std::string_view name = meta.file_name(index);
  const uint64_t size = meta.file_size(index);
  const std::string fpath = base.path + "/" + std::string(name);
  bool listed = false;
  for (size_t i = 0; i < base.meta.num_files() && !listed; ++i) {
    listed = base.meta.file_base(i) == 0 && base.meta.file_name(i) == name && base.meta.file_size(i) == size;
  }
  if (!listed) {
    return Corrupt("checkpoint '" + path + "' refers to data file '" + fpath + "' (" + std::to_string(size) +
                   " bytes), which its base does not list as a file of its own of that size");
  }
  return OpenDataFileOfSize(base.dir.get(), std::string(name), size, fpath,
                            "is missing from the base checkpoint that checkpoint '" + path + "' refers to");
}

Result<std::vector<std::string>> Dependents(Storage* storage, const std::string& path) {
  const std::string own = BaseName(path);
  auto names = storage->ListDir(ParentDir(path));
  if (!names.ok()) {
    if (names.status().code() == StatusCode::kNotFound) return std::vector<std::string>();
    return names.status();
  }
  std::vector<std::string> out;
  for (const std::string& name : *names) {
    if (name == own || !IsValidFileName(name)) continue;
    auto sibling = OpenBaseCheckpoint(storage, SiblingPath(path, name));
    if (!sibling.ok()) continue;  // not a checkpoint (a file, a leftover, a foreign or damaged one)
    for (size_t k = 0; k < sibling->meta.num_bases(); ++k) {
      if (sibling->meta.base_name(k) == own) {
        out.push_back(name);
        break;
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status CheckNoDependents(Storage* storage, const std::string& path, const std::string& what) {
  // Nothing committed there, nothing to break (a save to a new path, the common case, lists no siblings).
  auto committed = storage->Exists(path + "/" + kMetadataFileName);
  if (committed.ok() && !*committed) return OkStatus();
  DCKPT_ASSIGN_OR_RETURN(std::vector<std::string> dependents, Dependents(storage, path));
  if (dependents.empty()) return OkStatus();
  std::string list;
  for (size_t i = 0; i < dependents.size() && i < 10; ++i) list += (i ? ", '" : "'") + dependents[i] + "'";
  if (dependents.size() > 10) list += " and " + std::to_string(dependents.size() - 10) + " more";
  return Status(StatusCode::kState, what + " checkpoint '" + path + "' would break " +
                                        std::to_string(dependents.size()) + " incremental checkpoint(s) that read " +
                                        "its data files: " + list + "; remove them first, or make them " +
                                        "self-contained (distckpt flatten)");
}

}  // namespace distckpt
