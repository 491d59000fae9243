#include "core/storage/url/url_storage.h"

#include <gtest/gtest.h>

#include "core/base/testing/status_matchers.h"

namespace distckpt {
namespace {

TEST(UrlStorage, PlainPathsAreTheCallersDefault) {
  EXPECT_EQ(UrlScheme("/a/b"), "");
  EXPECT_EQ(UrlScheme("relative/x://y"), "");
  EXPECT_EQ(UrlScheme("s3://b/k"), "s3");
  DCKPT_ASSERT_OK_AND_ASSIGN(auto none, StorageForUrl("/tmp/ckpt"));
  EXPECT_EQ(none, nullptr);
}

TEST(UrlStorage, AnUnknownSchemeIsNamedWithWhatWouldServeIt) {
  Status st = StorageForUrl("gs://bucket/ckpt").status();
  EXPECT_TRUE(StatusIs(st, StatusCode::kUnsupported, {"gs://bucket/ckpt", "'gs://'", "s3://", "FsspecStorage"}));
}

}  // namespace
}  // namespace distckpt
