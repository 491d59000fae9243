#include "core/format/metadata.h"

#include <gtest/gtest.h>

namespace distckpt {
namespace {

TEST(MetadataTest, RoundTripSmoke) {
  MetadataRecord r;
  r.writer = "test";
  r.files.push_back({"data-00000.bin", 8192});
  EntryRecord e;
  e.name = "w";
  e.dtype = DType::kF32;
  e.shape = {4, 2};
  e.chunk_offsets = {0, 0, 2, 0};
  e.chunk_lengths = {2, 2, 2, 2};
  e.chunks = {{0, 16, 1, 0, kNoBlockTable}, {4096, 16, 2, 0, kNoBlockTable}};
  r.entries.push_back(e);
  auto buf = EncodeMetadata(r);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  auto view = MetadataView::Parse(std::make_shared<const std::string>(*buf), "/ckpt");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  ASSERT_EQ(view->num_entries(), 1u);
  EXPECT_EQ(view->entry(0).chunk(1).offset, 4096u);
  EXPECT_EQ(view->entry(0).nbytes(), 32u);
}

}  // namespace
}  // namespace distckpt
