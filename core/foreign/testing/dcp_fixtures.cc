#include "core/foreign/testing/dcp_fixtures.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/base/testing/read_file.h"
#include "core/base/testing/temp_dir.h"

namespace distckpt {
namespace testing_util {

std::string DcpFixtureDir(const std::string& name) { return "tests/fixtures/dcp/" + name; }

std::string RealCopyOfDcpFixture(const std::string& name) {
  const std::string copy = MakeTempDir(name + "-");
  for (const auto& e : std::filesystem::directory_iterator(DcpFixtureDir(name))) {
    const std::string file = e.path().filename().string();
    std::ifstream in(e.path(), std::ios::binary);
    std::ofstream out(copy + "/" + file, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
  }
  return copy;
}

std::vector<std::vector<std::string>> DcpExpectedRows() {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(ReadFileToString(DcpFixtureDir("expected.tsv")));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cols;
    size_t start = 0;
    while (true) {
      const size_t tab = line.find('\t', start);
      cols.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    rows.push_back(std::move(cols));
  }
  return rows;
}

Status SparseFile::ReadAt(uint64_t offset, void* data, size_t size) const {
  if (offset > size_ || size > size_ - offset) return Corrupt("file " + path_ + " is truncated: read past its end");
  bytes_read_ += size;
  auto* out = static_cast<char*>(data);
  std::memset(out, 0, size);
  // The head, where the range meets it.
  if (offset < head_.size()) {
    const uint64_t n = std::min<uint64_t>(size, head_.size() - offset);
    std::memcpy(out, head_.data() + offset, n);
  }
  const uint64_t tail_start = size_ - tail_.size();
  if (offset + size > tail_start) {
    const uint64_t from = std::max<uint64_t>(offset, tail_start);
    std::memcpy(out + (from - offset), tail_.data() + (from - tail_start), offset + size - from);
  }
  return OkStatus();
}

std::unique_ptr<SparseFile> OpenZip64Fixture() {
  for (const auto& row : DcpExpectedRows()) {
    if (row[0] != "zip64") continue;
    const std::string dir = DcpFixtureDir(row[1]) + "/";
    return std::make_unique<SparseFile>(dir + row[2], ReadFileToString(dir + row[2] + ".head"),
                                        ReadFileToString(dir + row[2] + ".tail"), std::stoull(row[3]));
  }
  return nullptr;
}

}  // namespace testing_util
}  // namespace distckpt
