#include "core/foreign/foreign.h"

#include <algorithm>

#include "core/foreign/safetensors.h"

namespace distckpt {

Result<std::optional<MetadataRecord>> DescribeForeignDirectory(Storage* storage, Directory* dir,
                                                               const std::string& path) {
  DCKPT_ASSIGN_OR_RETURN(std::vector<std::string> listing, storage->ListDir(path));
  DCKPT_ASSIGN_OR_RETURN(SafetensorsLayout layout, FindSafetensorsLayout(dir, path, listing));
  if (layout.files.empty()) return std::optional<MetadataRecord>();
  DCKPT_ASSIGN_OR_RETURN(MetadataRecord record, DescribeSafetensors(dir, layout, path));
  return std::optional<MetadataRecord>(std::move(record));
}

Result<MetadataRecord> DescribeSafetensorsFile(Directory* dir, const std::string& name, const std::string& path) {
  SafetensorsLayout layout;
  layout.files = {name};
  return DescribeSafetensors(dir, layout, path);
}

bool IsSafetensorsFilePath(const std::string& path) {
  static const std::string kSuffix = ".safetensors";
  return path.size() > kSuffix.size() && path.compare(path.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

}  // namespace distckpt
