// Writes a few valid metadata buffers as the metadata fuzzer's seed corpus: make_seeds <dir>. Each seed is a mode
// byte (see metadata_fuzz.cc) then the file: once with mode 0 (parsed as is) and once with mode 1 (trailer fixed up).
#include <cstdio>
#include <string>

#include "core/format/metadata.h"
#include "core/format/metadata_test_util.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  using namespace distckpt;
  testing_util::RawMetadata future = testing_util::ToRaw(testing_util::ValidRecord());
  future.format_minor = kFormatMinor + 1;
  future.unknown_fields = true;
  const std::string seeds[] = {*EncodeMetadata(testing_util::ValidRecord()), *EncodeMetadata(MetadataRecord()),
                               testing_util::RawEncode(future)};
  int n = 0;
  for (const std::string& file : seeds) {
    for (const char mode : {'\0', '\1'}) {
      const std::string s = mode + file;
      const std::string path = std::string(argv[1]) + "/seed-" + std::to_string(n++) + ".dckpt";
      FILE* f = std::fopen(path.c_str(), "wb");
      if (f == nullptr || std::fwrite(s.data(), 1, s.size(), f) != s.size() || std::fclose(f) != 0) return 1;
    }
  }
  return 0;
}
