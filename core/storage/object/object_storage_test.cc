#include "core/storage/object/object_storage.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/storage/storage_conformance.h"

namespace distckpt {
namespace {

std::unique_ptr<Storage> MakeMemoryObjectStorage() { return NewObjectStorage(NewMemoryObjectClient()); }

std::string MakeRoot(Storage*) { return "bucket/conformance"; }

INSTANTIATE_TEST_SUITE_P(MemoryObjects, StorageConformanceTest,
                         ::testing::Values(StorageConformanceParams{"memory_objects", MakeMemoryObjectStorage,
                                                                    MakeRoot}),
                         StorageConformanceTestName);

TEST(ObjectStorageTest, PathsAreNormalisedAndRenameIsUnsupported) {
  std::unique_ptr<Storage> storage = MakeMemoryObjectStorage();
  EXPECT_EQ(storage->commit_protocol(), CommitProtocol::kMetadataLast);
  DCKPT_ASSERT_OK(storage->WriteFileDurably("b//c/./d/", "x"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::string bytes, storage->ReadFile("b/c/d", 10));
  EXPECT_EQ(bytes, "x");
  EXPECT_TRUE(StatusIs(storage->Rename("b/c/d", "b/e"), StatusCode::kUnsupported, {"b/c/d"}));
  // A URL keeps its "scheme://"; the rest is normalised.
  DCKPT_ASSERT_OK(storage->WriteFileDurably("s3://bkt//ckpt/./metadata.dckpt", "m"));
  DCKPT_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage->ListDir("s3://bkt/ckpt/"));
  EXPECT_EQ(names, std::vector<std::string>({"metadata.dckpt"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(bytes, storage->ReadFile("s3://bkt/ckpt/metadata.dckpt", 10));
  EXPECT_EQ(bytes, "m");
  EXPECT_TRUE(StatusIs(storage->RemoveAll("/"), StatusCode::kInvalidArgument));
}

TEST(ObjectStorageTest, AnUnclosedUploadLeavesNothing) {
  std::unique_ptr<Storage> storage = MakeMemoryObjectStorage();
  {
    DCKPT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file, storage->CreateFile("b/f"));
    DCKPT_ASSERT_OK(file->WriteAt(0, "abc", 3));
  }
  DCKPT_ASSERT_OK_AND_ASSIGN(bool exists, storage->Exists("b/f"));
  EXPECT_FALSE(exists);
}

}  // namespace
}  // namespace distckpt
