// Metadata codec and validator. Every rule enforced here is listed in FORMAT.md "Reader obligations"; keep the two
// in step.
#include "core/format/metadata.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/base/utf8.h"
#include "core/format/checksum.h"
#include "core/format/schema_generated.h"
#include "flatbuffers/flatbuffers.h"

namespace distckpt {
namespace {

// The reader hands out pointers straight into the buffer (zero copy), which is only right on a little-endian host.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "distckpt assumes a little-endian host");
static_assert(FLATBUFFERS_LITTLEENDIAN, "FlatBuffers must be built for a little-endian host");

// The schema's enums and struct mirror core/base and metadata.h exactly.
static_assert(sizeof(fb::ChunkLoc) == 32 && sizeof(ChunkLocation) == 32, "ChunkLoc must stay 32 bytes");
// ChunkLocation is laid out like the schema's ChunkLoc (fields in declaration order, natural alignment), so the
// encoder copies arrays of it as they are.
static_assert(offsetof(ChunkLocation, offset) == 0 && offsetof(ChunkLocation, length) == 8 &&
                  offsetof(ChunkLocation, checksum) == 16 && offsetof(ChunkLocation, file) == 24 &&
                  offsetof(ChunkLocation, first_block) == 28 && std::is_trivially_copyable<ChunkLocation>::value &&
                  alignof(fb::ChunkLoc) == 8,
              "ChunkLocation must mirror fb::ChunkLoc byte for byte");
static_assert(static_cast<int>(fb::DType::MAX) + 1 == kNumDTypes, "schema DType out of step with core/base/dtype.h");
static_assert(static_cast<uint8_t>(fb::DType::BOOL) == static_cast<uint8_t>(DType::kBool) &&
                  static_cast<uint8_t>(fb::DType::U8) == static_cast<uint8_t>(DType::kU8) &&
                  static_cast<uint8_t>(fb::DType::I8) == static_cast<uint8_t>(DType::kI8) &&
                  static_cast<uint8_t>(fb::DType::U16) == static_cast<uint8_t>(DType::kU16) &&
                  static_cast<uint8_t>(fb::DType::I16) == static_cast<uint8_t>(DType::kI16) &&
                  static_cast<uint8_t>(fb::DType::U32) == static_cast<uint8_t>(DType::kU32) &&
                  static_cast<uint8_t>(fb::DType::I32) == static_cast<uint8_t>(DType::kI32) &&
                  static_cast<uint8_t>(fb::DType::U64) == static_cast<uint8_t>(DType::kU64) &&
                  static_cast<uint8_t>(fb::DType::I64) == static_cast<uint8_t>(DType::kI64) &&
                  static_cast<uint8_t>(fb::DType::F16) == static_cast<uint8_t>(DType::kF16) &&
                  static_cast<uint8_t>(fb::DType::BF16) == static_cast<uint8_t>(DType::kBF16) &&
                  static_cast<uint8_t>(fb::DType::F32) == static_cast<uint8_t>(DType::kF32) &&
                  static_cast<uint8_t>(fb::DType::F64) == static_cast<uint8_t>(DType::kF64) &&
                  static_cast<uint8_t>(fb::DType::C64) == static_cast<uint8_t>(DType::kC64) &&
                  static_cast<uint8_t>(fb::DType::C128) == static_cast<uint8_t>(DType::kC128) &&
                  static_cast<uint8_t>(fb::DType::F8_E4M3) == static_cast<uint8_t>(DType::kF8E4M3FN) &&
                  static_cast<uint8_t>(fb::DType::F8_E5M2) == static_cast<uint8_t>(DType::kF8E5M2),
              "schema DType values differ from core/base/dtype.h");
static_assert(static_cast<uint8_t>(fb::EntryKind::Tensor) == static_cast<uint8_t>(EntryKind::kTensor) &&
                  static_cast<uint8_t>(fb::EntryKind::Bytes) == static_cast<uint8_t>(EntryKind::kBytes),
              "schema EntryKind values differ from metadata.h");
static_assert(sizeof(fb::Hash128) == sizeof(ChunkHash) && alignof(fb::Hash128) == 8 && offsetof(ChunkHash, lo) == 0 &&
                  offsetof(ChunkHash, hi) == 8 && std::is_trivially_copyable<ChunkHash>::value,
              "ChunkHash must mirror fb::Hash128 byte for byte");
static_assert(sizeof(fb::ChunkCoding) == 16 && sizeof(ChunkCoding) == 16 && alignof(fb::ChunkCoding) == 8 &&
                  offsetof(ChunkCoding, stored_length) == 0 && offsetof(ChunkCoding, first_stored) == 8 &&
                  offsetof(ChunkCoding, codec) == 12 && std::is_trivially_copyable<ChunkCoding>::value,
              "ChunkCoding must mirror fb::ChunkCoding byte for byte");
static_assert(sizeof(fb::StoredBlock) == 16 && sizeof(StoredBlock) == 16 && alignof(fb::StoredBlock) == 8 &&
                  offsetof(StoredBlock, checksum) == 0 && offsetof(StoredBlock, size) == 8 &&
                  std::is_trivially_copyable<StoredBlock>::value,
              "StoredBlock must mirror fb::StoredBlock byte for byte");
static_assert(sizeof(kMetadataFileIdentifier) == flatbuffers::kFileIdentifierLength + 1, "identifier is 4 bytes");
static_assert(sizeof(kMetadataTrailerMagic) == 9 && kMetadataTrailerBytes == 16, "trailer: 8-byte sum + 8-byte magic");

// Nesting is Metadata -> entries -> Entry -> name: depth 3. A little slack, nothing more.
constexpr flatbuffers::uoffset_t kMaxVerifierDepth = 16;
// Names a reader must be able to hand to C (no NUL) and keep in memory comfortably.
constexpr size_t kMaxNameBytes = 1 << 16;
// Data file names that would collide with the checkpoint's own files.
constexpr const char* kReservedFileNames[] = {kMetadataFileName, "STAGING"};

const fb::Metadata* Root(const void* root) { return static_cast<const fb::Metadata*>(root); }

std::string_view View(const flatbuffers::String* s) {
  return s != nullptr ? std::string_view(s->data(), s->size()) : std::string_view();
}

template <typename T>
size_t Size(const flatbuffers::Vector<T>* v) {
  return v != nullptr ? v->size() : 0;
}

// Null for an absent or empty vector: an empty vector's data pointer need not be aligned, so it is never handed out.
template <typename T>
const T* Data(const flatbuffers::Vector<T>* v) {
  return v != nullptr && v->size() != 0 ? v->data() : nullptr;
}

// A name from an untrusted buffer, made safe to print: quoted, at most 120 bytes, non-printable bytes escaped.
std::string Quote(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "'";
  const size_t limit = 120;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > limit) out += "...";
  return out + "'";
}

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

bool ByteLess(std::string_view a, std::string_view b) { return a.compare(b) < 0; }  // char_traits: unsigned bytes

// The newest minor version this reader knows of `major` (1.x, 2.x or 3.x).
uint16_t KnownMinor(uint16_t major) {
  if (major == kFormatMajorCompression) return kFormatMinorCompression;
  return major == kFormatMajorReferences ? kFormatMinorReferences : kFormatMinor;
}

// Runs the semantic checks of FORMAT.md "Reader obligations" over a buffer that passed the FlatBuffers verifier.
class Validator {
 public:
  Validator(const fb::Metadata* m, size_t buffer_size, const std::string& context, bool foreign)
      : m_(m), buffer_size_(buffer_size), context_(context), foreign_(foreign) {}

  Status Run() {
    DCKPT_RETURN_IF_ERROR(CheckHeader());
    DCKPT_RETURN_IF_ERROR(CheckBases());
    DCKPT_RETURN_IF_ERROR(CheckFiles());
    DCKPT_RETURN_IF_ERROR(CheckUser());
    DCKPT_RETURN_IF_ERROR(CheckEntries());
    return OkStatus();
  }

 private:
  Status Fail(StatusCode code, const std::string& msg) const {
    return Status(code, context_.empty() ? msg : context_ + ": " + msg);
  }
  Status Bad(const std::string& msg) const { return Fail(StatusCode::kCorrupt, msg); }

  // "entry 'name'" / "entry 'name' chunk #i: " for the entry being checked.
  std::string Where() const { return "entry " + Quote(entry_name_); }
  std::string FileName(uint32_t file) const { return Quote(View(m_->files()->Get(file)->name())); }
  std::string ChunkWhere(size_t i) const { return Where() + " chunk #" + std::to_string(i) + ": "; }
  auto Field(const char* field) const {
    return [this, field] { return Where() + ": " + field; };
  }

  // Vectors may legally be shared between tables in FlatBuffers. Sharing would let a small buffer make the
  // validator (and every reader loop) walk the same large vector many times, so the bytes of every vector and
  // string this validator visits must add up to no more than the buffer: total work stays linear in its size.
  // Error messages are built only on failure: the success path allocates nothing per entry or chunk.
  // `what` is a callable returning the name of the field being checked.
  template <typename What>
  Status Account(uint64_t bytes, const What& what) {
    visited_bytes_ += bytes;  // each term < 2^31 and there are < 2^31 of them: no overflow
    if (visited_bytes_ > buffer_size_) {
      return Bad(what() + " shares storage with another vector or string; each must be stored once");
    }
    return OkStatus();
  }

  template <typename T, typename What>
  Status CheckVector(const flatbuffers::Vector<T>* v, size_t elem_size, size_t align, const What& what) {
    if (v == nullptr) return OkStatus();
    // The verifier checks only that the length prefix is 4-aligned; the 64-bit values we hand out as raw pointers
    // must be 8-aligned (relative to the buffer start, which Parse requires to be 8-aligned in memory).
    // Empty vectors are exempt: builders align only the length of a vector with no elements.
    if (v->size() != 0 && reinterpret_cast<uintptr_t>(v->data()) % align != 0) return Bad(what() + " is misaligned");
    return Account(static_cast<uint64_t>(v->size()) * elem_size + 4, what);
  }

  template <typename What>
  Status CheckText(const flatbuffers::String* s, const What& what) {
    if (s == nullptr) return OkStatus();
    DCKPT_RETURN_IF_ERROR(Account(s->size() + 5ull, what));
    if (!IsValidUtf8(View(s))) return Bad(what() + " is not valid UTF-8");
    return OkStatus();
  }

  // Names are handed to C as NUL-terminated strings and printed in messages.
  template <typename What>
  Status CheckName(const flatbuffers::String* s, const What& what) {
    DCKPT_RETURN_IF_ERROR(CheckText(s, what));
    const std::string_view v = View(s);
    if (v.empty()) return Bad(what() + " is empty");
    if (v.size() > kMaxNameBytes) return Bad(what() + " is longer than " + std::to_string(kMaxNameBytes) + " bytes");
    if (v.find('\0') != std::string_view::npos) return Bad(what() + " " + Quote(v) + " contains a NUL byte");
    return OkStatus();
  }

  static auto Named(const char* s) {
    return [s] { return std::string(s); };
  }

  Status CheckHeader() {
    // Parse already checked format_major.
    block_size_ = m_->checksum_block_size();
    if (!IsPowerOfTwo(block_size_) || block_size_ < 4096) {
      return Bad("checksum_block_size " + std::to_string(block_size_) + " is not a power of two >= 4096");
    }
    DCKPT_RETURN_IF_ERROR(CheckText(m_->source(), Named("source")));
    if (!foreign_ && !View(m_->source()).empty()) {
      return Bad("metadata sets source " + Quote(View(m_->source())) +
                 ", which only a reader's in-memory description of a foreign checkpoint may (FORMAT.md 2.4)");
    }
    if (foreign_ && View(m_->source()).empty()) return Bad("a foreign checkpoint's description names no source");
    alignment_ = m_->alignment();
    const uint64_t min_alignment = foreign_ ? 1 : kChunkAlignment;
    if (!IsPowerOfTwo(alignment_) || alignment_ < min_alignment) {
      return Bad("alignment " + std::to_string(alignment_) +
                 " is not a power of two >= " + std::to_string(min_alignment));
    }
    DCKPT_RETURN_IF_ERROR(CheckText(m_->writer(), Named("writer")));
    DCKPT_RETURN_IF_ERROR(CheckText(m_->structure(), Named("structure")));
    return OkStatus();
  }

  // Format 2.0's references to earlier checkpoints (FORMAT.md "References"): each names a sibling directory by a plain
  // name, so no reference can leave the checkpoint's parent; a 1.x file has none.
  Status CheckBases() {
    const auto* bases = m_->bases();
    DCKPT_RETURN_IF_ERROR(CheckVector(bases, 4, 4, Named("bases")));
    const size_t n = Size(bases);
    if (m_->format_major() < kFormatMajorReferences && (n != 0 || m_->chain_length() != 0)) {
      return Bad("metadata of format " + std::to_string(m_->format_major()) + "." + std::to_string(m_->format_minor()) +
                 " refers to other checkpoints, which only format 2.0 may");
    }
    if (foreign_ && n != 0) return Bad("a foreign checkpoint's description refers to other checkpoints");
    if ((n == 0) != (m_->chain_length() == 0)) {
      return Bad("chain_length " + std::to_string(m_->chain_length()) + " disagrees with the " + std::to_string(n) +
                 " base checkpoints (0 exactly when there are none)");
    }
    std::vector<std::string_view> names;
    names.reserve(n);
    for (uint32_t k = 0; k < n; ++k) {
      const fb::BaseRef* b = bases->Get(k);
      if (b == nullptr || b->name() == nullptr) return Bad("base checkpoint #" + std::to_string(k) + " has no name");
      DCKPT_RETURN_IF_ERROR(
          Account(b->name()->size() + 5ull, [k] { return "name of base checkpoint #" + std::to_string(k); }));
      const std::string_view name = View(b->name());
      if (!IsValidFileName(name)) {
        return Bad("base checkpoint #" + std::to_string(k) + " has an invalid name " + Quote(name) +
                   " (it must name a sibling directory: no path separators, '..', control characters or NUL)");
      }
      names.push_back(name);
    }
    std::sort(names.begin(), names.end(), ByteLess);
    for (size_t k = 1; k < names.size(); ++k) {
      if (names[k] == names[k - 1]) return Bad("base checkpoint " + Quote(names[k]) + " is listed twice");
    }
    num_bases_ = n;
    return OkStatus();
  }

  Status CheckFiles() {
    const auto* files = m_->files();
    DCKPT_RETURN_IF_ERROR(CheckVector(files, 4, 4, Named("files")));
    const size_t n = Size(files);
    // (base, name): two bases may each have a data-00000.bin.
    std::vector<std::pair<std::pair<uint32_t, std::string_view>, uint32_t>> names;
    names.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      const fb::DataFile* f = files->Get(i);
      if (f == nullptr || f->name() == nullptr) return Bad("data file #" + std::to_string(i) + " has no name");
      DCKPT_RETURN_IF_ERROR(
          Account(f->name()->size() + 5ull, [i] { return "name of data file #" + std::to_string(i); }));
      const std::string_view name = View(f->name());
      if (!IsValidFileName(name)) {
        return Bad("data file #" + std::to_string(i) + " has an invalid name " + Quote(name) +
                   " (it must be a plain file name: no path separators, '..', control characters or NUL)");
      }
      for (const char* reserved : kReservedFileNames) {
        if (name == reserved) return Bad("data file #" + std::to_string(i) + " uses the reserved name " + Quote(name));
      }
      if (f->base() > num_bases_) {
        return Bad("data file #" + std::to_string(i) + " " + Quote(name) + " names base checkpoint " +
                   std::to_string(f->base()) + ", but there are " + std::to_string(num_bases_));
      }
      names.push_back({{f->base(), name}, i});
      file_sizes_.push_back(f->size());
    }
    std::sort(names.begin(), names.end(), [](const auto& a, const auto& b) {
      return a.first.first != b.first.first ? a.first.first < b.first.first : ByteLess(a.first.second, b.first.second);
    });
    for (size_t k = 1; k < names.size(); ++k) {
      if (names[k].first == names[k - 1].first) {
        return Bad("data files #" + std::to_string(names[k - 1].second) + " and #" + std::to_string(names[k].second) +
                   (names[k].first.first == 0 ? " have the same name " + Quote(names[k].first.second)
                                              : " are the same file " + Quote(names[k].first.second) +
                                                    " of base checkpoint " + std::to_string(names[k].first.first)));
      }
    }
    return OkStatus();
  }

  Status CheckUser() {
    const auto* user = m_->user();
    DCKPT_RETURN_IF_ERROR(CheckVector(user, 4, 4, Named("user")));
    std::string_view prev;
    for (uint32_t i = 0; i < Size(user); ++i) {
      const fb::KeyValue* kv = user->Get(i);
      if (kv == nullptr) return Bad("user key/value #" + std::to_string(i) + " is missing");
      DCKPT_RETURN_IF_ERROR(CheckName(kv->key(), [i] { return "user key #" + std::to_string(i); }));
      DCKPT_RETURN_IF_ERROR(CheckText(kv->value(), [i] { return "value of user key #" + std::to_string(i); }));
      const std::string_view key = View(kv->key());
      if (i > 0 && !ByteLess(prev, key)) {
        return Bad(prev == key ? "user key " + Quote(key) + " appears twice"
                               : "user keys are not sorted: " + Quote(prev) + " comes before " + Quote(key));
      }
      prev = key;
    }
    return OkStatus();
  }

  Status CheckEntries() {
    const auto* entries = m_->entries();
    DCKPT_RETURN_IF_ERROR(CheckVector(entries, 4, 4, Named("entries")));
    std::string_view prev;
    for (uint32_t i = 0; i < Size(entries); ++i) {
      const fb::Entry* e = entries->Get(i);
      if (e == nullptr) return Bad("entry #" + std::to_string(i) + " is missing");
      DCKPT_RETURN_IF_ERROR(CheckName(e->name(), [i] { return "name of entry #" + std::to_string(i); }));
      const std::string_view name = View(e->name());
      if (i > 0 && !ByteLess(prev, name)) {
        return Bad(prev == name ? "entry name " + Quote(name) + " appears twice"
                                : "entries are not sorted by name: " + Quote(prev) + " comes before " + Quote(name));
      }
      prev = name;
      DCKPT_RETURN_IF_ERROR(CheckEntry(e, name));
    }
    return OkStatus();
  }

  Status CheckEntry(const fb::Entry* e, std::string_view name) {
    entry_name_ = name;
    const bool newer_minor = m_->format_minor() > KnownMinor(m_->format_major());
    const auto kind = static_cast<uint8_t>(e->kind());
    if (kind > static_cast<uint8_t>(fb::EntryKind::MAX)) {
      // A later minor version may add kinds; say so rather than calling the file corrupt.
      return Fail(newer_minor ? StatusCode::kVersion : StatusCode::kCorrupt,
                  Where() + ": unknown entry kind " + std::to_string(kind) +
                      (newer_minor ? " (written by a newer format minor version; upgrade distckpt)" : ""));
    }
    const auto raw_dtype = static_cast<uint8_t>(e->dtype());
    if (!IsValidDType(raw_dtype)) {
      return Fail(
          newer_minor && raw_dtype != 0 ? StatusCode::kVersion : StatusCode::kCorrupt,
          Where() + ": unknown dtype " + std::to_string(raw_dtype) +
              (newer_minor && raw_dtype != 0 ? " (written by a newer format minor version; upgrade distckpt)" : ""));
    }
    const auto dtype = static_cast<DType>(raw_dtype);
    const uint64_t itemsize = DTypeSize(dtype);

    const auto* shape_v = e->shape();
    const auto* offsets_v = e->chunk_offsets();
    const auto* lengths_v = e->chunk_lengths();
    const auto* chunks_v = e->chunks();
    const auto* blocks_v = e->block_checksums();
    const auto* hashes_v = e->chunk_hashes();
    DCKPT_RETURN_IF_ERROR(CheckVector(hashes_v, sizeof(fb::Hash128), alignof(fb::Hash128), Field("chunk_hashes")));
    const auto* codings_v = e->chunk_codings();
    const auto* stored_v = e->stored_blocks();
    DCKPT_RETURN_IF_ERROR(
        CheckVector(codings_v, sizeof(fb::ChunkCoding), alignof(fb::ChunkCoding), Field("chunk_codings")));
    DCKPT_RETURN_IF_ERROR(
        CheckVector(stored_v, sizeof(fb::StoredBlock), alignof(fb::StoredBlock), Field("stored_blocks")));
    DCKPT_RETURN_IF_ERROR(CheckVector(shape_v, 8, 8, Field("shape")));
    DCKPT_RETURN_IF_ERROR(CheckVector(offsets_v, 8, 8, Field("chunk_offsets")));
    DCKPT_RETURN_IF_ERROR(CheckVector(lengths_v, 8, 8, Field("chunk_lengths")));
    DCKPT_RETURN_IF_ERROR(CheckVector(chunks_v, sizeof(fb::ChunkLoc), alignof(fb::ChunkLoc), Field("chunks")));
    DCKPT_RETURN_IF_ERROR(CheckVector(blocks_v, 8, 8, Field("block_checksums")));

    const size_t ndim = Size(shape_v);
    if (ndim > kMaxDims) {
      return Bad(Where() + ": has " + std::to_string(ndim) + " dimensions; at most " + std::to_string(kMaxDims) +
                 " are allowed");
    }
    const Span<const uint64_t> shape(Data(shape_v), ndim);
    Result<uint64_t> nbytes = CheckedVolume(shape, itemsize);
    if (!nbytes.ok())
      return Bad(Where() + ": shape " + ShapeString(shape) + " of " + DTypeName(dtype) + " overflows 64 bits");

    const size_t nchunks = Size(chunks_v);
    if (Size(hashes_v) != 0 && (Size(hashes_v) != nchunks || foreign_)) {
      return Bad(Where() + ": has " + std::to_string(Size(hashes_v)) + " chunk hashes for " + std::to_string(nchunks) +
                 " chunks (one per chunk, or none" + (foreign_ ? "; a foreign checkpoint has none" : "") + ")");
    }
    if (Size(codings_v) != 0 || Size(stored_v) != 0) {
      if (foreign_ || m_->format_major() < kFormatMajorCompression) {
        return Bad(Where() + ": has compressed chunks, which only format " + std::to_string(kFormatMajorCompression) +
                   ".0 may (this is " +
                   (foreign_
                        ? "a foreign checkpoint"
                        : "format " + std::to_string(m_->format_major()) + "." + std::to_string(m_->format_minor())) +
                   ")");
      }
      if (Size(codings_v) != nchunks) {
        return Bad(Where() + ": has " + std::to_string(Size(codings_v)) + " chunk codings for " +
                   std::to_string(nchunks) + " chunks (one per chunk, or none)");
      }
    }
    // Sizes are < 2^31 (verified buffer), so nchunks * ndim cannot overflow.
    if (Size(offsets_v) != nchunks * ndim || Size(lengths_v) != nchunks * ndim) {
      return Bad(Where() + ": has " + std::to_string(nchunks) + " chunks of " + std::to_string(ndim) +
                 " dimensions, so chunk_offsets and chunk_lengths need " + std::to_string(nchunks * ndim) +
                 " values each, not " + std::to_string(Size(offsets_v)) + " and " + std::to_string(Size(lengths_v)));
    }
    if (e->kind() == fb::EntryKind::Bytes) {
      if (dtype != DType::kU8 || ndim != 1 || nchunks != 1) {
        return Bad(Where() + ": a bytes entry must have dtype U8, a 1-d shape and exactly one chunk (it has " +
                   DTypeName(dtype) + ", " + std::to_string(ndim) + " dimensions and " + std::to_string(nchunks) +
                   " chunks)");
      }
    }

    const uint64_t* offsets = Data(offsets_v);
    const uint64_t* lengths = Data(lengths_v);
    const uint64_t* blocks = Data(blocks_v);
    const uint64_t nblocks_stored = Size(blocks_v);
    const size_t nfiles = file_sizes_.size();
    uint64_t next_block = 0;   // block tables are laid out in chunk order, without gaps
    uint64_t next_stored = 0;  // so are the stored blocks of compressed chunks
    bool whole_in_one = false;
    boxes_.resize(nchunks);
    for (size_t i = 0; i < nchunks; ++i) {
      const fb::ChunkLoc* loc = chunks_v->Get(static_cast<flatbuffers::uoffset_t>(i));
      Box& box = boxes_[i];
      box.ndim = static_cast<uint32_t>(ndim);
      uint64_t volume = 1;
      bool whole = true;
      for (size_t d = 0; d < ndim; ++d) {
        const uint64_t off = offsets[i * ndim + d];
        const uint64_t len = lengths[i * ndim + d];
        if (off > shape[d] || len > shape[d] - off) {
          return Bad(ChunkWhere(i) + "box " + BoxString(offsets + i * ndim, lengths + i * ndim, ndim) +
                     " lies outside the shape " + ShapeString(shape));
        }
        box.offset[d] = off;
        box.length[d] = len;
        volume *= len;  // inside the shape, whose byte size fits in 64 bits
        whole = whole && off == 0 && len == shape[d];
      }
      whole_in_one = whole_in_one || (whole && nchunks == 1);
      const uint64_t length = loc->length();
      if (length != volume * itemsize) {
        return Bad(ChunkWhere(i) + "length " + std::to_string(length) + " does not match its box " +
                   BoxString(offsets + i * ndim, lengths + i * ndim, ndim) + " of " + DTypeName(dtype) + " (" +
                   std::to_string(volume * itemsize) + " bytes)");
      }
      const uint32_t file = loc->file();
      if (file >= nfiles) {
        return Bad(ChunkWhere(i) + "data file index " + std::to_string(file) + " is out of range (" +
                   std::to_string(nfiles) + " data files)");
      }
      const uint64_t file_size = file_sizes_[file];
      const uint64_t offset = loc->offset();
      if ((offset & (alignment_ - 1)) != 0) {
        return Bad(ChunkWhere(i) + "offset " + std::to_string(offset) + " in data file " + FileName(file) +
                   " is not a multiple of the alignment " + std::to_string(alignment_));
      }
      // The bytes the chunk takes in its file: its length, or what its compressed blocks add up to.
      uint64_t extent = length;
      if (Size(codings_v) != 0) {
        DCKPT_ASSIGN_OR_RETURN(extent, CheckCoding(i, *codings_v->Get(static_cast<flatbuffers::uoffset_t>(i)), length,
                                                   stored_v, &next_stored));
      }
      if (offset > file_size || extent > file_size - offset) {
        return Bad(ChunkWhere(i) + "offset " + std::to_string(offset) + " + " +
                   (extent == length ? "length " : "stored length ") + std::to_string(extent) + " exceeds the size " +
                   std::to_string(file_size) + " of data file " + FileName(file));
      }
      const uint32_t first = loc->first_block();
      if (foreign_) {  // no checksums at all
        if (first != kNoBlockTable || loc->checksum() != 0) {
          return Bad(ChunkWhere(i) + "has a checksum, which a foreign checkpoint's chunks never have");
        }
        continue;
      }
      const uint64_t nb = NumChecksumBlocks(length, block_size_);
      if (nb == 1) {
        if (first != kNoBlockTable) {
          return Bad(ChunkWhere(i) + "has a single checksum block but a block table (first_block " +
                     std::to_string(first) + ")");
        }
        continue;
      }
      if (first == kNoBlockTable) {
        return Bad(ChunkWhere(i) + "has " + std::to_string(nb) + " checksum blocks but no block table");
      }
      if (first != next_block || first > nblocks_stored || nb > nblocks_stored - first) {
        return Bad(ChunkWhere(i) + "block table [" + std::to_string(first) + ", +" + std::to_string(nb) +
                   ") is out of range or out of order (expected to start at " + std::to_string(next_block) + " of " +
                   std::to_string(nblocks_stored) + " block checksums)");
      }
      next_block = first + nb;
      if (CombineBlockChecksums(Span<const uint64_t>(blocks + first, nb)) != loc->checksum()) {
        return Bad(ChunkWhere(i) + "checksum does not match its block checksums");
      }
    }
    if (next_block != nblocks_stored) {
      return Bad(Where() + ": has " + std::to_string(nblocks_stored - next_block) +
                 " block checksums that no chunk uses");
    }
    if (next_stored != Size(stored_v)) {
      return Bad(Where() + ": has " + std::to_string(Size(stored_v) - next_stored) +
                 " stored blocks that no compressed chunk uses");
    }
    if (!whole_in_one) {
      Status tiling = CheckExactTiling(shape, boxes_);
      if (!tiling.ok()) {
        return Fail(tiling.code(),
                    Where() + ": chunks do not tile the shape " + ShapeString(shape) + " exactly: " + tiling.message());
      }
    }
    return OkStatus();
  }

  // Format 3.0: how chunk i (of `length` bytes) is stored. Returns the bytes it takes in its data file. A compressed
  // chunk's blocks follow the previous one's (*next_stored), one per checksum block, each no larger than the block it
  // decodes to and at least one byte, and they add up to stored_length.
  Result<uint64_t> CheckCoding(size_t i, const fb::ChunkCoding& c, uint64_t length,
                               const flatbuffers::Vector<const fb::StoredBlock*>* stored_v, uint64_t* next_stored) {
    const auto codec = static_cast<uint8_t>(c.codec());
    if (codec == static_cast<uint8_t>(Codec::kRaw)) {
      if (c.first_stored() != kNoBlockTable || c.stored_length() != length) {
        return Bad(ChunkWhere(i) + "is stored raw but has stored length " + std::to_string(c.stored_length()) +
                   " (its length is " + std::to_string(length) + ") or stored blocks");
      }
      return length;
    }
    if (codec != static_cast<uint8_t>(Codec::kZstdGrouped)) {
      const bool newer_minor = m_->format_minor() > KnownMinor(m_->format_major());
      return Fail(newer_minor ? StatusCode::kVersion : StatusCode::kCorrupt,
                  ChunkWhere(i) + "unknown codec " + std::to_string(codec) +
                      (newer_minor ? " (written by a newer format minor version; upgrade distckpt)" : ""));
    }
    if (length == 0) return Bad(ChunkWhere(i) + "is empty but marked compressed");
    const uint64_t nb = NumChecksumBlocks(length, block_size_);
    const uint64_t n_stored = Size(stored_v);
    const uint32_t first = c.first_stored();
    if (first != *next_stored || first > n_stored || nb > n_stored - first) {
      return Bad(ChunkWhere(i) + "stored blocks [" + std::to_string(first) + ", +" + std::to_string(nb) +
                 ") are out of range or out of order (expected to start at " + std::to_string(*next_stored) + " of " +
                 std::to_string(n_stored) + " stored blocks)");
    }
    *next_stored = first + nb;
    uint64_t total = 0;
    for (uint64_t b = 0; b < nb; ++b) {
      const uint64_t size = stored_v->Get(static_cast<flatbuffers::uoffset_t>(first + b))->size();
      const uint64_t decoded = std::min(block_size_, length - b * block_size_);
      if (size == 0 || size > decoded) {
        return Bad(ChunkWhere(i) + "stored block #" + std::to_string(b) + " is " + std::to_string(size) +
                   " bytes for " + std::to_string(decoded) + " decoded bytes (1 to " + std::to_string(decoded) + ")");
      }
      total += size;  // <= length: no overflow
    }
    if (total != c.stored_length()) {
      return Bad(ChunkWhere(i) + "stored length " + std::to_string(c.stored_length()) + " is not the " +
                 std::to_string(total) + " bytes of its stored blocks");
    }
    return total;
  }

  static std::string ShapeString(Span<const uint64_t> shape) {
    std::string s = "[";
    for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
    return s + "]";
  }

  static std::string BoxString(const uint64_t* off, const uint64_t* len, size_t ndim) {
    std::string s = "[";
    for (size_t d = 0; d < ndim; ++d) {
      s += (d ? ", " : "") + std::to_string(off[d]) + ":";
      s += off[d] > UINT64_MAX - len[d] ? "overflow" : std::to_string(off[d] + len[d]);
    }
    return s + "]";
  }

  const fb::Metadata* m_;
  uint64_t buffer_size_;
  const std::string& context_;
  uint64_t block_size_ = 0;
  uint64_t alignment_ = 0;
  const bool foreign_;
  uint64_t visited_bytes_ = 0;
  std::string_view entry_name_;       // the entry being checked, for messages
  std::vector<Box> boxes_;            // reused across entries
  std::vector<uint64_t> file_sizes_;  // Metadata.files[i].size, read once
  size_t num_bases_ = 0;
};

}  // namespace

// ---- EntryView ----

Box EntryView::chunk_box(size_t i) const {
  Box b;
  b.ndim = ndim();
  for (uint32_t d = 0; d < b.ndim; ++d) {
    b.offset[d] = chunk_offsets[i * b.ndim + d];
    b.length[d] = chunk_lengths[i * b.ndim + d];
  }
  return b;
}

ChunkLocation EntryView::chunk(size_t i) const {
  const fb::ChunkLoc& c = static_cast<const fb::ChunkLoc*>(chunk_locs)[i];
  ChunkLocation loc;
  loc.offset = c.offset();
  loc.length = c.length();
  loc.checksum = c.checksum();
  loc.file = c.file();
  loc.first_block = c.first_block();
  return loc;
}

ChunkCoding EntryView::coding(size_t i) const {
  if (!codings.empty()) return codings[i];
  ChunkCoding raw;
  raw.stored_length = chunk(i).length;
  return raw;
}

Span<const StoredBlock> EntryView::stored(size_t i) const {
  if (!compressed(i)) return Span<const StoredBlock>();
  // Validated: one per checksum block, inside stored_blocks.
  return Span<const StoredBlock>(stored_blocks.data() + codings[i].first_stored,
                                 static_cast<size_t>(NumChecksumBlocks(chunk(i).length, block_size)));
}

uint64_t EntryView::nbytes() const {
  uint64_t n = DTypeSize(dtype);
  for (uint64_t s : shape) n *= s;  // validated not to overflow
  return n;
}

// ---- MetadataView ----

Result<MetadataView> MetadataView::Parse(std::shared_ptr<const std::string> buffer, const std::string& context) {
  if (buffer == nullptr) return Status(StatusCode::kInvalidArgument, "MetadataView::Parse: null buffer");
  const void* data = buffer->data();
  const size_t size = buffer->size();
  if (reinterpret_cast<uintptr_t>(data) % 8 != 0) {
    // A short string's bytes live inside the string object (libc++ puts them at offset 1): a few bytes that cannot
    // be metadata, but they deserve the verdict on their contents (truncated, naming `context`), so an aligned copy.
    auto copy = std::make_shared<std::vector<uint64_t>>((size + 7) / 8);
    std::memcpy(copy->data(), data, size);
    const void* aligned = copy->data();
    return Parse(std::shared_ptr<const void>(std::move(copy)), aligned, size, context);
  }
  return Parse(std::shared_ptr<const void>(std::move(buffer)), data, size, context);
}

Result<MetadataView> MetadataView::Parse(std::shared_ptr<const void> owner, const void* bytes, size_t size,
                                         const std::string& context) {
  return ParseImpl(std::move(owner), bytes, size, context, /*foreign=*/false);
}

Result<MetadataView> MetadataView::ParseForeign(std::shared_ptr<const std::string> buffer, const std::string& context) {
  if (buffer == nullptr) return Status(StatusCode::kInvalidArgument, "MetadataView::ParseForeign: null buffer");
  const void* data = buffer->data();
  const size_t size = buffer->size();
  return ParseImpl(std::shared_ptr<const void>(std::move(buffer)), data, size, context, /*foreign=*/true);
}

Result<MetadataView> MetadataView::ParseImpl(std::shared_ptr<const void> owner, const void* bytes, size_t size,
                                             const std::string& context, bool foreign) {
  auto fail = [&context](StatusCode code, const std::string& msg) {
    return Status(code, context.empty() ? msg : context + ": " + msg);
  };
  if (owner == nullptr || (bytes == nullptr && size > 0)) {
    return Status(StatusCode::kInvalidArgument, "MetadataView::Parse: null buffer");
  }
  const auto* data = static_cast<const uint8_t*>(bytes);
  if (size >= kMaxMetadataBytes || size >= FLATBUFFERS_MAX_BUFFER_SIZE) {
    return fail(StatusCode::kCorrupt, "metadata is " + std::to_string(size) + " bytes; the limit is " +
                                          std::to_string(kMaxMetadataBytes - 1));
  }
  // Heap storage from operator new is 16-aligned and mappings are page-aligned (Parse of a std::string copies the bytes
  // of a short one, which live inside the string object); zero-copy 64-bit views need at least 8.
  if (reinterpret_cast<uintptr_t>(data) % 8 != 0) {
    return Status(StatusCode::kInvalidArgument, "MetadataView::Parse: buffer is not 8-byte aligned in memory");
  }
  if (size < 8) {
    return fail(StatusCode::kCorrupt,
                "metadata is truncated (" + std::to_string(size) + " bytes) or not a distckpt metadata file");
  }
  // The trailer comes first: once it matches, no byte of the file is damaged, so every later error is a real
  // property of the file. FORMAT.md pins the trailer for every later version, so a mismatch is corruption even in a
  // file whose version this reader does not know.
  std::optional<uint64_t> checksum;
  if (size >= 8 + kMetadataTrailerBytes && std::memcmp(data + size - 8, kMetadataTrailerMagic, 8) == 0) {
    size -= kMetadataTrailerBytes;
    uint64_t stored;
    std::memcpy(&stored, data + size, 8);  // little-endian host (static_assert above)
    const uint64_t computed = Xxh3(data, size);
    if (stored != computed) {
      char hex[64];
      std::snprintf(hex, sizeof hex, "stored %016llx, computed %016llx", static_cast<unsigned long long>(stored),
                    static_cast<unsigned long long>(computed));
      return fail(StatusCode::kCorrupt, std::string("metadata checksum mismatch (") + hex +
                                            "): the file is damaged; restore it from a copy or re-save");
    }
    checksum = stored;
  }
  if (!flatbuffers::BufferHasIdentifier(data, fb::MetadataIdentifier())) {
    return fail(StatusCode::kCorrupt, "not a distckpt metadata file (file identifier is not \"" +
                                          std::string(kMetadataFileIdentifier) + "\")");
  }

  // Read format_major on its own first, so that a future major version whose layout this reader cannot verify is
  // reported as a version error, not as corruption. FORMAT.md pins format_major to field 0 forever.
  {
    flatbuffers::Verifier probe(data, size, kMaxVerifierDepth, 16);
    if (!probe.Verify<flatbuffers::uoffset_t>(0)) return fail(StatusCode::kCorrupt, "metadata root is out of bounds");
    const auto* root = flatbuffers::GetRoot<flatbuffers::Table>(data);
    if (probe.VerifyOffset(0) == 0 || !root->VerifyTableStart(probe) ||
        !root->VerifyField<uint16_t>(probe, fb::Metadata::VT_FORMAT_MAJOR, 2) ||
        !root->VerifyField<uint16_t>(probe, fb::Metadata::VT_FORMAT_MINOR, 2)) {
      return fail(StatusCode::kCorrupt, "metadata root table is malformed");
    }
    const uint16_t major = root->GetField<uint16_t>(fb::Metadata::VT_FORMAT_MAJOR, 0);
    const uint16_t minor = root->GetField<uint16_t>(fb::Metadata::VT_FORMAT_MINOR, 0);
    if (major == 0) return fail(StatusCode::kCorrupt, "metadata has no format version");
    if (major != kFormatMajor && major != kFormatMajorReferences && major != kFormatMajorCompression) {
      return fail(StatusCode::kVersion, "format version " + std::to_string(major) + "." + std::to_string(minor) +
                                            " is not supported; this reader supports major versions " +
                                            std::to_string(kFormatMajor) + " to " +
                                            std::to_string(kFormatMajorCompression) + " (upgrade distckpt to read it)");
    }
  }

  // Every table takes at least 4 bytes, so this bounds the verifier's work by the buffer size even if tables are
  // shared.
  const auto max_tables = static_cast<flatbuffers::uoffset_t>(size / 4 + 16);
  flatbuffers::Verifier verifier(data, size, kMaxVerifierDepth, max_tables);
  if (!fb::VerifyMetadataBuffer(verifier)) {
    return fail(StatusCode::kCorrupt,
                "metadata failed FlatBuffers verification (truncated or corrupt: an offset, length or required "
                "field is invalid)");
  }
  const fb::Metadata* root = fb::GetMetadata(data);
  if (!checksum && (root->format_minor() >= 1 || root->format_major() > 1)) {
    // 1.1 and later always end with the trailer: without it the file was truncated or its last bytes damaged.
    return fail(StatusCode::kCorrupt, "metadata of format " + std::to_string(root->format_major()) + "." +
                                          std::to_string(root->format_minor()) +
                                          " has no checksum trailer: the file is truncated or damaged");
  }
  DCKPT_RETURN_IF_ERROR(Validator(root, size, context, foreign).Run());
  return MetadataView(std::move(owner), checksum ? size + kMetadataTrailerBytes : size, root, checksum);
}

uint16_t MetadataView::format_major() const { return Root(root_)->format_major(); }
uint16_t MetadataView::format_minor() const { return Root(root_)->format_minor(); }
std::string_view MetadataView::writer() const { return View(Root(root_)->writer()); }
uint64_t MetadataView::checksum_block_size() const { return Root(root_)->checksum_block_size(); }
uint64_t MetadataView::alignment() const { return Root(root_)->alignment(); }

size_t MetadataView::num_files() const { return Size(Root(root_)->files()); }
std::string_view MetadataView::file_name(size_t i) const {
  return View(Root(root_)->files()->Get(static_cast<flatbuffers::uoffset_t>(i))->name());
}
uint64_t MetadataView::file_size(size_t i) const {
  return Root(root_)->files()->Get(static_cast<flatbuffers::uoffset_t>(i))->size();
}
uint32_t MetadataView::file_base(size_t i) const {
  return Root(root_)->files()->Get(static_cast<flatbuffers::uoffset_t>(i))->base();
}

size_t MetadataView::num_bases() const { return Size(Root(root_)->bases()); }
std::string_view MetadataView::base_name(size_t k) const {
  return View(Root(root_)->bases()->Get(static_cast<flatbuffers::uoffset_t>(k))->name());
}
uint64_t MetadataView::base_metadata_checksum(size_t k) const {
  return Root(root_)->bases()->Get(static_cast<flatbuffers::uoffset_t>(k))->metadata_checksum();
}
uint64_t MetadataView::base_metadata_size(size_t k) const {
  return Root(root_)->bases()->Get(static_cast<flatbuffers::uoffset_t>(k))->metadata_size();
}
uint32_t MetadataView::chain_length() const { return Root(root_)->chain_length(); }

size_t MetadataView::num_entries() const { return Size(Root(root_)->entries()); }

EntryView MetadataView::entry(size_t i) const {
  const fb::Entry* e = Root(root_)->entries()->Get(static_cast<flatbuffers::uoffset_t>(i));
  EntryView v;
  v.name = View(e->name());
  v.kind = static_cast<EntryKind>(e->kind());
  v.dtype = static_cast<DType>(e->dtype());
  v.shape = Span<const uint64_t>(Data(e->shape()), Size(e->shape()));
  v.num_chunks = Size(e->chunks());
  v.chunk_offsets = Data(e->chunk_offsets());
  v.chunk_lengths = Data(e->chunk_lengths());
  v.chunk_locs = Data(e->chunks());
  v.block_checksums = Span<const uint64_t>(Data(e->block_checksums()), Size(e->block_checksums()));
  v.chunk_hashes =
      Span<const ChunkHash>(reinterpret_cast<const ChunkHash*>(Data(e->chunk_hashes())), Size(e->chunk_hashes()));
  v.codings =
      Span<const ChunkCoding>(reinterpret_cast<const ChunkCoding*>(Data(e->chunk_codings())), Size(e->chunk_codings()));
  v.stored_blocks =
      Span<const StoredBlock>(reinterpret_cast<const StoredBlock*>(Data(e->stored_blocks())), Size(e->stored_blocks()));
  v.block_size = Root(root_)->checksum_block_size();
  return v;
}

std::optional<size_t> MetadataView::Find(std::string_view name) const {
  const auto* entries = Root(root_)->entries();
  size_t lo = 0, hi = Size(entries);
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    const int c = View(entries->Get(static_cast<flatbuffers::uoffset_t>(mid))->name()).compare(name);
    if (c == 0) return mid;
    if (c < 0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return std::nullopt;
}

size_t MetadataView::num_user() const { return Size(Root(root_)->user()); }

std::pair<std::string_view, std::string_view> MetadataView::user(size_t i) const {
  const fb::KeyValue* kv = Root(root_)->user()->Get(static_cast<flatbuffers::uoffset_t>(i));
  return {View(kv->key()), View(kv->value())};
}

std::optional<std::string_view> MetadataView::FindUser(std::string_view key) const {
  const auto* user = Root(root_)->user();
  size_t lo = 0, hi = Size(user);
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    const fb::KeyValue* kv = user->Get(static_cast<flatbuffers::uoffset_t>(mid));
    const int c = View(kv->key()).compare(key);
    if (c == 0) return View(kv->value());
    if (c < 0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return std::nullopt;
}

std::string_view MetadataView::structure() const { return View(Root(root_)->structure()); }
std::string_view MetadataView::source() const { return View(Root(root_)->source()); }

MetadataRecord MetadataView::ToRecord() const {
  MetadataRecord r;
  r.writer = std::string(writer());
  r.checksum_block_size = checksum_block_size();
  r.alignment = alignment();
  r.structure = std::string(structure());
  r.source = std::string(source());
  r.files.reserve(num_files());
  for (size_t i = 0; i < num_files(); ++i) r.files.push_back({std::string(file_name(i)), file_size(i), file_base(i)});
  for (size_t k = 0; k < num_bases(); ++k) {
    r.bases.push_back({std::string(base_name(k)), base_metadata_checksum(k), base_metadata_size(k)});
  }
  r.chain_length = chain_length();
  r.user.reserve(num_user());
  for (size_t i = 0; i < num_user(); ++i) {
    const auto [key, value] = user(i);
    r.user.emplace_back(std::string(key), std::string(value));
  }
  r.entries.reserve(num_entries());
  for (size_t i = 0; i < num_entries(); ++i) {
    const EntryView v = entry(i);
    EntryRecord e;
    e.name = std::string(v.name);
    e.kind = v.kind;
    e.dtype = v.dtype;
    e.shape.assign(v.shape.begin(), v.shape.end());
    e.chunk_offsets.assign(v.chunk_offsets, v.chunk_offsets + v.num_chunks * v.ndim());
    e.chunk_lengths.assign(v.chunk_lengths, v.chunk_lengths + v.num_chunks * v.ndim());
    e.chunks.reserve(v.num_chunks);
    for (size_t c = 0; c < v.num_chunks; ++c) e.chunks.push_back(v.chunk(c));
    e.block_checksums.assign(v.block_checksums.begin(), v.block_checksums.end());
    e.chunk_hashes.assign(v.chunk_hashes.begin(), v.chunk_hashes.end());
    e.codings.assign(v.codings.begin(), v.codings.end());
    e.stored_blocks.assign(v.stored_blocks.begin(), v.stored_blocks.end());
    r.entries.push_back(std::move(e));
  }
  return r;
}

// ---- Encoding ----

namespace {

// Upper bound on the encoded size, so that a record too large for FlatBuffers is refused before the builder
// (which asserts on overflow) sees it.
uint64_t EstimateEncodedSize(const MetadataRecord& r) {
  auto str = [](const std::string& s) -> uint64_t { return s.size() + 16; };
  uint64_t n = 256 + str(r.writer) + str(r.structure);
  for (const auto& f : r.files) n += str(f.name) + 48;
  for (const auto& base : r.bases) n += str(base.name) + 48;
  for (const auto& kv : r.user) n += str(kv.first) + str(kv.second) + 32;
  for (const auto& e : r.entries) {
    n += str(e.name) + 128 +
         8 * (e.shape.size() + e.chunk_offsets.size() + e.chunk_lengths.size() + e.block_checksums.size()) +
         32 * e.chunks.size() + 16 * (e.chunk_hashes.size() + e.codings.size() + e.stored_blocks.size()) + 8 * 16;
  }
  return n;
}

// Rewrites each entry's block table in chunk order without gaps (the only layout readers accept), whatever order
// the writer filled it in. Single-block chunks get kNoBlockTable.
Status CanonicalizeBlockTables(MetadataRecord* r) {
  std::vector<uint64_t> blocks;
  for (EntryRecord& e : r->entries) {
    bool any = false;
    for (const ChunkLocation& c : e.chunks) any = any || NumChecksumBlocks(c.length, r->checksum_block_size) > 1;
    if (!any) {
      for (ChunkLocation& c : e.chunks) c.first_block = kNoBlockTable;
      e.block_checksums.clear();
      continue;
    }
    blocks.clear();
    for (size_t i = 0; i < e.chunks.size(); ++i) {
      ChunkLocation& c = e.chunks[i];
      const uint64_t nb = NumChecksumBlocks(c.length, r->checksum_block_size);
      if (nb == 1) {
        c.first_block = kNoBlockTable;
        continue;
      }
      if (c.first_block == kNoBlockTable || c.first_block > e.block_checksums.size() ||
          nb > e.block_checksums.size() - c.first_block) {
        return InvalidArgument("entry " + Quote(e.name) + " chunk #" + std::to_string(i) + " has " +
                               std::to_string(nb) + " checksum blocks but its block table is missing or out of range");
      }
      const uint64_t first = blocks.size();
      if (first + nb >= kNoBlockTable) {
        return InvalidArgument("entry " + Quote(e.name) + " has too many checksum blocks");
      }
      blocks.insert(blocks.end(), e.block_checksums.begin() + c.first_block,
                    e.block_checksums.begin() + c.first_block + nb);
      c.first_block = static_cast<uint32_t>(first);
    }
    e.block_checksums.swap(blocks);
  }
  return OkStatus();
}

// The same for the stored blocks of compressed chunks (format 3.0); an entry whose chunks are all raw gets no codings.
Status CanonicalizeStoredBlocks(MetadataRecord* r) {
  std::vector<StoredBlock> stored;
  for (EntryRecord& e : r->entries) {
    bool any = false;
    for (const ChunkCoding& c : e.codings) any = any || !c.raw();
    if (!any) {
      e.codings.clear();
      e.stored_blocks.clear();
      continue;
    }
    if (e.codings.size() != e.chunks.size()) {
      return InvalidArgument("entry " + Quote(e.name) + " has " + std::to_string(e.codings.size()) +
                             " chunk codings for " + std::to_string(e.chunks.size()) + " chunks");
    }
    stored.clear();
    for (size_t i = 0; i < e.chunks.size(); ++i) {
      ChunkCoding& c = e.codings[i];
      if (c.raw()) {
        c.first_stored = kNoBlockTable;
        continue;
      }
      const uint64_t nb = NumChecksumBlocks(e.chunks[i].length, r->checksum_block_size);
      if (c.first_stored == kNoBlockTable || c.first_stored > e.stored_blocks.size() ||
          nb > e.stored_blocks.size() - c.first_stored) {
        return InvalidArgument("entry " + Quote(e.name) + " chunk #" + std::to_string(i) +
                               " is compressed but its stored blocks are missing or out of range");
      }
      const uint64_t first = stored.size();
      if (first + nb >= kNoBlockTable) return InvalidArgument("entry " + Quote(e.name) + " has too many stored blocks");
      stored.insert(stored.end(), e.stored_blocks.begin() + c.first_stored,
                    e.stored_blocks.begin() + c.first_stored + nb);
      c.first_stored = static_cast<uint32_t>(first);
    }
    e.stored_blocks.swap(stored);
  }
  return OkStatus();
}

template <typename T>
flatbuffers::Offset<flatbuffers::Vector<T>> VectorOrNull(flatbuffers::FlatBufferBuilder& b, const std::vector<T>& v) {
  if (v.empty()) return 0;  // absent == empty for readers; saves 4-8 bytes per vector
  return b.CreateVector(v.data(), v.size());
}

}  // namespace

Result<std::string> EncodeMetadata(MetadataRecord record) {
  std::sort(record.entries.begin(), record.entries.end(),
            [](const EntryRecord& a, const EntryRecord& b) { return a.name < b.name; });
  std::sort(record.user.begin(), record.user.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (record.source.empty()) {
    DCKPT_RETURN_IF_ERROR(CanonicalizeBlockTables(&record));
    DCKPT_RETURN_IF_ERROR(CanonicalizeStoredBlocks(&record));
  }
  const uint64_t estimate = EstimateEncodedSize(record);
  if (estimate >= kMaxMetadataBytes) {
    return InvalidArgument("metadata would be about " + std::to_string(estimate) + " bytes; the format's limit is " +
                           std::to_string(kMaxMetadataBytes - 1) + " (use fewer, larger chunks)");
  }

  // Every call below is its own statement so the byte layout does not depend on the compiler's argument
  // evaluation order: the same record always encodes to the same bytes.
  flatbuffers::FlatBufferBuilder b(static_cast<size_t>(std::min<uint64_t>(estimate, 1 << 30)));

  // Pass 1: the entries' numeric vectors. FlatBuffers builds back to front, so the first object created ends the
  // buffer; a 64-bit vector or a struct vector needs no trailing padding, so the buffer's last bytes are always
  // data the verifier checks and a truncated file never parses (a string first could leave zero padding last).
  struct EntryVectors {
    flatbuffers::Offset<flatbuffers::Vector<uint64_t>> shape, offsets, lengths, blocks;
    flatbuffers::Offset<flatbuffers::Vector<const fb::ChunkLoc*>> chunks;
    flatbuffers::Offset<flatbuffers::Vector<const fb::Hash128*>> hashes;
    flatbuffers::Offset<flatbuffers::Vector<const fb::ChunkCoding*>> codings;
    flatbuffers::Offset<flatbuffers::Vector<const fb::StoredBlock*>> stored;
  };
  std::vector<EntryVectors> vecs(record.entries.size());
  for (size_t i = 0; i < record.entries.size(); ++i) {
    const EntryRecord& e = record.entries[i];
    EntryVectors& v = vecs[i];
    if (!e.stored_blocks.empty()) {
      v.stored = b.CreateVectorOfStructs(reinterpret_cast<const fb::StoredBlock*>(e.stored_blocks.data()),
                                         e.stored_blocks.size());
    }
    if (!e.codings.empty()) {
      v.codings = b.CreateVectorOfStructs(reinterpret_cast<const fb::ChunkCoding*>(e.codings.data()), e.codings.size());
    }
    if (!e.chunk_hashes.empty()) {
      v.hashes =
          b.CreateVectorOfStructs(reinterpret_cast<const fb::Hash128*>(e.chunk_hashes.data()), e.chunk_hashes.size());
    }
    if (!e.chunks.empty()) {
      // ChunkLocation has ChunkLoc's exact byte layout (static_asserts at the top): one memcpy, 8-byte aligned.
      v.chunks = b.CreateVectorOfStructs(reinterpret_cast<const fb::ChunkLoc*>(e.chunks.data()), e.chunks.size());
    }
    v.shape = VectorOrNull(b, e.shape);
    v.offsets = VectorOrNull(b, e.chunk_offsets);
    v.lengths = VectorOrNull(b, e.chunk_lengths);
    v.blocks = VectorOrNull(b, e.block_checksums);
  }
  // No numeric vector at all (no chunks anywhere): end the buffer with an explicitly empty vector instead, whose
  // 4-byte length the verifier needs. Empty and absent vectors mean the same to readers.
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Entry>>> entries_vec = 0;
  if (b.GetSize() == 0) {
    if (!vecs.empty()) {
      vecs[0].chunks = b.CreateVectorOfStructs<fb::ChunkLoc>(nullptr, 0);
    } else {
      entries_vec = b.CreateVector(std::vector<flatbuffers::Offset<fb::Entry>>());
    }
  }

  // Pass 2: strings and tables.
  std::vector<flatbuffers::Offset<fb::DataFile>> files;
  files.reserve(record.files.size());
  for (const DataFileRecord& f : record.files) {
    const auto name = b.CreateString(f.name);
    files.push_back(fb::CreateDataFile(b, name, f.size, f.base));
  }
  std::vector<flatbuffers::Offset<fb::BaseRef>> bases;
  bases.reserve(record.bases.size());
  for (const BaseRecord& base : record.bases) {
    const auto name = b.CreateString(base.name);
    bases.push_back(fb::CreateBaseRef(b, name, base.metadata_checksum, base.metadata_size));
  }
  std::vector<flatbuffers::Offset<fb::KeyValue>> user;
  user.reserve(record.user.size());
  for (const auto& kv : record.user) {
    const auto key = b.CreateString(kv.first);
    const auto value = b.CreateString(kv.second);
    user.push_back(fb::CreateKeyValue(b, key, value));
  }
  std::vector<flatbuffers::Offset<fb::Entry>> entries;
  entries.reserve(record.entries.size());
  for (size_t i = 0; i < record.entries.size(); ++i) {
    const EntryRecord& e = record.entries[i];
    const EntryVectors& v = vecs[i];
    const auto name = b.CreateString(e.name);
    entries.push_back(fb::CreateEntry(b, name, static_cast<fb::EntryKind>(e.kind), static_cast<fb::DType>(e.dtype),
                                      v.shape, v.offsets, v.lengths, v.chunks, v.blocks, v.hashes, v.codings,
                                      v.stored));
  }
  const auto writer = b.CreateString(record.writer);
  const auto structure = b.CreateString(record.structure);
  const auto files_vec = b.CreateVector(files);
  if (entries_vec.IsNull()) entries_vec = b.CreateVector(entries);
  const auto user_vec = b.CreateVector(user);
  const auto source = record.source.empty() ? 0 : b.CreateString(record.source);
  const auto bases_vec = bases.empty() ? 0 : b.CreateVector(bases);
  // A checkpoint with compressed chunks is 3.0 and one that refers to others 2.0, which older readers refuse; every
  // other one stays 1.x (section 7).
  bool compressed = false;
  for (const EntryRecord& e : record.entries) compressed = compressed || !e.codings.empty();
  const bool refers = !record.bases.empty();
  const uint16_t major = compressed ? kFormatMajorCompression : refers ? kFormatMajorReferences : kFormatMajor;
  const uint16_t minor = compressed ? kFormatMinorCompression : refers ? kFormatMinorReferences : kFormatMinor;
  const auto root = fb::CreateMetadata(b, major, minor, writer, record.checksum_block_size, record.alignment, files_vec,
                                       entries_vec, user_vec, structure, source, bases_vec, record.chain_length);
  fb::FinishMetadataBuffer(b, root);

  // A writer must never produce a file its reader rejects: run the full reader over the result.
  auto buffer = std::make_shared<std::string>(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
  AppendMetadataTrailer(buffer.get());
  {
    Result<MetadataView> check = record.source.empty()
                                     ? MetadataView::Parse(buffer, "metadata being written")
                                     : MetadataView::ParseForeign(buffer, "foreign checkpoint's description");
    if (!check.ok()) return Status(StatusCode::kInvalidArgument, check.status().message());
  }
  return std::move(*buffer);
}

void AppendMetadataTrailer(std::string* bytes) {
  const uint64_t sum = Xxh3(bytes->data(), bytes->size());
  char le[8];
  std::memcpy(le, &sum, 8);  // little-endian host
  bytes->append(le, 8);
  bytes->append(kMetadataTrailerMagic, 8);
}

bool IsValidFileName(std::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  if (name == "." || name == "..") return false;
  if (name.find("..") != std::string_view::npos) return false;  // no ".." component, and no lookalikes either
  for (char ch : name) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f) return false;  // separators, NUL and control characters
  }
  return IsValidUtf8(name);
}

}  // namespace distckpt
