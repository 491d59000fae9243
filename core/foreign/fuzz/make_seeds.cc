// Writes the seeds of the dcp_pickle fuzz target (dcp_pickle_fuzz.cc) from the real DCP fixtures:
//   dcp_make_seeds <tests/fixtures/dcp> <out dir>
// For each checkpoint: its .metadata as a pickle (mode 0) and as metadata described against each set of data files
// (mode 1), every tensor item's torch.save archive (mode 2) and its data.pkl (mode 0).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "core/foreign/dcp.h"

namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int written = 0;

void Write(const std::string& dir, const std::string& name, char mode, const std::string& bytes) {
  std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
  out.put(mode);
  out << bytes;
  ++written;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <tests/fixtures/dcp> <out dir>\n", argv[0]);
    return 2;
  }
  const std::string fixtures = argv[1], out = argv[2];
  // The data file sets of dcp_pickle_fuzz.cc's Fixtures(), in its order.
  const char* const sets[] = {"fsdp2_3ranks", "single_dtensor", "fsdp2_2ranks", "dtensor_2ranks"};
  for (const char* ck :
       {"fsdp2_3ranks", "single_dtensor", "fsdp2_2ranks", "dtensor_2ranks", "transposed", "unsupported_dtype"}) {
    const std::string dir = fixtures + "/" + ck;
    const std::string meta = Slurp(dir + "/.metadata");
    if (meta.empty()) {
      std::fprintf(stderr, "dcp_make_seeds: no %s/.metadata\n", dir.c_str());
      return 1;
    }
    Write(out, std::string("pickle-") + ck, 0, meta);
    for (char set = 0; set < 4; ++set) {
      if (std::string(sets[static_cast<int>(set)]) == ck || set == 0) {
        Write(out, std::string("meta-") + ck + "-" + std::to_string(set), 1, std::string(1, set) + meta);
      }
    }
    distckpt::Result<distckpt::DcpMetadata> md = distckpt::ParseDcpMetadata(meta, dir);
    if (!md.ok()) {
      std::fprintf(stderr, "dcp_make_seeds: %s\n", md.status().ToString().c_str());
      return 1;
    }
    for (size_t i = 0; i < md->items.size(); ++i) {
      const distckpt::DcpItem& item = md->items[i];
      const std::string file = Slurp(dir + "/" + item.file);
      if (item.offset > file.size() || item.length > file.size() - item.offset) continue;
      const std::string archive = file.substr(item.offset, item.length);
      Write(out, std::string("item-") + ck + "-" + std::to_string(i), 2, archive);
      // data.pkl: the first record's data, up to its data descriptor.
      if (archive.size() > 30 && archive.compare(0, 4, "PK\x03\x04") == 0) {
        const size_t start = 30 + static_cast<unsigned char>(archive[26]) +
                             256 * static_cast<unsigned char>(archive[27]) + static_cast<unsigned char>(archive[28]) +
                             256 * static_cast<unsigned char>(archive[29]);
        const size_t end = archive.find("PK\x07\x08", start);
        if (start < archive.size() && end != std::string::npos) {
          Write(out, std::string("datapkl-") + ck + "-" + std::to_string(i), 0, archive.substr(start, end - start));
        }
      }
    }
  }
  std::printf("dcp_make_seeds: %d seeds in %s\n", written, out.c_str());
  return 0;
}
