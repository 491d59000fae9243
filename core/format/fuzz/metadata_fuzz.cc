// libFuzzer target for MetadataView::Parse: the checksum trailer, the FlatBuffers verifier and the validator. Built
// and run by scripts/fuzz.sh (clang-14, ASan + UBSan); tests/fuzz:metadata_regressions replays the committed inputs.
// Properties: Parse never crashes, leaks or reads out of bounds (ASan/UBSan); every accessor of an accepted view is
// safe to call; and whatever the reader accepts, the writer accepts too.
//
// The first input byte says how the rest reaches Parse. Low two bits 0: as it is, so the trailer check itself is
// fuzzed (a mutated body then nearly always fails the checksum). Otherwise (3 inputs in 4): a trailer at the end is
// cut off and a correct one appended over the mutated bytes, so that mutations reach the verifier and the validator
// instead of dying at the checksum.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/format/metadata.h"

using distckpt::EncodeMetadata;
using distckpt::EntryView;
using distckpt::MetadataView;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool fix_trailer = (data[0] & 3) != 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (fix_trailer) {
    if (bytes.size() >= distckpt::kMetadataTrailerBytes &&
        bytes.compare(bytes.size() - 8, 8, distckpt::kMetadataTrailerMagic) == 0) {
      bytes.resize(bytes.size() - distckpt::kMetadataTrailerBytes);
    }
    distckpt::AppendMetadataTrailer(&bytes);
  }
  auto buffer = std::make_shared<const std::string>(std::move(bytes));
  distckpt::Result<MetadataView> view = MetadataView::Parse(buffer, "fuzz");
  if (!view.ok()) return 0;
  uint64_t sink = view->format_minor() + view->writer().size() + view->structure().size();
  for (size_t i = 0; i < view->num_files(); ++i) sink += view->file_name(i).size() + view->file_size(i);
  for (size_t i = 0; i < view->num_user(); ++i) sink += view->FindUser(view->user(i).first).has_value();
  for (size_t i = 0; i < view->num_entries(); ++i) {
    const EntryView e = view->entry(i);
    if (view->Find(e.name) != i) std::abort();
    sink += e.nbytes();
    for (size_t c = 0; c < e.num_chunks; ++c) {
      const distckpt::Box box = e.chunk_box(c);
      const distckpt::ChunkLocation loc = e.chunk(c);
      // What the chunk takes in its file: its length, or (format 3.0, compressed) its stored blocks' sizes.
      const distckpt::ChunkCoding coding = e.coding(c);
      if (loc.file >= view->num_files() || loc.offset + coding.stored_length > view->file_size(loc.file)) std::abort();
      if (loc.length != box.volume() * distckpt::DTypeSize(e.dtype)) std::abort();
      if (loc.first_block != distckpt::kNoBlockTable) sink += e.block_checksums[loc.first_block];
      if (e.compressed(c)) {
        uint64_t stored = 0;
        for (const distckpt::StoredBlock& b : e.stored(c)) {
          if (b.size == 0 || b.size > view->checksum_block_size()) std::abort();
          stored += b.size;
        }
        if (stored != coding.stored_length || stored > loc.length) std::abort();
      } else if (coding.stored_length != loc.length) {
        std::abort();
      }
    }
  }
  distckpt::Result<std::string> again = EncodeMetadata(view->ToRecord());
  if (!again.ok()) std::abort();  // the reader accepted something the writer refuses
  return static_cast<int>(sink & 0);
}
