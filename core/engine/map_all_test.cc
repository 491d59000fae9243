// Reader::MapAll, the whole-checkpoint zero-copy load: every byte it hands out through the mapping is the saved byte,
// every damaged byte inside a chunk is caught and named (entry, chunk, file), and the calls it cannot serve fail
// cleanly instead of mapping nothing or verifying nothing.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/temp_dir.h"
#include "core/engine/engine_test_util.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"

namespace distckpt {
namespace {

using testing_util::MakeTempDir;
using testing_util::ReadFileToString;
using testing_util::WriteAll;

struct Saved {
  std::string path;
  std::vector<std::vector<uint8_t>> data;  // by tensor, in the order of kNames
};

const char* const kNames[] = {"a.weight", "b.bias", "c.big"};

// Three tensors of distinct values: one of several checksum blocks saved in two pieces (two chunks), one smaller
// than a block, one of several blocks ending in a partial block. Block size 4 KiB.
Saved SaveModel(const std::string& dir) {
  Saved s{dir + "/ckpt", {}};
  const size_t sizes[] = {3 * 4096 * 2, 1000, 5 * 4096 + 123};
  for (size_t t = 0; t < 3; ++t) {
    std::vector<uint8_t> v(sizes[t]);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 131 + t * 17 + i / 4096) & 0xff);
    s.data.push_back(std::move(v));
  }
  State st;
  EXPECT_TRUE(st.AddTensor(kNames[0], DType::kU8, {2, 3 * 4096}).ok());
  EXPECT_TRUE(st.AddPiece(kNames[0], {0, 0}, {1, 3 * 4096}, s.data[0].data()).ok());
  EXPECT_TRUE(st.AddPiece(kNames[0], {1, 0}, {1, 3 * 4096}, s.data[0].data() + 3 * 4096).ok());
  EXPECT_TRUE(st.AddTensor(kNames[1], DType::kU8, {1000}).ok());
  EXPECT_TRUE(st.AddPiece(kNames[1], {0}, {1000}, s.data[1].data()).ok());
  EXPECT_TRUE(st.AddTensor(kNames[2], DType::kU8, {5 * 4096 + 123}).ok());
  EXPECT_TRUE(st.AddPiece(kNames[2], {0}, {5 * 4096 + 123}, s.data[2].data()).ok());
  SaveOptions so;
  so.checksum_block_size = 4096;
  auto r = Save(s.path, st, nullptr, so);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return s;
}

std::unique_ptr<Reader> OpenOrDie(const std::string& path, ReadOptions o = ReadOptions()) {
  auto r = Reader::Open(path, nullptr, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

// The bytes of entry `name` as the mapping shows them, chunk by chunk in chunk order.
std::vector<uint8_t> MappedBytes(Reader* r, const std::string& name) {
  std::vector<uint8_t> out;
  const size_t e = *r->metadata().Find(name);
  const EntryView view = r->metadata().entry(e);
  for (size_t c = 0; c < view.num_chunks; ++c) {
    const ChunkLocation loc = view.chunk(c);
    auto map = r->MappedFile(loc.file);
    EXPECT_TRUE(map.ok()) << map.status().ToString();
    if (!map.ok()) return {};
    out.insert(out.end(), *map + loc.offset, *map + loc.offset + loc.length);
  }
  return out;
}

TEST(MapAllTest, MapsVerifiesAndHandsOutTheSavedBytesAlreadyResident) {
  const std::string dir = MakeTempDir();
  Saved s = SaveModel(dir);
  auto r = OpenOrDie(s.path);
  ASSERT_NE(r, nullptr);
  uint64_t last_done = 0, last_total = 0, calls = 0;
  Status st = r->MapAll({}, [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
    ++calls;
    return 0;
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  uint64_t total = 0;
  for (const auto& d : s.data) total += d.size();
  EXPECT_EQ(last_done, total);
  EXPECT_EQ(last_total, total);
  EXPECT_GE(calls, 4u);  // one per chunk at least
  const IoStats io = r->io_stats();
  EXPECT_EQ(io.bytes_mapped, total);
  EXPECT_EQ(io.bytes_verified, total);
  EXPECT_EQ(io.bytes_read, 0u);  // nothing copied
  for (size_t t = 0; t < 3; ++t) EXPECT_EQ(MappedBytes(r.get(), kNames[t]), s.data[t]) << kNames[t];

  // Resident and mapped: mincore sees every page of the data file's mapping in memory.
  const char* map = *r->MappedFile(0);
  const uint64_t size = r->metadata().file_size(0);
  std::vector<unsigned char> vec((size + 4095) / 4096);
  ASSERT_EQ(::mincore(const_cast<char*>(map), size, vec.data()), 0);
  for (unsigned char v : vec) EXPECT_EQ(v & 1, 1);
}

TEST(MapAllTest, EveryDamagedByteInsideAChunkIsCaughtAndNamedAndNoOtherByteMatters) {
  const std::string dir = MakeTempDir();
  Saved s = SaveModel(dir);
  const std::string file = s.path + "/data-00000.bin";
  const std::string original = ReadFileToString(file);
  // Which entry and chunk owns each byte of the data file (or none: padding between chunks).
  std::vector<std::pair<int, int>> owner(original.size(), {-1, -1});
  {
    auto r = OpenOrDie(s.path);
    ASSERT_NE(r, nullptr);
    ASSERT_EQ(r->metadata().num_files(), 1u);
    for (size_t e = 0; e < r->metadata().num_entries(); ++e) {
      const EntryView v = r->metadata().entry(e);
      for (size_t c = 0; c < v.num_chunks; ++c) {
        const ChunkLocation loc = v.chunk(c);
        for (uint64_t b = loc.offset; b < loc.offset + loc.length; ++b) owner[b] = {static_cast<int>(e), int(c)};
      }
    }
  }
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  size_t caught = 0, harmless = 0;
  for (size_t at = 0; at < original.size(); ++at) {
    const char flipped = static_cast<char>(original[at] ^ 0x5a);
    ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(at)), 1);
    auto r = OpenOrDie(s.path);
    ASSERT_NE(r, nullptr);
    Status st = r->MapAll({}, nullptr);
    if (owner[at].first >= 0) {
      const EntryView v = r->metadata().entry(owner[at].first);
      ASSERT_EQ(st.code(), StatusCode::kCorrupt) << "byte " << at << ": " << st.ToString();
      const std::string msg = st.ToString();
      EXPECT_NE(msg.find("entry '" + std::string(v.name) + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("chunk #" + std::to_string(owner[at].second)), std::string::npos) << msg;
      EXPECT_NE(msg.find("data-00000.bin"), std::string::npos) << msg;
      EXPECT_NE(msg.find(s.path), std::string::npos) << msg;
      ++caught;
    } else {
      // Padding: no entry reads it, so the load succeeds and every entry still shows its saved bytes.
      ASSERT_TRUE(st.ok()) << "byte " << at << ": " << st.ToString();
      for (size_t t = 0; t < 3; ++t) ASSERT_EQ(MappedBytes(r.get(), kNames[t]), s.data[t]);
      ++harmless;
    }
    ASSERT_EQ(::pwrite(fd, original.data() + at, 1, static_cast<off_t>(at)), 1);
  }
  ::close(fd);
  uint64_t total = 0;
  for (const auto& d : s.data) total += d.size();
  EXPECT_EQ(caught, total);
  EXPECT_EQ(caught + harmless, original.size());
}

TEST(MapAllTest, OnlyTheListedEntriesAreLoaded) {
  const std::string dir = MakeTempDir();
  Saved s = SaveModel(dir);
  // Damage c.big: a load of a.weight and b.bias alone does not touch it.
  auto probe = OpenOrDie(s.path);
  ASSERT_NE(probe, nullptr);
  const size_t c = *probe->metadata().Find("c.big");
  const ChunkLocation loc = probe->metadata().entry(c).chunk(0);
  probe.reset();
  std::string bytes = ReadFileToString(s.path + "/data-00000.bin");
  bytes[loc.offset + 7] ^= 1;
  WriteAll(s.path + "/data-00000.bin", bytes);

  auto r = OpenOrDie(s.path);
  ASSERT_NE(r, nullptr);
  const size_t a = *r->metadata().Find("a.weight"), b = *r->metadata().Find("b.bias");
  Status st = r->MapAll({a, b}, nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(r->io_stats().bytes_mapped, s.data[0].size() + s.data[1].size());
  EXPECT_EQ(MappedBytes(r.get(), "a.weight"), s.data[0]);
  st = r->MapAll({c}, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  EXPECT_NE(st.ToString().find("entry 'c.big'"), std::string::npos) << st.ToString();
  st = r->MapAll({99}, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.ToString().find("no entry #99"), std::string::npos) << st.ToString();
}

TEST(MapAllTest, WithoutMappingsItRefusesInsteadOfLoadingNothing) {
  const std::string dir = MakeTempDir();
  Saved s = SaveModel(dir);
  ReadOptions o;
  o.map_files = false;
  auto r = OpenOrDie(s.path, o);
  ASSERT_NE(r, nullptr);
  Status st = r->MapAll({}, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.ToString();
  EXPECT_NE(st.ToString().find("map_files off"), std::string::npos) << st.ToString();
}

TEST(MapAllTest, ProgressGrowsCallAfterCallWhicheverThreadReports) {
  const std::string dir = MakeTempDir();
  std::vector<std::vector<uint8_t>> data(200, std::vector<uint8_t>(8192));
  State st;
  for (size_t t = 0; t < data.size(); ++t) {
    for (size_t i = 0; i < data[t].size(); ++i) data[t][i] = static_cast<uint8_t>(t * 7 + i);
    const std::string name = "t" + std::to_string(t);
    ASSERT_TRUE(st.AddTensor(name, DType::kU8, {8192}).ok());
    ASSERT_TRUE(st.AddPiece(name, {0}, {8192}, data[t].data()).ok());
  }
  SaveOptions so;
  so.checksum_block_size = 4096;
  ASSERT_TRUE(Save(dir + "/ckpt", st, nullptr, so).ok());
  ReadOptions o;
  o.io_threads = 8;
  for (int round = 0; round < 20; ++round) {
    auto r = OpenOrDie(dir + "/ckpt", o);
    ASSERT_NE(r, nullptr);
    std::vector<uint64_t> seen;
    Status s = r->MapAll({}, [&](uint64_t done, uint64_t) {
      seen.push_back(done);  // calls are serialised: no lock needed here
      return 0;
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(seen.size(), data.size());
    for (size_t i = 1; i < seen.size(); ++i) ASSERT_LT(seen[i - 1], seen[i]) << "call " << i;
    ASSERT_EQ(seen.back(), data.size() * 8192u);
  }
}

TEST(MapAllTest, TheProgressCallbackCanStopIt) {
  const std::string dir = MakeTempDir();
  Saved s = SaveModel(dir);
  auto r = OpenOrDie(s.path);
  ASSERT_NE(r, nullptr);
  Status st = r->MapAll({}, [](uint64_t, uint64_t) { return 1; });
  EXPECT_EQ(st.code(), StatusCode::kUser) << st.ToString();
}

TEST(MapAllTest, ATruncatedOrMissingDataFileIsNamed) {
  const std::string dir = MakeTempDir();
  Saved s = SaveModel(dir);
  const std::string file = s.path + "/data-00000.bin";
  const std::string bytes = ReadFileToString(file);
  WriteAll(file, bytes.substr(0, bytes.size() / 2));
  auto r = OpenOrDie(s.path);  // the open reads only the metadata; the data file's size is checked when it is used
  ASSERT_NE(r, nullptr);
  Status st = r->MapAll({}, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  EXPECT_NE(st.ToString().find("data-00000.bin"), std::string::npos) << st.ToString();
  EXPECT_NE(st.ToString().find("truncated"), std::string::npos) << st.ToString();
  ASSERT_EQ(::unlink(file.c_str()), 0);
  r = OpenOrDie(s.path);
  ASSERT_NE(r, nullptr);
  st = r->MapAll({}, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  EXPECT_NE(st.ToString().find("missing"), std::string::npos) << st.ToString();
}

TEST(MapAllTest, WithVerificationOffItStillMapsEverything) {
  const std::string dir = MakeTempDir();
  Saved s = SaveModel(dir);
  ReadOptions o;
  o.verify = false;
  auto r = OpenOrDie(s.path, o);
  ASSERT_NE(r, nullptr);
  Status st = r->MapAll({}, nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(r->io_stats().bytes_verified, 0u);
  for (size_t t = 0; t < 3; ++t) EXPECT_EQ(MappedBytes(r.get(), kNames[t]), s.data[t]);
}

}  // namespace
}  // namespace distckpt
