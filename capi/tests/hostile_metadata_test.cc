// What the C ABI hands out for valid but unusual metadata that a foreign writer may produce (distckpt's writer never
// does): optional strings left out come back as "", never NULL, so callers that pass them to strlen, Python or Go
// never see a null pointer.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "core/base/testing/temp_dir.h"
#include "core/format/metadata.h"
#include "core/format/metadata_test_util.h"
#include "distckpt/distckpt.h"

namespace distckpt {
namespace {

TEST(HostileMetadataTest, OptionalStringsLeftOutAreEmptyNeverNull) {
  testing_util::RawMetadata m;
  m.checksum_block_size = kDefaultChecksumBlockSize;
  m.alignment = kChunkAlignment;
  m.user = {{"step", "ignored: left out"}};
  m.omit_optional_strings = true;
  const std::string dir = testing_util::MakeTempDir("no-optional-strings-");
  std::ofstream(dir + "/metadata.dckpt", std::ios::binary) << testing_util::RawEncode(m);

  dckpt_reader* r = nullptr;
  ASSERT_EQ(dckpt_reader_open(&r, dir.c_str(), nullptr, nullptr), DCKPT_OK) << dckpt_error_last();
  dckpt_checkpoint_info info = DCKPT_CHECKPOINT_INFO_INIT;
  ASSERT_EQ(dckpt_reader_info(&info, r), DCKPT_OK);
  ASSERT_NE(info.writer, nullptr);
  EXPECT_STREQ(info.writer, "");
  const char* key = nullptr;
  const char* value = nullptr;
  ASSERT_EQ(dckpt_reader_user(&key, &value, r, 0), DCKPT_OK);
  EXPECT_STREQ(key, "step");
  ASSERT_NE(value, nullptr);
  EXPECT_STREQ(value, "");
  value = nullptr;
  ASSERT_EQ(dckpt_reader_user_get(&value, r, "step"), DCKPT_OK);
  ASSERT_NE(value, nullptr);
  const char* structure = nullptr;
  size_t size = 99;
  ASSERT_EQ(dckpt_reader_structure(&structure, &size, r), DCKPT_OK);
  ASSERT_NE(structure, nullptr);
  EXPECT_EQ(size, 0u);
  dckpt_reader_free(r);
}

}  // namespace
}  // namespace distckpt
