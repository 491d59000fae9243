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
  // Format 1.2 and 2.0: chunk hashes on every chunk; references to two sibling checkpoints' files.
  MetadataRecord refs = testing_util::ValidRecord();
  for (EntryRecord& e : refs.entries) {
    for (size_t i = 0; i < e.chunks.size(); ++i) e.chunk_hashes.push_back(ChunkHash{i * 7 + 1, e.name.size()});
  }
  const std::string hashed = *EncodeMetadata(refs);
  refs.bases = {{"step-10", 0x0123456789abcdefull, 4096}, {"step-20", 42, 8192}};
  refs.chain_length = 2;
  refs.files.push_back({refs.files[0].name, refs.files[0].size, 1});
  refs.files.push_back({"data-00007.bin", refs.files[0].size, 2});
  refs.entries[0].chunks[0].file = static_cast<uint32_t>(refs.files.size() - 2);
  refs.entries[1].chunks[0].file = static_cast<uint32_t>(refs.files.size() - 1);
  // Format 3.0: compressed chunks ("big", 3 stored blocks; chunk #1 of "two_big") beside raw ones, with the references.
  MetadataRecord packed = refs;
  testing_util::CompressSomeChunks(&packed);
  const std::string seeds[] = {*EncodeMetadata(testing_util::ValidRecord()),
                               *EncodeMetadata(MetadataRecord()),
                               testing_util::RawEncode(future),
                               hashed,
                               *EncodeMetadata(refs),
                               *EncodeMetadata(packed)};
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
