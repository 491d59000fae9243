// Test helpers for the metadata codec: a valid record that exercises every feature, and a raw FlatBuffers encoder
// that writes whatever it is given (EncodeMetadata refuses bad records, so hostile buffers are built here).
#ifndef DISTCKPT_CORE_FORMAT_METADATA_TEST_UTIL_H_
#define DISTCKPT_CORE_FORMAT_METADATA_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/format/metadata.h"

namespace distckpt {
namespace testing_util {

/// A record with tensors of several dtypes and ndims (0-d scalar, zero-size dims, grids, multi-block chunks), bytes
/// entries (one empty), user key/values and a structure string. Entries and user keys are already sorted and block
/// tables canonical, so ToRaw(ValidRecord()) is byte-for-byte what a valid file holds.
MetadataRecord ValidRecord();

/// Format 3.0: compresses `record`'s "big" (3 stored blocks, the last one raw) and chunk #1 of "two_big" (ValidRecord's
/// entries), in place.
void CompressSomeChunks(MetadataRecord* record);

/// Everything in a metadata buffer, with raw enum bytes and optional required fields, for building hostile input.
struct RawEntry {
  std::optional<std::string> name;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  std::vector<uint64_t> shape, chunk_offsets, chunk_lengths;
  std::vector<ChunkLocation> chunks;
  std::vector<uint64_t> block_checksums;
  std::vector<ChunkHash> chunk_hashes;
  std::vector<ChunkCoding> codings;        ///< format 3.0
  std::vector<StoredBlock> stored_blocks;  ///< format 3.0
};

struct RawFile {
  std::optional<std::string> name;
  uint64_t size = 0;
  uint32_t base = 0;
};

struct RawBase {
  std::optional<std::string> name;
  uint64_t metadata_checksum = 0;
  uint64_t metadata_size = 0;
};

struct RawMetadata {
  uint16_t format_major = kFormatMajor;
  uint16_t format_minor = kFormatMinor;
  std::string writer;
  uint64_t checksum_block_size = 0;
  uint64_t alignment = 0;
  std::vector<RawFile> files;
  std::vector<RawEntry> entries;
  std::vector<std::pair<std::string, std::string>> user;
  std::string structure;
  std::vector<RawBase> bases;  ///< format 2.0
  uint32_t chain_length = 0;   ///< format 2.0
  /// Adds fields this reader does not know (as a later minor version would) to the root and every entry.
  bool unknown_fields = false;
  /// Makes every entry's chunk vectors point at entry 0's (FlatBuffers allows shared sub-objects).
  bool share_chunk_vectors = false;
  /// Leaves out the optional strings: writer, structure and every user value (a valid file; the reference writer never
  /// does this).
  bool omit_optional_strings = false;
  /// Ends the buffer with a valid checksum trailer, as every writer of format 1.1 does (a hostile field then reaches
  /// the verifier and the validator). False: a bare FlatBuffers buffer, as format 1.0 writers made.
  bool trailer = true;
};

/// Copies a record as-is (no sorting, no canonicalisation).
RawMetadata ToRaw(const MetadataRecord& record);

/// Encodes without any check, in the schema's layout (plus the trailer unless `m.trailer` is false).
std::string RawEncode(const RawMetadata& m);

inline std::shared_ptr<const std::string> Share(std::string s) {
  return std::make_shared<const std::string>(std::move(s));
}

}  // namespace testing_util
}  // namespace distckpt

#endif  // DISTCKPT_CORE_FORMAT_METADATA_TEST_UTIL_H_
