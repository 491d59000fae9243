#include "core/storage/storage_conformance.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <utility>

namespace distckpt {

void StorageConformanceTest::SetUp() {
  storage_ = GetParam().make_storage();
  ASSERT_NE(storage_, nullptr);
  root_ = GetParam().make_root(storage_.get());
  ASSERT_FALSE(root_.empty());
}

std::string StorageConformanceTestName(const ::testing::TestParamInfo<StorageConformanceParams>& info) {
  return info.param.name;
}

std::map<std::string, std::string> SnapshotTree(Storage* storage, const std::string& dir) {
  std::map<std::string, std::string> out;
  std::vector<std::string> pending = {""};
  while (!pending.empty()) {
    const std::string rel = pending.back();
    pending.pop_back();
    auto names = storage->ListDir(rel.empty() ? dir : dir + "/" + rel);
    if (!names.ok()) {
      out["<error>" + rel] = names.status().ToString();
      continue;
    }
    for (const std::string& name : *names) {
      const std::string child_rel = rel.empty() ? name : rel + "/" + name;
      const std::string child = dir + "/" + child_rel;
      auto is_dir = storage->IsDirectory(child);
      if (is_dir.ok() && *is_dir) {
        out[child_rel + "/"] = "";
        pending.push_back(child_rel);
      } else {
        auto bytes = storage->ReadFile(child, uint64_t{1} << 30);
        out[child_rel] = bytes.ok() ? *bytes : "<error>" + bytes.status().ToString();
      }
    }
  }
  return out;
}

namespace {

std::string RandomBytes(std::mt19937_64* rng, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((*rng)() & 0xff);
  return s;
}

std::string Basename(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// Writes a small committed checkpoint at `final_path` holding `files` (name -> bytes).
Status SaveCheckpoint(Storage* storage, const std::string& final_path, const std::map<std::string, std::string>& files,
                      bool overwrite) {
  auto staged = StagedCheckpoint::Create(storage, final_path, NewNonce(), overwrite);
  if (!staged.ok()) return staged.status();
  for (const auto& kv : files) {
    Status st = storage->WriteFileDurably(staged->StagingFile(kv.first), kv.second);
    if (!st.ok()) {
      (void)staged->Abort();
      return st;
    }
  }
  return staged->Commit();
}

// Forwards to a real backend, failing the Nth Rename (1-based; 0: none) with an I/O error, and making Exchange fail
// or be unsupported: the commit's error paths, and its fallback where a filesystem cannot exchange.
class FaultyCommitStorage final : public Storage {
 public:
  enum class ExchangeMode { kPass, kUnsupported, kFail };
  FaultyCommitStorage(Storage* base, int fail_rename_number, ExchangeMode exchange = ExchangeMode::kPass)
      : base_(base), fail_at_(fail_rename_number), exchange_(exchange) {}
  std::string name() const override { return base_->name() + "+faulty-commit"; }
  Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& p) override { return base_->CreateFile(p); }
  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& p) override { return base_->OpenFile(p); }
  Result<std::string> ReadFile(const std::string& p, uint64_t max) override { return base_->ReadFile(p, max); }
  Status WriteFileDurably(const std::string& p, const std::string& d) override { return base_->WriteFileDurably(p, d); }
  Result<uint64_t> FileSize(const std::string& p) override { return base_->FileSize(p); }
  Result<bool> Exists(const std::string& p) override { return base_->Exists(p); }
  Result<bool> IsDirectory(const std::string& p) override { return base_->IsDirectory(p); }
  Status CreateDir(const std::string& p) override { return base_->CreateDir(p); }
  Status SyncDir(const std::string& p) override { return base_->SyncDir(p); }
  Status Rename(const std::string& from, const std::string& to) override {
    if (++renames_ == fail_at_) return IoError("injected failure renaming '" + from + "' to '" + to + "'");
    return base_->Rename(from, to);
  }
  Status RemoveAll(const std::string& p) override { return base_->RemoveAll(p); }
  Status RemoveEmptyDir(const std::string& p) override { return base_->RemoveEmptyDir(p); }
  Result<std::vector<std::string>> ListDir(const std::string& p) override { return base_->ListDir(p); }
  Result<std::unique_ptr<Directory>> OpenDirectory(const std::string& p) override { return base_->OpenDirectory(p); }
  Result<std::string> Identity(const std::string& p) override { return base_->Identity(p); }
  Status Exchange(const std::string& a, const std::string& b) override {
    if (exchange_ == ExchangeMode::kUnsupported) return Status(StatusCode::kUnsupported, "no exchange here");
    if (exchange_ == ExchangeMode::kFail) return IoError("injected failure exchanging '" + a + "' and '" + b + "'");
    return base_->Exchange(a, b);
  }
  Result<std::unique_ptr<DirectoryLock>> LockDirectory(const std::string& d, std::chrono::milliseconds t) override {
    return base_->LockDirectory(d, t);
  }

 private:
  Storage* base_;
  int fail_at_;
  ExchangeMode exchange_;
  int renames_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Files

TEST_P(StorageConformanceTest, ConcurrentWritesAndReadsAtRandomOffsetsRoundTrip) {
  const uint64_t seed = 0x5eed0001;
  std::mt19937_64 rng(seed);
  constexpr size_t kTotal = (3u << 20) + 12345;  // not a multiple of anything
  const std::string expected = RandomBytes(&rng, kTotal);
  // Disjoint pieces of random length, shuffled so every thread writes out of order.
  std::vector<std::pair<size_t, size_t>> pieces;
  for (size_t off = 0; off < kTotal;) {
    const size_t len = std::min<size_t>(kTotal - off, 1 + rng() % 70000);
    pieces.emplace_back(off, len);
    off += len;
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);

  const std::string path = Path("data");
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, storage()->CreateFile(path));
  EXPECT_EQ(file->path(), path);
  DCKPT_ASSERT_OK(file->Preallocate(kTotal));
  constexpr int kThreads = 4;
  std::vector<Status> write_status(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < pieces.size() && write_status[t].ok(); i += kThreads) {
        write_status[t] = file->WriteAt(pieces[i].first, expected.data() + pieces[i].first, pieces[i].second);
      }
    });
  }
  for (auto& th : threads) th.join();
  threads.clear();
  for (const Status& st : write_status) DCKPT_ASSERT_OK(st);
  DCKPT_ASSERT_OK(file->Truncate(kTotal));
  DCKPT_ASSERT_OK(file->Sync());
  DCKPT_ASSERT_OK(file->Close());

  DCKPT_ASSERT_OK_AND_ASSIGN(uint64_t size, storage()->FileSize(path));
  EXPECT_EQ(size, kTotal);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string whole, storage()->ReadFile(path, kTotal));
  EXPECT_TRUE(whole == expected) << "ReadFile differs from what was written (seed " << seed << ")";

  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> reader, storage()->OpenFile(path));
  EXPECT_EQ(reader->size(), kTotal);
  EXPECT_EQ(reader->path(), path);
  std::atomic<int> mismatches{0};
  std::vector<Status> read_status(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 local(seed + 1 + t);
      std::string buf;
      for (int i = 0; i < 200 && read_status[t].ok(); ++i) {
        const size_t off = local() % kTotal;
        const size_t len = std::min<size_t>(kTotal - off, local() % 100000);
        buf.assign(len, '\0');
        read_status[t] = reader->ReadAt(off, &buf[0], len);
        if (read_status[t].ok() && expected.compare(off, len, buf) != 0) mismatches.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const Status& st : read_status) DCKPT_EXPECT_OK(st);
  EXPECT_EQ(mismatches.load(), 0) << "seed " << seed;
}

TEST_P(StorageConformanceTest, WritesPastTheEndLeaveZeroFilledHoles) {
  const std::string path = Path("sparse");
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, storage()->CreateFile(path));
  DCKPT_ASSERT_OK(file->WriteAt(1 << 20, "tail", 4));
  DCKPT_ASSERT_OK(file->WriteAt(0, "", 0));
  DCKPT_ASSERT_OK(file->Close());
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string bytes, storage()->ReadFile(path, 2 << 20));
  ASSERT_EQ(bytes.size(), (1u << 20) + 4);
  EXPECT_EQ(bytes.substr(1 << 20), "tail");
  EXPECT_EQ(bytes.find_first_not_of('\0'), size_t{1} << 20);
}

TEST_P(StorageConformanceTest, PreallocateThenTruncateGivesTheExactSize) {
  const std::string path = Path("sized");
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, storage()->CreateFile(path));
  DCKPT_ASSERT_OK(file->Preallocate(1 << 20));
  DCKPT_ASSERT_OK(file->Preallocate(0));
  DCKPT_ASSERT_OK(file->WriteAt(0, "0123456789", 10));
  DCKPT_ASSERT_OK(file->Truncate(10));
  DCKPT_ASSERT_OK(file->Close());
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string bytes, storage()->ReadFile(path, 100));
  EXPECT_EQ(bytes, "0123456789");
}

TEST_P(StorageConformanceTest, CreateFileTruncatesAnExistingFile) {
  const std::string path = Path("f");
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(path, std::string(100, 'x')));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, storage()->CreateFile(path));
  DCKPT_ASSERT_OK(file->WriteAt(0, "ab", 2));
  DCKPT_ASSERT_OK(file->Close());
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string bytes, storage()->ReadFile(path, 100));
  EXPECT_EQ(bytes, "ab");
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(path, "c"));
  DCKPT_ASSERT_OK_AND_ASSIGN(bytes, storage()->ReadFile(path, 100));
  EXPECT_EQ(bytes, "c");
}

TEST_P(StorageConformanceTest, AClosedFileRefusesFurtherCalls) {
  const std::string path = Path("closed");
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, storage()->CreateFile(path));
  DCKPT_ASSERT_OK(file->Close());
  EXPECT_TRUE(StatusIs(file->WriteAt(0, "x", 1), StatusCode::kState, {path}));
  EXPECT_TRUE(StatusIs(file->Preallocate(10), StatusCode::kState, {path}));
  EXPECT_TRUE(StatusIs(file->Truncate(0), StatusCode::kState, {path}));
  EXPECT_TRUE(StatusIs(file->Sync(), StatusCode::kState, {path}));
  EXPECT_TRUE(StatusIs(file->Close(), StatusCode::kState, {path}));
}

TEST_P(StorageConformanceTest, OffsetsBeyondAnyFileSizeAreInvalid) {
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, storage()->CreateFile(Path("f")));
  EXPECT_TRUE(StatusIs(file->WriteAt(UINT64_MAX - 1, "xy", 2), StatusCode::kInvalidArgument, {Path("f")}));
  DCKPT_ASSERT_OK(file->Close());
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> reader, storage()->OpenFile(Path("f")));
  char c;
  EXPECT_TRUE(StatusIs(reader->ReadAt(UINT64_MAX, &c, 1), StatusCode::kInvalidArgument, {Path("f")}));
}

TEST_P(StorageConformanceTest, ReadingPastTheEndIsCorruptAndNamesTheFile) {
  const std::string path = Path("short");
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(path, std::string(100, 'a')));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> file, storage()->OpenFile(path));
  EXPECT_EQ(file->size(), 100u);
  char buf[64];
  DCKPT_EXPECT_OK(file->ReadAt(60, buf, 40));  // exactly to the end
  DCKPT_EXPECT_OK(file->ReadAt(100, buf, 0));  // empty read at the end
  EXPECT_TRUE(
      StatusIs(file->ReadAt(90, buf, 20), StatusCode::kCorrupt,
               {"data file '" + path + "' is truncated", "wanted 20 bytes at offset 90", "file has 100 bytes"}));
  EXPECT_TRUE(StatusIs(file->ReadAt(1000, buf, 1), StatusCode::kCorrupt, {path, "truncated"}));
}

TEST_P(StorageConformanceTest, MissingFilesAreNotFoundAndNamed) {
  const std::string path = Path("missing");
  auto opened = storage()->OpenFile(path);
  EXPECT_TRUE(StatusIs(opened.status(), StatusCode::kNotFound, {path}));
  EXPECT_TRUE(StatusIs(storage()->ReadFile(path, 10).status(), StatusCode::kNotFound, {path}));
  EXPECT_TRUE(StatusIs(storage()->FileSize(path).status(), StatusCode::kNotFound, {path}));
  if (!Filesystem()) return;  // an object store has no directories: listing an empty prefix is not an error
  EXPECT_TRUE(StatusIs(storage()->ListDir(path).status(), StatusCode::kNotFound, {path}));
  EXPECT_TRUE(StatusIs(storage()->SyncDir(path), StatusCode::kNotFound, {path}));
}

TEST_P(StorageConformanceTest, ReadFileEnforcesTheSizeCap) {
  const std::string path = Path("capped");
  const std::string data(1000, 'z');
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(path, data));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string read, storage()->ReadFile(path, 1000));
  EXPECT_EQ(read, data);
  EXPECT_TRUE(StatusIs(storage()->ReadFile(path, 999).status(), StatusCode::kCorrupt, {path, "999"}));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("empty"), ""));
  DCKPT_ASSERT_OK_AND_ASSIGN(read, storage()->ReadFile(Path("empty"), 0));
  EXPECT_EQ(read, "");
}

TEST_P(StorageConformanceTest, OpeningADirectoryAsAFileFails) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("d")));
  EXPECT_FALSE(storage()->OpenFile(Path("d")).ok());
  EXPECT_FALSE(storage()->ReadFile(Path("d"), 100).ok());
  EXPECT_FALSE(storage()->CreateFile(Path("d")).ok());
}

TEST_P(StorageConformanceTest, CreatingInAMissingDirectoryFails) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string path = Path("no/such/file");
  EXPECT_TRUE(StatusIs(storage()->CreateFile(path).status(), StatusCode::kNotFound, {path}));
  EXPECT_TRUE(StatusIs(storage()->WriteFileDurably(path, "x"), StatusCode::kNotFound, {path}));
  EXPECT_TRUE(StatusIs(storage()->CreateDir(Path("no/such")), StatusCode::kNotFound, {Path("no/such")}));
  DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, storage()->Exists(Path("no")));
  EXPECT_FALSE(exists);
}

TEST_P(StorageConformanceTest, ExistsIsDirectoryAndCreateDir) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("d")));
  EXPECT_TRUE(StatusIs(storage()->CreateDir(Path("d")), StatusCode::kExists, {Path("d")}));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("f"), "x"));
  EXPECT_TRUE(StatusIs(storage()->CreateDir(Path("f")), StatusCode::kExists, {Path("f")}));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("d/e")));
  DCKPT_ASSERT_OK(storage()->SyncDir(Path("d")));
  DCKPT_ASSERT_OK(storage()->SyncDir(root()));

  for (const char* name : {"d", "d/e", "f"}) {
    DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, storage()->Exists(Path(name)));
    EXPECT_TRUE(exists) << name;
  }
  for (const char* name : {"missing", "d/missing", "f/below-a-file"}) {
    DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, storage()->Exists(Path(name)));
    EXPECT_FALSE(exists) << name;
    DCKPT_ASSERT_OK_AND_ASSIGN(bool is_dir, storage()->IsDirectory(Path(name)));
    EXPECT_FALSE(is_dir) << name;
  }
  DCKPT_ASSERT_OK_AND_ASSIGN(bool is_dir, storage()->IsDirectory(Path("d/e")));
  EXPECT_TRUE(is_dir);
  DCKPT_ASSERT_OK_AND_ASSIGN(is_dir, storage()->IsDirectory(Path("f")));
  EXPECT_FALSE(is_dir);
}

TEST_P(StorageConformanceTest, RenameMovesAFileAndNeverReplacesOne) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("a"), "A"));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("b"), "B"));
  EXPECT_TRUE(StatusIs(storage()->Rename(Path("a"), Path("b")), StatusCode::kExists, {Path("a"), Path("b")}));
  EXPECT_TRUE(StatusIs(storage()->Rename(Path("a"), Path("a")), StatusCode::kExists, {Path("a")}));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("d")));
  EXPECT_TRUE(StatusIs(storage()->Rename(Path("a"), Path("d")), StatusCode::kExists, {Path("d")}));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string a, storage()->ReadFile(Path("a"), 10));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string b, storage()->ReadFile(Path("b"), 10));
  EXPECT_EQ(a, "A");
  EXPECT_EQ(b, "B");

  DCKPT_ASSERT_OK(storage()->Rename(Path("a"), Path("d/c")));
  DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, storage()->Exists(Path("a")));
  EXPECT_FALSE(exists);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string c, storage()->ReadFile(Path("d/c"), 10));
  EXPECT_EQ(c, "A");

  EXPECT_TRUE(StatusIs(storage()->Rename(Path("missing"), Path("x")), StatusCode::kNotFound, {Path("missing")}));
  EXPECT_TRUE(StatusIs(storage()->Rename(Path("b"), Path("no/such/dir")), StatusCode::kNotFound, {Path("b")}));
}

TEST_P(StorageConformanceTest, RenameMovesADirectoryTreeAndNeverReplacesOne) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("src")));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("src/sub")));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("src/sub/f"), "payload"));
  // rename(2) would silently replace an empty directory: the one case where "never replaces" needs care.
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("empty")));
  EXPECT_TRUE(StatusIs(storage()->Rename(Path("src"), Path("empty")), StatusCode::kExists, {Path("empty")}));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("full")));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("full/x"), "x"));
  EXPECT_TRUE(StatusIs(storage()->Rename(Path("src"), Path("full")), StatusCode::kExists, {Path("full")}));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("file"), "y"));
  EXPECT_TRUE(StatusIs(storage()->Rename(Path("src"), Path("file")), StatusCode::kExists, {Path("file")}));
  EXPECT_FALSE(storage()->Rename(Path("src"), Path("src/sub/inside")).ok());
  EXPECT_EQ(SnapshotTree(storage(), Path("empty")).size(), 0u);

  DCKPT_ASSERT_OK(storage()->Rename(Path("src"), Path("dst")));
  DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, storage()->Exists(Path("src")));
  EXPECT_FALSE(exists);
  const std::map<std::string, std::string> expected = {{"sub/", ""}, {"sub/f", "payload"}};
  EXPECT_EQ(SnapshotTree(storage(), Path("dst")), expected);
}

TEST_P(StorageConformanceTest, OpenHandlesSurviveRenameAndRemoval) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("f"), "hello"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> reader, storage()->OpenFile(Path("f")));
  DCKPT_ASSERT_OK(storage()->Rename(Path("f"), Path("g")));
  DCKPT_ASSERT_OK(storage()->RemoveAll(Path("g")));
  char buf[5];
  DCKPT_ASSERT_OK(reader->ReadAt(0, buf, 5));
  EXPECT_EQ(std::string(buf, 5), "hello");
}

TEST_P(StorageConformanceTest, RemoveAllRemovesTreesFilesAndToleratesMissingPaths) {
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("t")));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("t/b")));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("t/b/d")));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("t/empty")));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("t/a"), "a"));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("t/b/c"), "c"));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("t/b/d/e"), "e"));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("t2")));  // a sibling sharing the prefix "t"
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("t2/keep"), "k"));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("lone"), "l"));

  DCKPT_ASSERT_OK(storage()->RemoveAll(Path("t")));
  DCKPT_ASSERT_OK(storage()->RemoveAll(Path("lone")));
  DCKPT_ASSERT_OK(storage()->RemoveAll(Path("t")));          // again: missing is fine
  DCKPT_ASSERT_OK(storage()->RemoveAll(Path("never/was")));  // missing parent too
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"t2"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string keep, storage()->ReadFile(Path("t2/keep"), 10));
  EXPECT_EQ(keep, "k");
}

TEST_P(StorageConformanceTest, ListDirReturnsSortedNamesOfDirectChildren) {
  for (const char* name : {"b", "a", "c10", "c2", "_", "A"}) {
    DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path(name), name));
  }
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("B")));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("B/nested"), "n"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"A", "B", "_", "a", "b", "c10", "c2"}));
  if (!Filesystem()) return;  // no empty directories in an object store, and a file has nothing below it
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("empty")));
  DCKPT_ASSERT_OK_AND_ASSIGN(names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"A", "B", "_", "a", "b", "c10", "c2", "empty"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(names, storage()->ListDir(Path("empty")));
  EXPECT_TRUE(names.empty());
  DCKPT_ASSERT_OK_AND_ASSIGN(names, storage()->ListDir(root() + "/"));
  EXPECT_EQ(names.size(), 8u);
  EXPECT_FALSE(storage()->ListDir(Path("a")).ok());  // a file
}

// ---------------------------------------------------------------------------------------------------------------
// Staged commit

TEST_P(StorageConformanceTest, StagedCheckpointCommitsAtomicallyIntoPlace) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string final_path = Path("ckpt");
  const std::string nonce = NewNonce();
  DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint staged, StagedCheckpoint::Create(storage(), final_path, nonce, false));
  EXPECT_EQ(staged.final_path(), final_path);
  EXPECT_EQ(staged.staging_dir(), StagingPath(final_path, nonce));
  EXPECT_EQ(staged.StagingFile("x"), staged.staging_dir() + "/x");
  // The staging directory sits beside the final path (one filesystem, so the commit is a rename).
  EXPECT_EQ(staged.staging_dir().substr(0, root().size() + 1), root() + "/");
  std::string for_name;
  EXPECT_TRUE(ParseStagingName(Basename(staged.staging_dir()), &for_name));
  EXPECT_EQ(for_name, "ckpt");
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string marker, storage()->ReadFile(staged.StagingFile(kStagingMarkerName), 4096));
  EXPECT_NE(marker.find(final_path), std::string::npos) << marker;
  EXPECT_NE(marker.find("pid: "), std::string::npos) << marker;
  EXPECT_NE(marker.find("host: "), std::string::npos) << marker;

  // Another rank joins and writes its file while the coordinator writes the metadata.
  StagedCheckpoint joined = StagedCheckpoint::Join(storage(), final_path, nonce, false);
  EXPECT_EQ(joined.staging_dir(), staged.staging_dir());
  {
    DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, storage()->CreateFile(joined.StagingFile("data-1")));
    DCKPT_ASSERT_OK(f->WriteAt(0, "rank one", 8));
    DCKPT_ASSERT_OK(f->Sync());
    DCKPT_ASSERT_OK(f->Close());
  }
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(staged.StagingFile("metadata.dckpt"), "meta"));
  DCKPT_ASSERT_OK_AND_ASSIGN(bool visible, storage()->Exists(final_path));
  EXPECT_FALSE(visible) << "nothing may appear at the final path before Commit";

  DCKPT_ASSERT_OK(staged.Commit());
  const std::map<std::string, std::string> expected = {{"data-1", "rank one"}, {"metadata.dckpt", "meta"}};
  EXPECT_EQ(SnapshotTree(storage(), final_path), expected) << "the marker must be gone, the data intact";
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"ckpt"})) << "no staging directory may be left";

  // Abort after a successful commit touches nothing.
  DCKPT_ASSERT_OK(staged.Abort());
  EXPECT_EQ(SnapshotTree(storage(), final_path), expected);
}

TEST_P(StorageConformanceTest, CreateRefusesAnExistingCheckpoint) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string final_path = Path("ckpt");
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), final_path, {{"metadata.dckpt", "v1"}}, false));
  auto again = StagedCheckpoint::Create(storage(), final_path, NewNonce(), false);
  EXPECT_TRUE(
      StatusIs(again.status(), StatusCode::kExists, {"checkpoint '" + final_path + "' already exists", "overwrite"}));
  // A trailing slash names the same checkpoint.
  auto slashed = StagedCheckpoint::Create(storage(), final_path + "/", NewNonce(), false);
  EXPECT_TRUE(StatusIs(slashed.status(), StatusCode::kExists, {final_path}));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"ckpt"})) << "a refused Create must not leave a staging directory";
}

TEST_P(StorageConformanceTest, CreateNeedsAHexNonce) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  auto created = StagedCheckpoint::Create(storage(), Path("ckpt"), "not/a nonce", false);
  EXPECT_TRUE(StatusIs(created.status(), StatusCode::kInvalidArgument, {Path("ckpt")}));
  created = StagedCheckpoint::Create(storage(), Path("ckpt"), "", false);
  EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_TRUE(names.empty());
}

// Issue 38: a save to a path whose parents do not exist makes them (mkdir -p), as torch.distributed.checkpoint does.
TEST_P(StorageConformanceTest, SaveMakesMissingParentDirectories) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  for (CommitProtocol protocol : {CommitProtocol::kRename, CommitProtocol::kMetadataLast}) {
    const std::string top = Path(protocol == CommitProtocol::kRename ? "runs" : "runs-objects");
    const std::string final_path = top + "/a/b/step-10";
    DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint staged,
                               StagedCheckpoint::Create(storage(), final_path, NewNonce(), false, protocol));
    DCKPT_ASSERT_OK(storage()->WriteFileDurably(staged.StagingFile(staged.FileName("data")), "bytes"));
    DCKPT_ASSERT_OK(staged.CommitWithMetadata("v1"));
    DCKPT_ASSERT_OK_AND_ASSIGN(bool is_dir, storage()->IsDirectory(top + "/a/b"));
    EXPECT_TRUE(is_dir);
    DCKPT_ASSERT_OK_AND_ASSIGN(std::string meta, storage()->ReadFile(final_path + "/metadata.dckpt", 100));
    EXPECT_EQ(meta, "v1");
  }
  // Something other than a directory in the way is an error naming it, and nothing is made below it.
  const std::string file = Path("a-file");
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(file, "x"));
  auto created = StagedCheckpoint::Create(storage(), file + "/sub/ckpt", NewNonce(), false);
  EXPECT_TRUE(StatusIs(created.status(), StatusCode::kExists,
                       {"'" + file + "' exists and is not a directory", "checkpoint '" + file + "/sub/ckpt'"}));
}

TEST_P(StorageConformanceTest, OverwriteReplacesTheOldCheckpointAndLeavesNothingBehind) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string final_path = Path("ckpt");
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), final_path, {{"metadata.dckpt", "v1"}, {"old-only", "x"}}, false));
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), final_path, {{"metadata.dckpt", "v2"}}, true));
  const std::map<std::string, std::string> expected = {{"metadata.dckpt", "v2"}};
  EXPECT_EQ(SnapshotTree(storage(), final_path), expected);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"ckpt"})) << "no .dckpt-old- or staging directory may be left";
  // Overwrite with nothing to replace is an ordinary save.
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), Path("fresh"), {{"metadata.dckpt", "f"}}, true));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string meta, storage()->ReadFile(Path("fresh/metadata.dckpt"), 10));
  EXPECT_EQ(meta, "f");
}

// An overwrite removes what it replaces, so it replaces only a checkpoint or an empty directory: a directory of
// other files or a file at the path is refused before anything is written, and left exactly as it was.
TEST_P(StorageConformanceTest, OverwriteReplacesOnlyACheckpointOrAnEmptyDirectory) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("home")));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("home/thesis.tex"), "years of work"));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("notes.txt"), "a file"));
  for (const char* name : {"home", "notes.txt"}) {
    SCOPED_TRACE(name);
    auto staged = StagedCheckpoint::Create(storage(), Path(name), NewNonce(), true);
    EXPECT_TRUE(StatusIs(staged.status(), StatusCode::kExists,
                         {"'" + Path(name) + "' exists and is not a distckpt checkpoint", "never removes"}));
  }
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string kept, storage()->ReadFile(Path("home/thesis.tex"), 100));
  EXPECT_EQ(kept, "years of work");
  DCKPT_ASSERT_OK_AND_ASSIGN(kept, storage()->ReadFile(Path("notes.txt"), 100));
  EXPECT_EQ(kept, "a file");
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"home", "notes.txt"})) << "a refused overwrite leaves no staging";
  // An empty directory, and a damaged checkpoint (its metadata file is what marks it), are replaced.
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("empty")));
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), Path("empty"), {{"metadata.dckpt", "e"}}, true));
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), Path("damaged"), {{"metadata.dckpt", "garbage"}}, false));
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), Path("damaged"), {{"metadata.dckpt", "d"}}, true));
  DCKPT_ASSERT_OK_AND_ASSIGN(kept, storage()->ReadFile(Path("damaged/metadata.dckpt"), 10));
  EXPECT_EQ(kept, "d");
}

TEST_P(StorageConformanceTest, FailedOverwriteCommitPutsTheOldCheckpointBack) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string final_path = Path("ckpt");
  const std::map<std::string, std::string> v1 = {{"data", std::string(5000, 'o')}, {"metadata.dckpt", "v1"}};
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), final_path, v1, false));

  using Mode = FaultyCommitStorage::ExchangeMode;
  // Without an atomic exchange: rename #1 gives the new checkpoint its parked name, #2 parks the old one, #3 (new ->
  // final) fails, #4 moves the old one back. With one: the exchange itself fails.
  for (const auto& [fail_rename, mode] : {std::pair<int, Mode>{3, Mode::kUnsupported}, {0, Mode::kFail}}) {
    FaultyCommitStorage faulty(storage(), fail_rename, mode);
    DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint staged,
                               StagedCheckpoint::Create(&faulty, final_path, NewNonce(), true));
    DCKPT_ASSERT_OK(faulty.WriteFileDurably(staged.StagingFile("metadata.dckpt"), "v2"));
    EXPECT_TRUE(StatusIs(staged.Commit(), StatusCode::kIo, {final_path, "injected"}));
    EXPECT_EQ(SnapshotTree(storage(), final_path), v1);
    DCKPT_ASSERT_OK(staged.Abort());
    DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
    EXPECT_EQ(names, std::vector<std::string>({"ckpt"}));
  }
}

// The overwrite where the storage cannot exchange: two renames, and still nothing left behind.
TEST_P(StorageConformanceTest, OverwriteWithoutExchangeFallsBackToTwoRenames) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string final_path = Path("ckpt");
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), final_path, {{"metadata.dckpt", "v1"}}, false));
  FaultyCommitStorage no_exchange(storage(), 0, FaultyCommitStorage::ExchangeMode::kUnsupported);
  DCKPT_ASSERT_OK(SaveCheckpoint(&no_exchange, final_path, {{"metadata.dckpt", "v2"}}, true));
  EXPECT_EQ(SnapshotTree(storage(), final_path), (std::map<std::string, std::string>{{"metadata.dckpt", "v2"}}));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"ckpt"}));
}

// Records what is at one path after every change the commit makes, to check that it is never missing or partial.
class ObservingStorage final : public Storage {
 public:
  ObservingStorage(Storage* base, std::string watched) : base_(base), watched_(std::move(watched)) {}
  std::vector<std::map<std::string, std::string>> seen;
  std::string name() const override { return base_->name(); }
  Result<std::unique_ptr<WritableFile>> CreateFile(const std::string& p) override { return base_->CreateFile(p); }
  Result<std::unique_ptr<ReadableFile>> OpenFile(const std::string& p) override { return base_->OpenFile(p); }
  Result<std::string> ReadFile(const std::string& p, uint64_t max) override { return base_->ReadFile(p, max); }
  Status WriteFileDurably(const std::string& p, const std::string& d) override {
    return Observe(base_->WriteFileDurably(p, d));
  }
  Result<uint64_t> FileSize(const std::string& p) override { return base_->FileSize(p); }
  Result<bool> Exists(const std::string& p) override { return base_->Exists(p); }
  Result<bool> IsDirectory(const std::string& p) override { return base_->IsDirectory(p); }
  Status CreateDir(const std::string& p) override { return Observe(base_->CreateDir(p)); }
  Status SyncDir(const std::string& p) override { return base_->SyncDir(p); }
  Status Rename(const std::string& from, const std::string& to) override { return Observe(base_->Rename(from, to)); }
  Status RemoveAll(const std::string& p) override { return Observe(base_->RemoveAll(p)); }
  Status RemoveEmptyDir(const std::string& p) override { return Observe(base_->RemoveEmptyDir(p)); }
  Result<std::vector<std::string>> ListDir(const std::string& p) override { return base_->ListDir(p); }
  Result<std::unique_ptr<Directory>> OpenDirectory(const std::string& p) override { return base_->OpenDirectory(p); }
  Result<std::string> Identity(const std::string& p) override { return base_->Identity(p); }
  Status Exchange(const std::string& a, const std::string& b) override { return Observe(base_->Exchange(a, b)); }
  Result<std::unique_ptr<DirectoryLock>> LockDirectory(const std::string& d, std::chrono::milliseconds t) override {
    return base_->LockDirectory(d, t);
  }

 private:
  Status Observe(Status st) {
    seen.push_back(SnapshotTree(base_, watched_));
    return st;
  }
  Storage* base_;
  std::string watched_;
};

TEST_P(StorageConformanceTest, OverwriteNeverLeavesTheFinalPathEmptyOrPartial) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string final_path = Path("ckpt");
  const std::map<std::string, std::string> v1 = {{"data", "old data"}, {"metadata.dckpt", "v1"}};
  const std::map<std::string, std::string> v2 = {{"data", "new data"}, {"extra", "x"}, {"metadata.dckpt", "v2"}};
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), final_path, v1, false));
  ObservingStorage observing(storage(), final_path);
  DCKPT_ASSERT_OK(SaveCheckpoint(&observing, final_path, v2, true));
  ASSERT_FALSE(observing.seen.empty());
  bool switched = false;
  for (size_t i = 0; i < observing.seen.size(); ++i) {
    const auto& at = observing.seen[i];
    if (at == v2) switched = true;
    EXPECT_TRUE(at == (switched ? v2 : v1)) << "after step " << i << " the final path holds " << at.size()
                                            << " files: neither the old nor the new checkpoint";
  }
  EXPECT_TRUE(switched);
}

// Two saves to one path, both overwriting: the first to commit wins, the other commits nothing and says why.
TEST_P(StorageConformanceTest, OfTwoRacingOverwritesTheSecondCommitFails) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string final_path = Path("ckpt");
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), final_path, {{"metadata.dckpt", "v1"}}, false));
  DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint first, StagedCheckpoint::Create(storage(), final_path, NewNonce(), true));
  DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint second,
                             StagedCheckpoint::Create(storage(), final_path, NewNonce(), true));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(first.StagingFile("metadata.dckpt"), "first"));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(second.StagingFile("metadata.dckpt"), "second"));
  DCKPT_ASSERT_OK(first.Commit());
  EXPECT_TRUE(StatusIs(second.Commit(), StatusCode::kExists, {final_path, "another save", "committed nothing"}));
  DCKPT_ASSERT_OK(second.Abort());
  EXPECT_EQ(SnapshotTree(storage(), final_path), (std::map<std::string, std::string>{{"metadata.dckpt", "first"}}));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"ckpt"}));
}

// An overwrite that found nothing at the path, racing a save that commits there first.
TEST_P(StorageConformanceTest, OverwriteOfNothingFailsIfACheckpointAppearedMeanwhile) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string final_path = Path("ckpt");
  DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint late, StagedCheckpoint::Create(storage(), final_path, NewNonce(), true));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(late.StagingFile("metadata.dckpt"), "late"));
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), final_path, {{"metadata.dckpt", "early"}}, false));
  EXPECT_TRUE(StatusIs(late.Commit(), StatusCode::kExists, {final_path}));
  DCKPT_ASSERT_OK(late.Abort());
  EXPECT_EQ(SnapshotTree(storage(), final_path), (std::map<std::string, std::string>{{"metadata.dckpt", "early"}}));
}

TEST_P(StorageConformanceTest, CommitNeverReplacesACheckpointThatAppearedMeanwhile) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  // Two writers race for one path without overwrite: the second Commit must fail, not replace the first.
  const std::string final_path = Path("ckpt");
  DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint first,
                             StagedCheckpoint::Create(storage(), final_path, NewNonce(), false));
  DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint second,
                             StagedCheckpoint::Create(storage(), final_path, NewNonce(), false));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(first.StagingFile("metadata.dckpt"), "first"));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(second.StagingFile("metadata.dckpt"), "second"));
  DCKPT_ASSERT_OK(first.Commit());
  EXPECT_TRUE(StatusIs(second.Commit(), StatusCode::kExists, {final_path, second.staging_dir()}));
  DCKPT_ASSERT_OK(second.Abort());
  const std::map<std::string, std::string> expected = {{"metadata.dckpt", "first"}};
  EXPECT_EQ(SnapshotTree(storage(), final_path), expected);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"ckpt"}));
}

TEST_P(StorageConformanceTest, AbortRemovesEverythingAndIsIdempotent) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string final_path = Path("ckpt");
  DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint staged,
                             StagedCheckpoint::Create(storage(), final_path, NewNonce(), false));
  DCKPT_ASSERT_OK(storage()->CreateDir(staged.StagingFile("nested")));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(staged.StagingFile("nested/data"), "d"));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(staged.StagingFile("metadata.dckpt"), "m"));
  DCKPT_ASSERT_OK(staged.Abort());
  DCKPT_ASSERT_OK(staged.Abort());
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_TRUE(names.empty());
  // After an abort the same path can be saved.
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), final_path, {{"metadata.dckpt", "ok"}}, false));
}

TEST_P(StorageConformanceTest, HalfFailedSaveLeavesNothingAndTouchesNoOtherCheckpoint) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  std::mt19937_64 rng(0x5eed0002);
  const std::string earlier = Path("step-100");
  const std::map<std::string, std::string> earlier_files = {
      {"data-0", RandomBytes(&rng, 300000)}, {"data-1", RandomBytes(&rng, 4096)}, {"metadata.dckpt", RandomBytes(&rng, 999)}};
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), earlier, earlier_files, false));
  const std::map<std::string, std::string> before = SnapshotTree(storage(), earlier);
  ASSERT_EQ(before, earlier_files);

  // The next save dies halfway: one file complete, one half written and never closed, no metadata.
  const std::string final_path = Path("step-200");
  DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint staged,
                             StagedCheckpoint::Create(storage(), final_path, NewNonce(), false));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(staged.StagingFile("data-0"), RandomBytes(&rng, 200000)));
  {
    DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f, storage()->CreateFile(staged.StagingFile("data-1")));
    DCKPT_ASSERT_OK(f->Preallocate(1 << 20));
    DCKPT_ASSERT_OK(f->WriteAt(0, "partial", 7));
    // Dropped without Sync or Close, as a failing rank would.
  }
  DCKPT_ASSERT_OK(staged.Abort());

  DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, storage()->Exists(final_path));
  EXPECT_FALSE(exists);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"step-100"}));
  EXPECT_TRUE(SnapshotTree(storage(), earlier) == before) << "the earlier checkpoint changed";
}

TEST_P(StorageConformanceTest, AStagingDirectoryLeftByACrashIsRecognisable) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string final_path = Path("ckpt");
  std::string staging_dir;
  {
    DCKPT_ASSERT_OK_AND_ASSIGN(StagedCheckpoint staged,
                               StagedCheckpoint::Create(storage(), final_path, NewNonce(), false));
    DCKPT_ASSERT_OK(storage()->WriteFileDurably(staged.StagingFile("data-0"), "half a checkpoint"));
    staging_dir = staged.staging_dir();
    // The process "dies": no Commit, no Abort.
  }
  DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, storage()->Exists(final_path));
  EXPECT_FALSE(exists);

  // A cleanup tool finds it by name and confirms it by the marker.
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage()->ListDir(root()));
  ASSERT_EQ(names.size(), 1u);
  std::string for_name;
  ASSERT_TRUE(ParseStagingName(names[0], &for_name)) << names[0];
  EXPECT_EQ(for_name, "ckpt");
  EXPECT_FALSE(ParseReplacedName(names[0], nullptr));
  EXPECT_EQ(Path(names[0]), staging_dir);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string marker, storage()->ReadFile(Path(names[0]) + "/" + kStagingMarkerName, 4096));
  EXPECT_NE(marker.find("final_path: " + final_path), std::string::npos) << marker;

  // The leftover does not block a new save of the same checkpoint, and can be removed afterwards.
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), final_path, {{"metadata.dckpt", "m"}}, false));
  DCKPT_ASSERT_OK(storage()->RemoveAll(staging_dir));
  DCKPT_ASSERT_OK_AND_ASSIGN(names, storage()->ListDir(root()));
  EXPECT_EQ(names, std::vector<std::string>({"ckpt"}));
}

// ---------------------------------------------------------------------------------------------------------------
// Directories, identities, exchange, commit lock

TEST_P(StorageConformanceTest, ADirectoryHandleKeepsReadingTheDirectoryItOpened) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  const std::string ckpt = Path("ckpt");
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), ckpt, {{"data", "old data"}, {"metadata.dckpt", "v1"}}, false));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Directory> dir, storage()->OpenDirectory(ckpt + "/"));
  EXPECT_EQ(dir->path(), ckpt);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> meta, dir->OpenFile("metadata.dckpt"));
  // The path is overwritten, which moves the old directory aside and removes it. A file opened before keeps its
  // bytes; a name looked up through the handle now is gone, and is never the new checkpoint's file of that name.
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), ckpt, {{"data", "new data"}, {"metadata.dckpt", "v2"}}, true));
  std::string got(2, '\0');
  DCKPT_ASSERT_OK(meta->ReadAt(0, &got[0], 2));
  EXPECT_EQ(got, "v1");
  EXPECT_EQ(dir->OpenFile("data").status().code(), StatusCode::kNotFound);
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Directory> fresh, storage()->OpenDirectory(ckpt));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> data, fresh->OpenFile("data"));
  std::string now(8, '\0');
  DCKPT_ASSERT_OK(data->ReadAt(0, &now[0], 8));
  EXPECT_EQ(now, "new data");
}

TEST_P(StorageConformanceTest, ADirectoryHandleFollowsItsDirectoryThroughARename) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("a")));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("a/f"), "first"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Directory> dir, storage()->OpenDirectory(Path("a")));
  DCKPT_ASSERT_OK(storage()->Rename(Path("a"), Path("b")));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("a")));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("a/f"), "impostor"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> f, dir->OpenFile("f"));
  std::string got(5, '\0');
  DCKPT_ASSERT_OK(f->ReadAt(0, &got[0], 5));
  EXPECT_EQ(got, "first");
  DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, dir->Exists("f"));
  EXPECT_TRUE(exists);
  DCKPT_ASSERT_OK_AND_ASSIGN(exists, dir->Exists("g"));
  EXPECT_FALSE(exists);
  // Removed: its files are gone, and nothing else is found in their place.
  DCKPT_ASSERT_OK(storage()->RemoveAll(Path("b")));
  EXPECT_EQ(dir->OpenFile("f").status().code(), StatusCode::kNotFound);
}

TEST_P(StorageConformanceTest, ADirectoryHandleOpensOnlyRegularFilesByPlainName) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("d")));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("d/sub")));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("d/sub/f"), "x"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Directory> dir, storage()->OpenDirectory(Path("d")));
  EXPECT_TRUE(StatusIs(dir->OpenFile("sub").status(), StatusCode::kCorrupt, {Path("d/sub"), "not a regular file"}));
  for (const char* bad : {"sub/f", "", ".", ".."}) {
    EXPECT_EQ(dir->OpenFile(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(StatusIs(dir->OpenFile("missing").status(), StatusCode::kNotFound, {Path("d/missing")}));
  EXPECT_EQ(storage()->OpenDirectory(Path("nope")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(storage()->OpenDirectory(Path("d/sub/f")).status().code(), StatusCode::kNotFound);
}

TEST_P(StorageConformanceTest, IdentityChangesWhenSomethingElseIsPutThere) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string none, storage()->Identity(Path("x")));
  EXPECT_EQ(none, "");
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("x")));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string first, storage()->Identity(Path("x")));
  EXPECT_NE(first, "");
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string again, storage()->Identity(Path("x")));
  EXPECT_EQ(again, first);
  DCKPT_ASSERT_OK(storage()->Rename(Path("x"), Path("y")));
  DCKPT_ASSERT_OK(storage()->CreateDir(Path("x")));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string second, storage()->Identity(Path("x")));
  EXPECT_NE(second, first);
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(Path("f"), "1"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string file, storage()->Identity(Path("f")));
  EXPECT_NE(file, "");
  EXPECT_NE(file, second);
}

TEST_P(StorageConformanceTest, ExchangeSwapsTwoDirectoriesOrIsUnsupported) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), Path("a"), {{"metadata.dckpt", "A"}}, false));
  DCKPT_ASSERT_OK(SaveCheckpoint(storage(), Path("b"), {{"metadata.dckpt", "B"}, {"more", "b"}}, false));
  Status st = storage()->Exchange(Path("a"), Path("b"));
  if (st.code() == StatusCode::kUnsupported) GTEST_SKIP() << st.ToString();
  DCKPT_ASSERT_OK(st);
  EXPECT_EQ(SnapshotTree(storage(), Path("a")), (std::map<std::string, std::string>{{"metadata.dckpt", "B"}, {"more", "b"}}));
  EXPECT_EQ(SnapshotTree(storage(), Path("b")), (std::map<std::string, std::string>{{"metadata.dckpt", "A"}}));
  EXPECT_EQ(storage()->Exchange(Path("a"), Path("missing")).code(), StatusCode::kNotFound);
}

TEST_P(StorageConformanceTest, TheCommitLockIsExclusiveAndTimesOut) {
  if (!Filesystem()) GTEST_SKIP() << "needs directories and rename";
  auto first = storage()->LockDirectory(root(), std::chrono::seconds(5));
  if (first.status().code() == StatusCode::kUnsupported) GTEST_SKIP() << first.status().ToString();
  DCKPT_ASSERT_OK(first.status());
  std::atomic<int> second_code{-1};
  std::thread other([&] {
    auto second = storage()->LockDirectory(root(), std::chrono::milliseconds(100));
    second_code = static_cast<int>(second.status().code());
  });
  other.join();
  EXPECT_EQ(second_code.load(), static_cast<int>(StatusCode::kTimeout));
  first->reset();
  auto third = storage()->LockDirectory(root(), std::chrono::milliseconds(100));
  DCKPT_EXPECT_OK(third.status());
}

}  // namespace
// ---------------------------------------------------------------------------------------------------------------
// The metadata-last commit (FORMAT.md section 6.2): every backend can run it, object stores run nothing else.

namespace {

struct MetadataLastSave {
  std::string nonce;
  std::optional<StagedCheckpoint> staged;
};

// Starts a save at `path` and writes its data files (name -> bytes), leaving it uncommitted.
MetadataLastSave StartMetadataLast(Storage* storage, const std::string& path,
                                   const std::map<std::string, std::string>& files, bool overwrite, Status* status) {
  MetadataLastSave save;
  save.nonce = NewNonce();
  auto staged = StagedCheckpoint::Create(storage, path, save.nonce, overwrite, CommitProtocol::kMetadataLast);
  *status = staged.status();
  if (!staged.ok()) return save;
  save.staged.emplace(std::move(staged).value());
  for (const auto& kv : files) {
    *status = storage->WriteFileDurably(save.staged->StagingFile(save.staged->FileName(kv.first)), kv.second);
    if (!status->ok()) return save;
  }
  return save;
}

std::vector<std::string> Names(Storage* storage, const std::string& dir) {
  auto names = storage->ListDir(dir);
  return names.ok() ? *names : std::vector<std::string>{"<error> " + names.status().ToString()};
}

}  // namespace

TEST_P(StorageConformanceTest, MetadataLastCommitMakesTheCheckpointAppearWithItsMetadata) {
  const std::string path = Path("ckpt");
  Status st;
  MetadataLastSave save = StartMetadataLast(storage(), path, {{"data-00000.bin", "zero"}, {"data-00001.bin", "one"}},
                                            false, &st);
  DCKPT_ASSERT_OK(st);
  EXPECT_EQ(save.staged->staging_dir(), path);
  EXPECT_EQ(save.staged->FileName("data-00001.bin"), "data-00001." + save.nonce + ".bin");
  // Before the commit: the marker and the data files, no metadata, so no checkpoint.
  EXPECT_EQ(Names(storage(), path),
            std::vector<std::string>({"STAGING." + save.nonce, "data-00000." + save.nonce + ".bin",
                                      "data-00001." + save.nonce + ".bin"}));
  EXPECT_TRUE(StatusIs(storage()->ReadFile(path + "/metadata.dckpt", 100).status(), StatusCode::kNotFound));
  DCKPT_ASSERT_OK(save.staged->CommitWithMetadata("meta"));
  EXPECT_EQ(Names(storage(), path),
            std::vector<std::string>({"data-00000." + save.nonce + ".bin", "data-00001." + save.nonce + ".bin",
                                      "metadata.dckpt"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string meta, storage()->ReadFile(path + "/metadata.dckpt", 100));
  EXPECT_EQ(meta, "meta");
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Directory> dir, storage()->OpenDirectory(path));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReadableFile> f, dir->OpenFile(save.staged->FileName("data-00001.bin")));
  char buf[3];
  DCKPT_ASSERT_OK(f->ReadAt(0, buf, 3));
  EXPECT_EQ(std::string(buf, 3), "one");
}

TEST_P(StorageConformanceTest, MetadataLastRefusesACheckpointWithoutOverwriteAndForeignFilesAlways) {
  const std::string path = Path("ckpt");
  Status st;
  MetadataLastSave first = StartMetadataLast(storage(), path, {{"data-00000.bin", "a"}}, false, &st);
  DCKPT_ASSERT_OK(st);
  DCKPT_ASSERT_OK(first.staged->CommitWithMetadata("A"));
  EXPECT_TRUE(StatusIs(StagedCheckpoint::Create(storage(), path, NewNonce(), false, CommitProtocol::kMetadataLast)
                           .status(),
                       StatusCode::kExists, {path, "already exists"}));
  const std::string other = Path("not-a-checkpoint");
  DCKPT_ASSERT_OK(storage()->CreateDir(other));
  DCKPT_ASSERT_OK(storage()->WriteFileDurably(other + "/notes.txt", "mine"));
  for (bool overwrite : {false, true}) {
    EXPECT_TRUE(
        StatusIs(StagedCheckpoint::Create(storage(), other, NewNonce(), overwrite, CommitProtocol::kMetadataLast)
                     .status(),
                 StatusCode::kExists, {other, "notes.txt"}));
  }
  EXPECT_EQ(Names(storage(), other), std::vector<std::string>({"notes.txt"}));
}

TEST_P(StorageConformanceTest, MetadataLastOverwriteSwapsTheMetadataThenRemovesTheOldFiles) {
  const std::string path = Path("ckpt");
  Status st;
  MetadataLastSave a = StartMetadataLast(storage(), path, {{"data-00000.bin", "old"}}, false, &st);
  DCKPT_ASSERT_OK(st);
  DCKPT_ASSERT_OK(a.staged->CommitWithMetadata("A"));
  MetadataLastSave b = StartMetadataLast(storage(), path, {{"data-00000.bin", "new"}}, true, &st);
  DCKPT_ASSERT_OK(st);
  // Until B commits, A is whole: its metadata and its files.
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string meta, storage()->ReadFile(path + "/metadata.dckpt", 100));
  EXPECT_EQ(meta, "A");
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string old, storage()->ReadFile(path + "/" + a.staged->FileName("data-00000.bin"), 9));
  EXPECT_EQ(old, "old");
  DCKPT_ASSERT_OK(b.staged->CommitWithMetadata("B"));
  EXPECT_EQ(Names(storage(), path),
            std::vector<std::string>({"data-00000." + b.nonce + ".bin", "metadata.dckpt"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(meta, storage()->ReadFile(path + "/metadata.dckpt", 100));
  EXPECT_EQ(meta, "B");
}

TEST_P(StorageConformanceTest, MetadataLastOfTwoRacingSavesWithoutOverwriteTheSecondCommitsNothing) {
  const std::string path = Path("ckpt");
  Status st;
  MetadataLastSave a = StartMetadataLast(storage(), path, {{"data-00000.bin", "a"}}, false, &st);
  DCKPT_ASSERT_OK(st);
  MetadataLastSave b = StartMetadataLast(storage(), path, {{"data-00000.bin", "b"}}, false, &st);
  DCKPT_ASSERT_OK(st);
  DCKPT_ASSERT_OK(a.staged->CommitWithMetadata("A"));
  EXPECT_TRUE(StatusIs(b.staged->CommitWithMetadata("B"), StatusCode::kExists, {path, "committed nothing"}));
  DCKPT_ASSERT_OK(b.staged->Abort());
  DCKPT_ASSERT_OK(b.staged->Abort());  // idempotent
  EXPECT_EQ(Names(storage(), path),
            std::vector<std::string>({"data-00000." + a.nonce + ".bin", "metadata.dckpt"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string meta, storage()->ReadFile(path + "/metadata.dckpt", 100));
  EXPECT_EQ(meta, "A");
}

TEST_P(StorageConformanceTest, MetadataLastCommitAndAbortNeverTouchAnotherRunningSave) {
  const std::string path = Path("ckpt");
  Status st;
  MetadataLastSave a = StartMetadataLast(storage(), path, {{"data-00000.bin", "a"}}, false, &st);
  DCKPT_ASSERT_OK(st);
  DCKPT_ASSERT_OK(a.staged->CommitWithMetadata("A"));
  MetadataLastSave running = StartMetadataLast(storage(), path, {{"data-00000.bin", "r"}}, true, &st);
  DCKPT_ASSERT_OK(st);
  MetadataLastSave b = StartMetadataLast(storage(), path, {{"data-00000.bin", "b"}}, true, &st);
  DCKPT_ASSERT_OK(st);
  DCKPT_ASSERT_OK(b.staged->CommitWithMetadata("B"));
  // A's file is gone (superseded, no marker); the running save keeps its marker and file.
  std::vector<std::string> expected = {"STAGING." + running.nonce, "data-00000." + b.nonce + ".bin",
                                       "data-00000." + running.nonce + ".bin", "metadata.dckpt"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(Names(storage(), path), expected);
  DCKPT_ASSERT_OK(running.staged->Abort());
  EXPECT_EQ(Names(storage(), path),
            std::vector<std::string>({"data-00000." + b.nonce + ".bin", "metadata.dckpt"}));
}

TEST_P(StorageConformanceTest, MetadataLastNamesAreRecognisedAndNothingElseIs) {
  std::string nonce;
  EXPECT_TRUE(ParseNoncedFileName("data-00012.0123456789abcdef.bin", &nonce));
  EXPECT_EQ(nonce, "0123456789abcdef");
  EXPECT_EQ(NoncedFileName("data-00012.bin", nonce), "data-00012.0123456789abcdef.bin");
  for (const char* bad : {"data-00012.bin", "data-x.0123456789abcdef.bin", "data-1.0123456789ABCDEF.bin",
                          "data-1.0123456789abcde.bin", "model.0123456789abcdef.bin", "data-1.0123456789abcdef.bin/",
                          "data-1.0123456789abcdef.binx", "data-.0123456789abcdef.bin", ""}) {
    EXPECT_FALSE(ParseNoncedFileName(bad, nullptr)) << bad;
  }
  EXPECT_TRUE(ParseObjectMarkerName("STAGING.0123456789abcdef", &nonce));
  for (const char* bad : {"STAGING", "STAGING.", "STAGING.0123456789abcdeg", "STAGING.0123456789abcdef0", "xSTAGING"}) {
    EXPECT_FALSE(ParseObjectMarkerName(bad, nullptr)) << bad;
  }
}

}  // namespace distckpt
