// Checkpoint metadata: the writer-side record, its FlatBuffers encoding, and the validated zero-copy reader view.
// The byte-level contract is FORMAT.md beside this file.
#ifndef DISTCKPT_CORE_FORMAT_METADATA_H_
#define DISTCKPT_CORE_FORMAT_METADATA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/box.h"
#include "core/base/dtype.h"
#include "core/base/span.h"
#include "core/base/status.h"
#include "core/format/checksum.h"

namespace distckpt {

constexpr uint16_t kFormatMajor = 1;
/// 1.1 added the checksum trailer (FORMAT.md section 2.3), 1.2 the chunk hashes. Readers still accept 1.0 files,
/// which have no trailer.
constexpr uint16_t kFormatMinor = 2;
/// A checkpoint that reads data files of earlier ones (an incremental save, FORMAT.md "References") is written as
/// format 2.0, so that readers of 1.x refuse it with a version error instead of reading the wrong files. A save
/// without references still writes 1.x. Readers accept both majors.
constexpr uint16_t kFormatMajorReferences = 2;
constexpr uint16_t kFormatMinorReferences = 0;
/// A checkpoint with compressed chunks (FORMAT.md "Compressed chunks") is written as format 3.0: readers of 1.x and
/// 2.x would read the stored bytes as the chunk's own and report corruption. Readers accept majors 1 to 3.
constexpr uint16_t kFormatMajorCompression = 3;
constexpr uint16_t kFormatMinorCompression = 0;
/// Data chunks start on this boundary inside data files.
constexpr uint64_t kChunkAlignment = 4096;
/// Default size of a checksum block (see FORMAT.md "Checksums").
constexpr uint64_t kDefaultChecksumBlockSize = 1 << 20;
/// Name of the metadata file inside a checkpoint directory.
constexpr char kMetadataFileName[] = "metadata.dckpt";
/// FlatBuffers file_identifier of the metadata file.
constexpr char kMetadataFileIdentifier[] = "DCK1";
/// The metadata file of format 1.1 and later ends with this trailer: XXH3-64 (seed 0, little-endian) of every byte
/// before the trailer, then the 8 bytes of kMetadataTrailerMagic. FORMAT.md section 2.3.
constexpr size_t kMetadataTrailerBytes = 16;
constexpr char kMetadataTrailerMagic[] = "DCKPTSUM";  // 8 bytes; the NUL is not written
/// Marks a chunk that has a single checksum block (no entry in block_checksums).
constexpr uint32_t kNoBlockTable = 0xFFFFFFFFu;
/// Upper bound on a metadata file a reader accepts (FlatBuffers' own limit is 2 GiB). Exclusive: FlatBuffers'
/// verifier needs buffers strictly smaller than this.
constexpr uint64_t kMaxMetadataBytes = (1ull << 31) - 1;

enum class EntryKind : uint8_t { kTensor = 0, kBytes = 1 };

/// How a chunk's bytes are stored (format 3.0). Never renumber.
enum class Codec : uint8_t {
  kRaw = 0,
  /// Each checksum block on its own: the elements' bytes grouped by position (all first bytes, then all second bytes,
  /// ...; for element sizes 2, 4 and 8), then one zstd frame; a block that would not shrink is stored raw.
  kZstdGrouped = 1,
};

/// Where one chunk's bytes live. Mirrors the FlatBuffers struct `ChunkLoc`.
struct ChunkLocation {
  uint64_t offset = 0;     ///< Byte offset in the data file; a multiple of kChunkAlignment.
  uint64_t length = 0;     ///< Byte length = volume(box) * dtype size (for bytes entries: the blob size).
  uint64_t checksum = 0;   ///< Chunk checksum, see ChunkChecksum() in checksum.h.
  uint32_t file = 0;       ///< Index into Metadata files.
  uint32_t first_block = kNoBlockTable;  ///< Index of the chunk's first block checksum, or kNoBlockTable.
};

/// How one chunk is stored (format 3.0). Mirrors the FlatBuffers struct `ChunkCoding`.
struct ChunkCoding {
  uint64_t stored_length = 0;  ///< Bytes the chunk takes in its data file (== length when raw).
  uint32_t first_stored = kNoBlockTable;  ///< Index of its first StoredBlock, or kNoBlockTable for a raw chunk.
  Codec codec = Codec::kRaw;
  uint8_t reserved[3] = {0, 0, 0};
  bool raw() const { return codec == Codec::kRaw; }
};

/// One checksum block of a compressed chunk as it lies in the data file. Mirrors the FlatBuffers struct `StoredBlock`.
struct StoredBlock {
  uint64_t checksum = 0;  ///< XXH3-64 of the stored bytes
  uint64_t size = 0;      ///< stored size; equal to the block's decoded size when the block is stored raw
};

/// Writer-side description of one entry. Tensor chunk boxes are stored flattened: chunk i's offsets are
/// chunk_offsets[i*ndim .. i*ndim+ndim).
struct EntryRecord {
  std::string name;
  EntryKind kind = EntryKind::kTensor;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  std::vector<uint64_t> chunk_offsets;
  std::vector<uint64_t> chunk_lengths;
  std::vector<ChunkLocation> chunks;
  std::vector<uint64_t> block_checksums;
  /// Format 1.2: the strong hash of each chunk's bytes (same order as chunks), or none.
  std::vector<ChunkHash> chunk_hashes;
  /// Format 3.0: how each chunk is stored (same order as chunks), or none (all raw). A compressed chunk's blocks are
  /// stored_blocks[first_stored .. first_stored + its checksum blocks).
  std::vector<ChunkCoding> codings;
  std::vector<StoredBlock> stored_blocks;
};

struct DataFileRecord {
  std::string name;
  uint64_t size = 0;  ///< Exact size of the file after the save.
  /// 0: a file of this checkpoint; k >= 1: a data file of bases[k - 1] (format 2.0).
  uint32_t base = 0;
};

/// An earlier checkpoint whose data files this one reads (format 2.0).
struct BaseRecord {
  std::string name;                ///< its directory name, a sibling of this checkpoint
  uint64_t metadata_checksum = 0;  ///< the checksum in its metadata trailer when this checkpoint was written
  uint64_t metadata_size = 0;      ///< the size of its metadata file then
};

/// Everything a writer puts into the metadata file.
struct MetadataRecord {
  std::string writer;  ///< e.g. "distckpt 0.1.0"
  uint64_t checksum_block_size = kDefaultChecksumBlockSize;
  /// Every chunk offset is a multiple of this: a power of two >= kChunkAlignment.
  uint64_t alignment = kChunkAlignment;
  std::vector<DataFileRecord> files;
  std::vector<EntryRecord> entries;  ///< Any order; EncodeMetadata sorts by name.
  std::vector<std::pair<std::string, std::string>> user;  ///< Free-form key/values (step, framework, ...).
  std::string structure;  ///< Opaque description a binding uses to rebuild nested state (JSON by convention).
  /// Empty for a distckpt checkpoint. The format of a foreign checkpoint described in memory to be read in place
  /// ("safetensors", "torch-dcp"): its chunks carry no checksums (checksum 0, no block tables) and may lie at any
  /// offset (alignment 1 or more). Such a record is encoded only to be parsed with MetadataView::ParseForeign;
  /// MetadataView::Parse refuses it, so no metadata file can turn verification off.
  std::string source;
  /// Format 2.0: the checkpoints whose files DataFileRecord::base names; EncodeMetadata writes 2.0 when there are any.
  std::vector<BaseRecord> bases;
  /// Format 2.0: saves since the last self-contained one in this chain of incremental saves.
  uint32_t chain_length = 0;
};

/// Serialises `record` (entries sorted by name, user keys sorted) into the bytes of a metadata file: a FlatBuffers
/// buffer with the file_identifier, followed by the checksum trailer. Fails if the record itself would not pass
/// validation (duplicate names, bad file names...).
Result<std::string> EncodeMetadata(MetadataRecord record);

/// Appends the checksum trailer (kMetadataTrailerBytes) over all of `*bytes`. EncodeMetadata does this; tests and
/// fuzzers that build raw FlatBuffers use it to get past the checksum to the verifier and the validator.
void AppendMetadataTrailer(std::string* bytes);

/// Read-only view of one entry inside a MetadataView. Pointers borrow from the view's buffer.
struct EntryView {
  std::string_view name;
  EntryKind kind = EntryKind::kTensor;
  DType dtype = DType::kInvalid;
  Span<const uint64_t> shape;
  size_t num_chunks = 0;
  const uint64_t* chunk_offsets = nullptr;  ///< num_chunks * ndim values
  const uint64_t* chunk_lengths = nullptr;  ///< num_chunks * ndim values
  const void* chunk_locs = nullptr;         ///< num_chunks FlatBuffers ChunkLoc structs; use chunk()
  Span<const uint64_t> block_checksums;
  /// One per chunk, or empty (formats before 1.2, foreign checkpoints).
  Span<const ChunkHash> chunk_hashes;
  /// Format 3.0: one per chunk, or empty (every chunk raw).
  Span<const ChunkCoding> codings;
  Span<const StoredBlock> stored_blocks;
  uint64_t block_size = 0;  ///< the checkpoint's checksum_block_size

  uint32_t ndim() const { return static_cast<uint32_t>(shape.size()); }
  Box chunk_box(size_t i) const;
  ChunkLocation chunk(size_t i) const;
  /// How chunk i is stored (a raw coding of its length when the entry has none).
  ChunkCoding coding(size_t i) const;
  bool compressed(size_t i) const { return !codings.empty() && !codings[i].raw(); }
  /// The stored blocks of a compressed chunk i (empty for a raw one).
  Span<const StoredBlock> stored(size_t i) const;
  /// Total bytes of the entry (product of shape * dtype size, or the blob size).
  uint64_t nbytes() const;
};

/// A verified, validated metadata buffer. Construction checks the checksum trailer, then runs the FlatBuffers verifier
/// and every semantic check of FORMAT.md "Reader obligations", so every field read through it can be trusted. Cheap to
/// copy (shared buffer).
class MetadataView {
 public:
  /// `context` (usually the checkpoint path) prefixes error messages.
  static Result<MetadataView> Parse(std::shared_ptr<const std::string> buffer, const std::string& context);
  /// The same over `size` bytes at `data` (8-byte aligned, e.g. a mapped file) that live as long as `owner`.
  static Result<MetadataView> Parse(std::shared_ptr<const void> owner, const void* data, size_t size,
                                    const std::string& context);
  /// As Parse, for the encoded description of a foreign checkpoint (MetadataRecord::source set), which Parse
  /// refuses: chunks may lie at any offset and carry no checksums. Only a reader that built the description itself
  /// from a foreign checkpoint calls this, never on bytes read from a file.
  static Result<MetadataView> ParseForeign(std::shared_ptr<const std::string> buffer, const std::string& context);

  uint16_t format_major() const;
  uint16_t format_minor() const;
  std::string_view writer() const;
  uint64_t checksum_block_size() const;
  /// Every chunk offset is a multiple of this (a power of two >= kChunkAlignment).
  uint64_t alignment() const;

  size_t num_files() const;
  std::string_view file_name(size_t i) const;
  uint64_t file_size(size_t i) const;
  /// 0: file i belongs to this checkpoint; k >= 1: it is a data file of base k - 1 (format 2.0).
  uint32_t file_base(size_t i) const;

  /// The earlier checkpoints this one reads data files of (format 2.0; none before).
  size_t num_bases() const;
  std::string_view base_name(size_t k) const;
  uint64_t base_metadata_checksum(size_t k) const;
  uint64_t base_metadata_size(size_t k) const;
  /// Saves since the last self-contained checkpoint of this chain (0: this one reads no base).
  uint32_t chain_length() const;

  size_t num_entries() const;
  EntryView entry(size_t i) const;
  /// Binary search by name.
  std::optional<size_t> Find(std::string_view name) const;

  size_t num_user() const;
  std::pair<std::string_view, std::string_view> user(size_t i) const;
  std::optional<std::string_view> FindUser(std::string_view key) const;
  std::string_view structure() const;
  /// "" for a distckpt checkpoint; the foreign format otherwise ("safetensors", "torch-dcp").
  std::string_view source() const;
  /// Whether chunks carry checksums (false for foreign checkpoints: nothing can be verified).
  bool checksummed() const { return source().empty(); }

  /// Size of the whole metadata file, trailer included.
  size_t buffer_size() const { return size_; }
  /// The checksum stored in the trailer (and checked), or nullopt for a format 1.0 file, which has none.
  std::optional<uint64_t> checksum() const { return checksum_; }

  /// Copies everything into a writer-side record (to rewrite or edit a checkpoint's metadata). The record is valid:
  /// EncodeMetadata accepts it and gives an equivalent buffer. Fields unknown to this reader are dropped.
  MetadataRecord ToRecord() const;

 private:
  static Result<MetadataView> ParseImpl(std::shared_ptr<const void> owner, const void* data, size_t size,
                                        const std::string& context, bool foreign);
  MetadataView(std::shared_ptr<const void> owner, size_t size, const void* root, std::optional<uint64_t> checksum)
      : owner_(std::move(owner)), size_(size), root_(root), checksum_(checksum) {}
  std::shared_ptr<const void> owner_;  // keeps the buffer alive
  size_t size_ = 0;
  const void* root_ = nullptr;  // const fb::Metadata*
  std::optional<uint64_t> checksum_;
};

/// True if `name` is a valid data file name: non-empty, <= 255 bytes, no '/', '\\' or NUL, not "." or "..",
/// and no ".." component. Stricter than that, it also rejects any ".." substring, ASCII control characters
/// and invalid UTF-8, so a name is always safe to join to a directory and to print.
bool IsValidFileName(std::string_view name);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FORMAT_METADATA_H_
