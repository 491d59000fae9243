#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/storage/storage.h"
#include "core/storage/storage_conformance.h"

namespace distckpt {
namespace {

std::string MakeMemoryRoot(Storage* storage) {
  // Two levels, so the suite never works directly in "/".
  if (!storage->CreateDir("/tmp").ok() || !storage->CreateDir("/tmp/conformance").ok()) return "";
  return "/tmp/conformance";
}

INSTANTIATE_TEST_SUITE_P(Memory, StorageConformanceTest,
                         ::testing::Values(StorageConformanceParams{"memory", NewMemoryStorage, MakeMemoryRoot}),
                         StorageConformanceTestName);

TEST(MemoryStorageTest, PathsAreNormalisedLexically) {
  std::unique_ptr<Storage> storage = NewMemoryStorage();
  DCKPT_ASSERT_OK(storage->CreateDir("/a"));
  DCKPT_ASSERT_OK(storage->WriteFileDurably("//a/./b", "x"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string bytes, storage->ReadFile("/a/b", 10));
  EXPECT_EQ(bytes, "x");
  DCKPT_ASSERT_OK_AND_ASSIGN(bytes, storage->ReadFile("a/c/../b", 10));
  EXPECT_EQ(bytes, "x");
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage->ListDir("/"));
  EXPECT_EQ(names, std::vector<std::string>({"a"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(bool is_dir, storage->IsDirectory("."));
  EXPECT_TRUE(is_dir);
  EXPECT_EQ(storage->RemoveAll("/").code(), StatusCode::kInvalidArgument);
}

TEST(MemoryStorageTest, EntriesBelowAFileAreNotADirectory) {
  std::unique_ptr<Storage> storage = NewMemoryStorage();
  DCKPT_ASSERT_OK(storage->WriteFileDurably("/f", "x"));
  Status st = storage->CreateFile("/f/g").status();
  EXPECT_EQ(st.code(), StatusCode::kIo) << st.ToString();  // ENOTDIR, as on a real filesystem
  EXPECT_NE(st.message().find("Not a directory"), std::string::npos) << st.ToString();
}

TEST(MemoryStorageTest, WritersSeeATruncationByCreateFile) {
  std::unique_ptr<Storage> storage = NewMemoryStorage();
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> first, storage->CreateFile("/f"));
  DCKPT_ASSERT_OK(first->WriteAt(0, "abc", 3));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> second, storage->CreateFile("/f"));  // O_TRUNC
  DCKPT_ASSERT_OK_AND_ASSIGN(uint64_t size, storage->FileSize("/f"));
  EXPECT_EQ(size, 0u);
}

TEST(MemoryStorageTest, HugeFilesFailInsteadOfExhaustingMemory) {
  std::unique_ptr<Storage> storage = NewMemoryStorage();
  DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, storage->CreateFile("/f"));
  EXPECT_EQ(file->WriteAt(uint64_t{1} << 40, "x", 1).code(), StatusCode::kIo);
  EXPECT_EQ(file->Preallocate(uint64_t{1} << 40).code(), StatusCode::kIo);
  EXPECT_EQ(file->Truncate(uint64_t{1} << 40).code(), StatusCode::kIo);
}

}  // namespace
}  // namespace distckpt
