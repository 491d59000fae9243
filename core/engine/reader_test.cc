// What a reader promises about the files it reads: it reads the checkpoint it opened and nothing else. Files inside a
// checkpoint are opened relative to its directory and never through a link (a link to the checkpoint directory itself
// is fine); an open reader keeps reading the checkpoint it opened after the path is overwritten or removed; a reader
// that opens files on first use fails, and never mixes two checkpoints.
#include "core/engine/reader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/temp_dir.h"
#include "core/base/wire.h"
#include "core/comm/communicator.h"
#include "core/engine/load.h"
#include "core/engine/save.h"
#include "core/storage/storage.h"

namespace distckpt {
namespace {

using testing_util::MakeTempDir;
using testing_util::ReadFileToString;

// A checkpoint of two tensors, saved in two pieces each (so two ranks' worth of chunks in one file), whose values
// are a function of `version`: two versions of one checkpoint are told apart by any element.
std::vector<float> Values(int version, size_t n, int salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(version * 100000 + salt * 1000 + i);
  return v;
}

void SaveVersion(const std::string& path, int version, bool overwrite) {
  std::vector<float> a = Values(version, 4096, 1), b = Values(version, 30 * 100, 2);
  State s;
  ASSERT_TRUE(s.AddTensor("a", DType::kF32, {4096}).ok());
  ASSERT_TRUE(s.AddPiece("a", {0}, {4096}, a.data()).ok());
  ASSERT_TRUE(s.AddTensor("b", DType::kF32, {30, 100}).ok());
  ASSERT_TRUE(s.AddPiece("b", {0, 0}, {30, 100}, b.data()).ok());
  SaveOptions so;
  so.overwrite = overwrite;
  so.checksum_block_size = 4096;
  auto r = Save(path, s, nullptr, so);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

Result<std::vector<float>> ReadA(Reader* r) {
  std::vector<float> out(4096);
  const std::vector<uint64_t> shape{4096};
  Box whole = Box::Whole(shape).value();
  DCKPT_RETURN_IF_ERROR(r->ReadRegion("a", whole, out.data(), out.size() * sizeof(float)));
  return out;
}

Status LoadB(const std::string& path, std::vector<float>* out, bool map_files = true) {
  out->assign(3000, 0.f);
  State s;
  DCKPT_RETURN_IF_ERROR(s.AddTensor("b", DType::kF32, {30, 100}));
  DCKPT_RETURN_IF_ERROR(s.AddPiece("b", {0, 0}, {30, 100}, out->data()));
  ReadOptions ro;
  ro.map_files = map_files;
  return Load(path, s, nullptr, ro).status();
}

class PinnedReaderTest : public ::testing::TestWithParam<std::pair<bool, bool>> {};  // (verify, map_files)

// The defect of issue 10: after an overwrite, an open reader served the new files against the old metadata (false
// corruption with verification on, the new checkpoint's data with it off).
TEST_P(PinnedReaderTest, KeepsReadingTheCheckpointItOpenedAfterAnOverwriteAndARemoval) {
  const auto [verify, map_files] = GetParam();
  const std::string path = MakeTempDir() + "/ckpt";
  SaveVersion(path, 1, false);
  ReadOptions ro;
  ro.verify = verify;
  ro.map_files = map_files;
  auto r = Reader::Open(path, nullptr, ro);
  ASSERT_TRUE(r.ok()) << r.status().ToString();

  SaveVersion(path, 2, /*overwrite=*/true);
  auto got = ReadA(r->get());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, Values(1, 4096, 1));
  EXPECT_TRUE((*r)->VerifyAll(nullptr).ok());
  if (map_files) {
    auto mapped = (*r)->MappedFile(0);
    ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
    const ChunkLocation loc = (*r)->metadata().entry(*(*r)->metadata().Find("a")).chunk(0);
    std::vector<float> viewed(4096);
    std::memcpy(viewed.data(), *mapped + loc.offset, loc.length);
    EXPECT_EQ(viewed, Values(1, 4096, 1));
  } else {
    EXPECT_EQ((*r)->MappedFile(0).status().code(), StatusCode::kUnsupported);
  }

  // A new reader sees the new checkpoint.
  auto fresh = Reader::Open(path, nullptr, ro);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(*ReadA(fresh->get()), Values(2, 4096, 1));

  // The path removed altogether: the open reader still has its files.
  ASSERT_TRUE(DefaultStorage()->RemoveAll(path).ok());
  got = ReadA(r->get());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, Values(1, 4096, 1));
}

INSTANTIATE_TEST_SUITE_P(Modes, PinnedReaderTest,
                         ::testing::Values(std::make_pair(true, true), std::make_pair(true, false),
                                           std::make_pair(false, true), std::make_pair(false, false)),
                         [](const auto& i) {
                           return std::string(i.param.first ? "Verify" : "NoVerify") +
                                  (i.param.second ? "Mapped" : "Pread");
                         });

// A reader that opens files on first use (what a load does) fails once its checkpoint is replaced: its directory's
// files are gone. It never reads the new checkpoint's file of the same name.
TEST(ReaderTest, OnFirstUseAReplacedCheckpointFailsAndIsNeverMixed) {
  const std::string path = MakeTempDir() + "/ckpt";
  SaveVersion(path, 1, false);
  ReadOptions ro;
  ro.verify = false;  // the old defect returned the new data silently when verification was off
  auto r = Reader::Open(path, nullptr, ro, FilePinning::kOnFirstUse);
  ASSERT_TRUE(r.ok());
  SaveVersion(path, 2, /*overwrite=*/true);
  auto got = ReadA(r->get());
  ASSERT_FALSE(got.ok()) << "read the replacement's data through the old metadata";
  EXPECT_EQ(got.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(got.status().message().find("removed or replaced after the checkpoint was opened"), std::string::npos)
      << got.status().ToString();
}

// The second defect of issue 10: a data file that is a link to a file outside the checkpoint was followed. The link
// points at a valid copy, so following it would "work": every path must refuse it, naming the file.
TEST(ReaderTest, ADataFileThatIsALinkIsRefusedOnEveryPath) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/ckpt";
  SaveVersion(path, 1, false);
  const std::string data = path + "/data-00000.bin";
  const std::string outside = dir + "/outside.bin";
  ASSERT_EQ(::rename(data.c_str(), outside.c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), data.c_str()), 0);
  auto expect_refused = [&](const Status& st, const char* what) {
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << what << ": " << st.ToString();
    EXPECT_NE(st.message().find(data + "' is a symbolic link"), std::string::npos) << what << ": " << st.ToString();
  };

  // open: the metadata is fine, so the reader opens; every read of the file fails.
  auto r = Reader::Open(path, nullptr, ReadOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  expect_refused(ReadA(r->get()).status(), "read");
  expect_refused((*r)->VerifyAll(nullptr), "verify");
  expect_refused((*r)->MappedFile(0).status(), "map");
  std::vector<float> b;
  Status loaded = LoadB(path, &b);
  expect_refused(loaded, "load");
  EXPECT_NE(loaded.message().find("entry 'b'"), std::string::npos) << loaded.ToString();
  expect_refused(LoadB(path, &b, /*map_files=*/false), "load without mapping");

  // The metadata file as a link: nothing opens.
  const std::string meta = path + "/metadata.dckpt";
  ASSERT_EQ(::rename(meta.c_str(), (dir + "/outside.dckpt").c_str()), 0);
  ASSERT_EQ(::symlink((dir + "/outside.dckpt").c_str(), meta.c_str()), 0);
  auto none = Reader::Open(path, nullptr, ReadOptions{});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(none.status().message().find(meta + "' is a symbolic link"), std::string::npos) << none.status().ToString();
  EXPECT_EQ(LoadB(path, &b).code(), StatusCode::kCorrupt);
}

// A FIFO or a directory in place of a data file: refused at once, never opened (a FIFO would block the reader).
TEST(ReaderTest, AFifoOrADirectoryInPlaceOfADataFileIsRefusedWithoutBlocking) {
  for (const bool fifo : {true, false}) {
    const std::string path = MakeTempDir() + "/ckpt";
    SaveVersion(path, 1, false);
    const std::string data = path + "/data-00000.bin";
    ASSERT_EQ(::unlink(data.c_str()), 0);
    ASSERT_EQ(fifo ? ::mkfifo(data.c_str(), 0644) : ::mkdir(data.c_str(), 0755), 0);
    std::vector<float> b;
    Status st = LoadB(path, &b);
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
    EXPECT_NE(st.message().find(fifo ? "is a FIFO" : "is a directory"), std::string::npos) << st.ToString();
  }
}

// `latest -> step-100` is how people point at the newest checkpoint: a link to the directory itself is followed.
TEST(ReaderTest, ALinkToTheCheckpointDirectoryItselfWorks) {
  const std::string dir = MakeTempDir();
  SaveVersion(dir + "/step-100", 1, false);
  ASSERT_EQ(::symlink("step-100", (dir + "/latest").c_str()), 0);
  auto r = Reader::Open(dir + "/latest", nullptr, ReadOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*ReadA(r->get()), Values(1, 4096, 1));
  std::vector<float> b;
  ASSERT_TRUE(LoadB(dir + "/latest", &b).ok());
  EXPECT_EQ(b, Values(1, 3000, 2));
}

// Missing files are reported when first needed, naming the file: the metadata and the other files stay usable (a
// tool can still list and inspect a damaged checkpoint).
TEST(ReaderTest, AMissingDataFileFailsOnlyTheReadsThatNeedIt) {
  const std::string path = MakeTempDir() + "/ckpt";
  SaveVersion(path, 1, false);
  ASSERT_EQ(::unlink((path + "/data-00000.bin").c_str()), 0);
  auto r = Reader::Open(path, nullptr, ReadOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->metadata().num_entries(), 2u);
  Status st = ReadA(r->get()).status();
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("data-00000.bin' is missing"), std::string::npos) << st.ToString();
}

TEST(ReaderTest, AMissingCheckpointOrAnUnfinishedSaveIsNotFound) {
  const std::string dir = MakeTempDir();
  auto none = Reader::Open(dir + "/nothing", nullptr, ReadOptions{});
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("does not exist"), std::string::npos) << none.status().ToString();
  ::mkdir((dir + "/half").c_str(), 0755);
  std::ofstream((dir + "/half/STAGING").c_str()) << "x";
  auto half = Reader::Open(dir + "/half", nullptr, ReadOptions{});
  EXPECT_EQ(half.status().code(), StatusCode::kNotFound);
  EXPECT_NE(half.status().message().find("incomplete checkpoint"), std::string::npos) << half.status().ToString();
}

// Rank 1 of a two-rank open, whose broadcast delivers what rank 0 read: `bytes` (a metadata file), in
// Reader::Open's broadcast message.
class RankOneOfTwo final : public Communicator {
 public:
  explicit RankOneOfTwo(std::string bytes) : bytes_(std::move(bytes)) {}
  int rank() const override { return 1; }
  int size() const override { return 2; }
  std::string name() const override { return "test"; }
  Status AllGather(const std::string&, std::vector<std::string>*, std::chrono::milliseconds) override {
    return Internal("not used");
  }
  Status Gather(const std::string&, int, std::vector<std::string>*, std::chrono::milliseconds) override {
    return Internal("not used");
  }
  Status Broadcast(std::string* data, int, std::chrono::milliseconds) override {
    WireWriter w;
    PutStatus(&w, OkStatus());
    w.U8(0);  // a distckpt checkpoint, not a foreign one's description
    w.Str(bytes_);
    *data = w.Take();
    return OkStatus();
  }
  Status Barrier(std::chrono::milliseconds) override { return OkStatus(); }

 private:
  std::string bytes_;
};

// A checkpoint replaced between rank 0's read of the metadata and this rank's open: this rank would pin the new
// checkpoint's files under the old metadata. It notices, and says so.
TEST(ReaderTest, ACollectiveOpenNoticesACheckpointReplacedBetweenRanks) {
  const std::string path = MakeTempDir() + "/ckpt";
  SaveVersion(path, 1, false);
  const std::string rank0_read = ReadFileToString(path + "/metadata.dckpt");
  {
    RankOneOfTwo comm(rank0_read);
    auto same = Reader::Open(path, &comm, ReadOptions{});
    ASSERT_TRUE(same.ok()) << same.status().ToString();
    EXPECT_EQ(*ReadA(same->get()), Values(1, 4096, 1));
  }
  SaveVersion(path, 2, /*overwrite=*/true);
  RankOneOfTwo comm(rank0_read);
  auto changed = Reader::Open(path, &comm, ReadOptions{});
  ASSERT_FALSE(changed.ok());
  EXPECT_EQ(changed.status().code(), StatusCode::kState);
  EXPECT_NE(changed.status().message().find("changed while it was being opened"), std::string::npos)
      << changed.status().ToString();
}

// Metadata damage names the metadata file (format 1.1's checksum).
TEST(ReaderTest, DamagedMetadataNamesTheFile) {
  const std::string path = MakeTempDir() + "/ckpt";
  SaveVersion(path, 1, false);
  const std::string meta = path + "/metadata.dckpt";
  std::string bytes = ReadFileToString(meta);
  bytes[bytes.size() / 3] ^= 0x01;
  std::ofstream(meta, std::ios::binary | std::ios::trunc) << bytes;
  for (const bool map_files : {true, false}) {
    ReadOptions ro;
    ro.map_files = map_files;
    auto r = Reader::Open(path, nullptr, ro);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(r.status().message().find(meta + ": metadata checksum mismatch"), std::string::npos)
        << r.status().ToString();
  }
}

}  // namespace
}  // namespace distckpt

namespace distckpt {
namespace {

// A destination outside the tensor: the error names the checkpoint once and the entry once (it read "entry 'b': entry
// 'b': destination #0 ..." before).
TEST(ReaderTest, AnOutOfRangeDestinationNamesTheCheckpointAndTheEntryOnce) {
  const std::string path = MakeTempDir() + "/ckpt";
  SaveVersion(path, 1, false);
  std::vector<float> out(100);
  auto r = Reader::Open(path, nullptr, ReadOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<uint64_t> offsets{30, 0}, lengths{1, 100};
  Box outside = Box::Make(offsets, lengths).value();
  Status st = (*r)->ReadRegion("b", outside, out.data(), out.size() * sizeof(float));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  const std::string& m = st.message();
  EXPECT_NE(m.find("checkpoint '" + path + "'"), std::string::npos) << m;
  const size_t first = m.find("entry 'b'");
  ASSERT_NE(first, std::string::npos) << m;
  EXPECT_EQ(m.find("entry 'b'", first + 1), std::string::npos) << "the entry is named twice: " << m;
}

}  // namespace
}  // namespace distckpt

namespace distckpt {
namespace {

// A reader's read options carry a progress callback: each region read reports its bytes through it (it was never
// called for a reader from dckpt_reader_open), and a non-zero return stops the read.
TEST(ReaderTest, ARegionReadReportsProgressThroughTheReadersOptions) {
  const std::string path = MakeTempDir() + "/ckpt";
  SaveVersion(path, 1, false);
  uint64_t last_done = 0, last_total = 0;
  int calls = 0;
  bool stop = false;
  ReadOptions ro;
  ro.progress = [&](uint64_t done, uint64_t total) {
    ++calls;
    last_done = done;
    last_total = total;
    return stop ? 1 : 0;
  };
  auto r = Reader::Open(path, nullptr, ro);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto a = ReadA(r->get());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_GT(calls, 0);
  EXPECT_EQ(last_total, 4096 * sizeof(float));
  EXPECT_EQ(last_done, last_total);
  stop = true;
  EXPECT_FALSE(ReadA(r->get()).ok()) << "a progress callback that returns non-zero stops the read";
}

}  // namespace
}  // namespace distckpt
