// The prune of the metadata-last layout against a real object storage (the in-memory one): what it keeps and what it
// removes, including metadata that names files distckpt did not write.
#include "core/tools/leftovers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "core/engine/reader.h"
#include "core/engine/save.h"
#include "core/format/metadata.h"
#include "core/storage/object/object_storage.h"
#include "core/storage/storage.h"

namespace distckpt {
namespace {

// A metadata file referencing `files` (one bytes entry per file, so that it passes validation).
std::string MetadataNaming(const std::vector<std::string>& files) {
  MetadataRecord m;
  m.writer = "test";
  for (size_t i = 0; i < files.size(); ++i) {
    m.files.push_back({files[i], 4});
    EntryRecord e;
    e.name = "blob" + std::to_string(i);
    e.kind = EntryKind::kBytes;
    e.shape = {4};
    e.chunk_offsets = {0};
    e.chunk_lengths = {4};
    ChunkLocation c;
    c.length = 4;
    c.file = static_cast<uint32_t>(i);
    e.chunks.push_back(c);
    m.entries.push_back(e);
  }
  auto encoded = EncodeMetadata(m);
  EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
  return encoded.ok() ? *encoded : std::string();
}

TEST(LeftoversTest, RemovingACheckpointNeverRemovesAFileDistckptDidNotWrite) {
  std::unique_ptr<Storage> storage = NewObjectStorage(NewMemoryObjectClient());
  const std::string nonced = "data-00000.0123456789abcdef.bin";
  for (const std::string& name : {nonced, std::string("notes.txt"), std::string("data-00001.bin")}) {
    ASSERT_TRUE(storage->WriteFileDurably("b/c/" + name, "xxxx").ok());
  }
  ASSERT_TRUE(
      storage->WriteFileDurably("b/c/metadata.dckpt", MetadataNaming({nonced, "notes.txt", "data-00001.bin"})).ok());
  auto scan = ScanCheckpointPath(storage.get(), "b/c", std::chrono::seconds(0));
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_EQ(scan->kind, CheckpointScan::Kind::kCheckpoint);
  EXPECT_EQ(scan->leftover_files, 0u);
  ASSERT_TRUE(RemoveCheckpoint(storage.get(), "b/c").ok());
  auto names = storage->ListDir("b/c");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>({"notes.txt"}));
}

// Incremental checkpoints on an object store (nonce'd file names): the increment reads the base's objects, and
// removing the base is refused, naming the increment, until the increment is gone.
TEST(LeftoversTest, ACheckpointOthersReferToIsNotRemoved) {
  std::unique_ptr<Storage> storage = NewObjectStorage(NewMemoryObjectClient());
  std::vector<float> frozen(300000, 1.5f), adapter(1000, 0.f);
  auto save = [&](const std::string& path, const std::string& base) {
    State s;
    EXPECT_TRUE(s.AddTensor("frozen", DType::kF32, {frozen.size()}).ok());
    EXPECT_TRUE(s.AddPiece("frozen", {0}, {frozen.size()}, frozen.data()).ok());
    EXPECT_TRUE(s.AddTensor("adapter", DType::kF32, {adapter.size()}).ok());
    EXPECT_TRUE(s.AddPiece("adapter", {0}, {adapter.size()}, adapter.data()).ok());
    SaveOptions o;
    o.storage = storage.get();
    o.base = base;
    return Save(path, s, nullptr, o);
  };
  ASSERT_TRUE(save("run/a", "").ok());
  adapter.assign(adapter.size(), 2.f);
  auto b = save("run/b", "run/a");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->bytes_reused, frozen.size() * 4);
  Status refused = RemoveCheckpoint(storage.get(), "run/a");
  EXPECT_EQ(refused.code(), StatusCode::kState) << refused.ToString();
  EXPECT_NE(refused.message().find("'b'"), std::string::npos) << refused.ToString();
  ASSERT_TRUE(*storage->Exists("run/a/metadata.dckpt")) << "nothing was removed";
  {
    ReadOptions ro;
    ro.storage = storage.get();
    auto reader = Reader::Open("run/b", nullptr, ro);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    std::vector<float> got(frozen.size());
    const std::vector<uint64_t> shape{frozen.size()};
    Box whole = Box::Whole(shape).value();
    ASSERT_TRUE((*reader)->ReadRegion("frozen", whole, got.data(), got.size() * 4).ok());
    EXPECT_EQ(got, frozen);
  }
  ASSERT_TRUE(RemoveCheckpoint(storage.get(), "run/b").ok());
  ASSERT_TRUE(RemoveCheckpoint(storage.get(), "run/a").ok());
}

// Issue 27: removing a checkpoint left its empty directory behind. Now the directory goes once empty, and stays when
// anything distckpt did not write is in it.
TEST(LeftoversTest, RemovingACheckpointRemovesItsDirectoryOnceEmpty) {
  std::unique_ptr<Storage> storage = NewMemoryStorage();
  const std::string nonced = "data-00000.0123456789abcdef.bin";
  for (const std::string dir : {"/gone", "/kept"}) {
    ASSERT_TRUE(storage->CreateDir(dir).ok());
    ASSERT_TRUE(storage->WriteFileDurably(dir + "/" + nonced, "xxxx").ok());
    ASSERT_TRUE(storage->WriteFileDurably(dir + "/metadata.dckpt", MetadataNaming({nonced})).ok());
  }
  ASSERT_TRUE(storage->WriteFileDurably("/kept/notes.txt", "mine").ok());
  ASSERT_TRUE(RemoveCheckpoint(storage.get(), "/gone").ok());
  EXPECT_FALSE(*storage->Exists("/gone"));
  ASSERT_TRUE(RemoveCheckpoint(storage.get(), "/kept").ok());
  auto names = storage->ListDir("/kept");
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_EQ(*names, std::vector<std::string>({"notes.txt"}));
}

// A save of this host whose writer still runs keeps its files whatever its age: a grace period judges only writers
// nobody here can ask (other hosts). Removing the checkpoint beside it (grace 0) and a prune with a grace shorter than
// its age both keep them; once its writer has exited, they go.
TEST(LeftoversTest, ARunningSaveOfThisHostKeepsItsFilesWhateverItsAge) {
  std::unique_ptr<Storage> storage = NewObjectStorage(NewMemoryObjectClient());
  const std::string committed = "data-00000.0123456789abcdef.bin";
  ASSERT_TRUE(storage->WriteFileDurably("b/c/" + committed, "xxxx").ok());
  ASSERT_TRUE(storage->WriteFileDurably("b/c/metadata.dckpt", MetadataNaming({committed})).ok());
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  auto marker = [&](long pid) {
    return std::string("distckpt staging directory (not committed)\nhost: ") + host + "\npid: " + std::to_string(pid) +
           "\nstarted_utc: 2020-01-01T00:00:00Z\n";  // years ago
  };
  // A running process of this host (the test's parent) wrote it.
  ASSERT_TRUE(storage->WriteFileDurably("b/c/STAGING.00000000000000cc", marker(::getppid())).ok());
  ASSERT_TRUE(storage->WriteFileDurably("b/c/data-00000.00000000000000cc.bin", "running").ok());
  ASSERT_TRUE(RemoveLeftovers(storage.get(), "b/c", std::chrono::seconds(3600), false, nullptr).ok());
  ASSERT_TRUE(RemoveCheckpoint(storage.get(), "b/c").ok());
  auto names = storage->ListDir("b/c");
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_EQ(*names, std::vector<std::string>({"STAGING.00000000000000cc", "data-00000.00000000000000cc.bin"}));
  // This very process, with no save of that nonce running in it (one that failed): judged by its age, years.
  ASSERT_TRUE(storage->WriteFileDurably("b/c/STAGING.00000000000000cc", marker(::getpid())).ok());
  ASSERT_TRUE(RemoveLeftovers(storage.get(), "b/c", std::chrono::seconds(3600), false, nullptr).ok());
  names = storage->ListDir("b/c");
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_TRUE(names->empty()) << names->size() << " left";
  ASSERT_TRUE(storage->WriteFileDurably("b/c/STAGING.00000000000000cc", marker(::getppid())).ok());
  ASSERT_TRUE(storage->WriteFileDurably("b/c/data-00000.00000000000000cc.bin", "running").ok());
  // Its writer gone (a pid no process has: above the kernel's pid_max), the files are an abandoned save's.
  ASSERT_TRUE(storage->WriteFileDurably("b/c/STAGING.00000000000000cc", marker(1L << 30)).ok());
  ASSERT_TRUE(RemoveLeftovers(storage.get(), "b/c", std::chrono::seconds(3600), false, nullptr).ok());
  names = storage->ListDir("b/c");
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_TRUE(names->empty()) << names->size() << " left";
}

TEST(LeftoversTest, UnreadableMetadataStopsThePrune) {
  std::unique_ptr<Storage> storage = NewObjectStorage(NewMemoryObjectClient());
  ASSERT_TRUE(storage->WriteFileDurably("b/c/data-00000.0123456789abcdef.bin", "xxxx").ok());
  ASSERT_TRUE(storage->WriteFileDurably("b/c/metadata.dckpt", "garbage").ok());
  Status st = RemoveLeftovers(storage.get(), "b/c", std::chrono::seconds(0), false, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  EXPECT_NE(st.message().find("b/c"), std::string::npos);
  EXPECT_EQ(RemoveCheckpoint(storage.get(), "b/c").code(), StatusCode::kCorrupt);
  auto names = storage->ListDir("b/c");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->size(), 2u);
}

}  // namespace
}  // namespace distckpt
