#include "core/foreign/foreign.h"

#include <algorithm>

#include "core/foreign/dcp.h"
#include "core/foreign/safetensors.h"

namespace distckpt {

Result<std::optional<MetadataRecord>> DescribeForeignDirectory(Storage* storage, Directory* dir,
                                                               const std::string& dir_path, const std::string& path) {
  DCKPT_ASSIGN_OR_RETURN(std::vector<std::string> listing, storage->ListDir(dir_path));
  if (std::find(listing.begin(), listing.end(), kDcpMetadataFileName) != listing.end()) {
    DCKPT_ASSIGN_OR_RETURN(MetadataRecord record, DescribeTorchDcp(storage, dir_path));
    return std::optional<MetadataRecord>(std::move(record));
  }
  DCKPT_ASSIGN_OR_RETURN(SafetensorsLayout layout, FindSafetensorsLayout(dir, dir_path, listing));
  if (layout.files.empty()) return std::optional<MetadataRecord>();
  DCKPT_ASSIGN_OR_RETURN(MetadataRecord record, DescribeSafetensors(dir, layout, path));
  return std::optional<MetadataRecord>(std::move(record));
}

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<MetadataRecord> DescribeSafetensorsFile(Directory* dir, const std::string& dir_path, const std::string& name,
                                               const std::string& path) {
  SafetensorsLayout layout;
  if (EndsWith(name, ".safetensors.index.json")) {
    DCKPT_ASSIGN_OR_RETURN(layout, ReadSafetensorsIndex(dir, dir_path, name));
  } else {
    layout.files = {name};
  }
  return DescribeSafetensors(dir, layout, path);
}

std::string_view ForeignFormatVersion(const MetadataView& metadata) {
  if (metadata.source() != kDcpSource) return {};
  for (size_t i = 0; i < metadata.num_user(); ++i) {
    if (metadata.user(i).first == kDcpVersionKey) return metadata.user(i).second;
  }
  return {};
}

bool IsSafetensorsFilePath(const std::string& path) {
  return EndsWith(path, ".safetensors") || EndsWith(path, ".safetensors.index.json");
}

}  // namespace distckpt
