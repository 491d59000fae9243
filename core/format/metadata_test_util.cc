#include "core/format/metadata_test_util.h"

#include <map>

#include "core/format/checksum.h"
#include "core/format/schema_generated.h"
#include "flatbuffers/flatbuffers.h"

namespace distckpt {
namespace testing_util {
namespace {

uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Appends an entry whose chunks are `boxes` (offsets, lengths), placing chunks round-robin over the record's files
// at aligned offsets and filling in checksums and canonical block tables.
void AddEntry(MetadataRecord* r, std::map<uint32_t, uint64_t>* next_offset, const std::string& name, EntryKind kind,
              DType dtype, std::vector<uint64_t> shape,
              const std::vector<std::pair<std::vector<uint64_t>, std::vector<uint64_t>>>& boxes) {
  EntryRecord e;
  e.name = name;
  e.kind = kind;
  e.dtype = dtype;
  e.shape = std::move(shape);
  for (const auto& [off, len] : boxes) {
    e.chunk_offsets.insert(e.chunk_offsets.end(), off.begin(), off.end());
    e.chunk_lengths.insert(e.chunk_lengths.end(), len.begin(), len.end());
    uint64_t bytes = DTypeSize(dtype);
    for (uint64_t l : len) bytes *= l;
    ChunkLocation c;
    c.file = static_cast<uint32_t>((r->entries.size() + e.chunks.size()) % r->files.size());
    c.offset = (*next_offset)[c.file];
    (*next_offset)[c.file] += RoundUp(bytes == 0 ? 1 : bytes, r->alignment);
    c.length = bytes;
    const uint64_t nb = NumChecksumBlocks(bytes, r->checksum_block_size);
    if (nb == 1) {
      c.checksum = 0x1000 + e.chunks.size();
      c.first_block = kNoBlockTable;
    } else {
      c.first_block = static_cast<uint32_t>(e.block_checksums.size());
      for (uint64_t k = 0; k < nb; ++k) e.block_checksums.push_back(0xb10c0000 + e.block_checksums.size());
      c.checksum = CombineBlockChecksums(Span<const uint64_t>(e.block_checksums.data() + c.first_block, nb));
    }
    e.chunks.push_back(c);
  }
  r->entries.push_back(std::move(e));
}

}  // namespace

MetadataRecord ValidRecord() {
  MetadataRecord r;
  r.writer = "distckpt-test 0.0.0";
  r.checksum_block_size = 4096;
  r.alignment = 4096;
  r.files = {{"data-00000.bin", 0}, {"data-00001.bin", 0}};
  std::map<uint32_t, uint64_t> next;
  using V = std::vector<uint64_t>;
  AddEntry(&r, &next, "a.bias", EntryKind::kTensor, DType::kF32, {10}, {{V{0}, V{10}}});
  AddEntry(&r, &next, "a.weight", EntryKind::kTensor, DType::kBF16, {4, 6},
           {{V{0, 0}, V{2, 3}}, {V{0, 3}, V{2, 3}}, {V{2, 0}, V{2, 3}}, {V{2, 3}, V{2, 3}}});
  AddEntry(&r, &next, "big", EntryKind::kTensor, DType::kF32, {3000}, {{V{0}, V{3000}}});  // 3 checksum blocks
  AddEntry(&r, &next, "blob", EntryKind::kBytes, DType::kU8, {10}, {{V{0}, V{10}}});
  AddEntry(&r, &next, "c128", EntryKind::kTensor, DType::kC128, {2, 2, 2},
           {{V{0, 0, 0}, V{2, 2, 1}}, {V{0, 0, 1}, V{2, 2, 1}}});
  AddEntry(&r, &next, "empty_blob", EntryKind::kBytes, DType::kU8, {0}, {{V{0}, V{0}}});
  AddEntry(&r, &next, "flags", EntryKind::kTensor, DType::kBool, {3}, {{V{0}, V{3}}});
  // Uneven, non-grid tiling: row bands split differently in columns.
  AddEntry(&r, &next, "irregular", EntryKind::kTensor, DType::kI8, {6, 6},
           {{V{0, 0}, V{2, 1}}, {V{0, 1}, V{2, 5}}, {V{2, 0}, V{4, 4}}, {V{2, 4}, V{4, 2}}});
  AddEntry(&r, &next, "scalar", EntryKind::kTensor, DType::kI64, {}, {{V{}, V{}}});
  AddEntry(&r, &next, "two_big", EntryKind::kTensor, DType::kU8, {10000},
           {{V{0}, V{5000}}, {V{5000}, V{5000}}});  // 2 blocks each
  AddEntry(&r, &next, "u16x8d", EntryKind::kTensor, DType::kU16, {1, 1, 1, 1, 1, 1, 1, 2},
           {{V{0, 0, 0, 0, 0, 0, 0, 0}, V{1, 1, 1, 1, 1, 1, 1, 2}}});
  AddEntry(&r, &next, "zero", EntryKind::kTensor, DType::kF16, {0, 5}, {});
  AddEntry(&r, &next, "zero_chunked", EntryKind::kTensor, DType::kF8E5M2, {3, 0}, {{V{0, 0}, V{3, 0}}});
  for (auto& f : r.files) f.size = next[static_cast<uint32_t>(&f - r.files.data())] + 100;  // some trailing padding
  r.user = {{"framework", "jax"}, {"step", "10"}};
  r.structure = R"({"a":{"bias":"a.bias","weight":"a.weight"}})";
  return r;
}

void CompressSomeChunks(MetadataRecord* record) {
  for (EntryRecord& e : record->entries) {
    if (e.name == "big") {
      e.stored_blocks = {{0x51, 1000}, {0x52, 2000}, {0x53, 3808}};
      e.codings = {ChunkCoding{6808, 0, Codec::kZstdGrouped, {0, 0, 0}}};
    } else if (e.name == "two_big") {
      e.stored_blocks = {{0x61, 100}, {0x62, 904}};
      e.codings = {ChunkCoding{5000, kNoBlockTable, Codec::kRaw, {0, 0, 0}},
                   ChunkCoding{1004, 0, Codec::kZstdGrouped, {0, 0, 0}}};
    }
  }
}

RawMetadata ToRaw(const MetadataRecord& record) {
  RawMetadata m;
  m.writer = record.writer;
  m.checksum_block_size = record.checksum_block_size;
  m.alignment = record.alignment;
  for (const auto& f : record.files) m.files.push_back({f.name, f.size, f.base});
  for (const auto& base : record.bases) m.bases.push_back({base.name, base.metadata_checksum, base.metadata_size});
  m.chain_length = record.chain_length;
  if (!record.bases.empty()) m.format_major = kFormatMajorReferences, m.format_minor = kFormatMinorReferences;
  for (const auto& e : record.entries) {
    if (!e.codings.empty()) m.format_major = kFormatMajorCompression, m.format_minor = kFormatMinorCompression;
  }
  for (const auto& e : record.entries) {
    RawEntry r;
    r.name = e.name;
    r.kind = static_cast<uint8_t>(e.kind);
    r.dtype = static_cast<uint8_t>(e.dtype);
    r.shape = e.shape;
    r.chunk_offsets = e.chunk_offsets;
    r.chunk_lengths = e.chunk_lengths;
    r.chunks = e.chunks;
    r.block_checksums = e.block_checksums;
    r.chunk_hashes = e.chunk_hashes;
    r.codings = e.codings;
    r.stored_blocks = e.stored_blocks;
    m.entries.push_back(std::move(r));
  }
  m.user = record.user;
  m.structure = record.structure;
  return m;
}

std::string RawEncode(const RawMetadata& m) {
  flatbuffers::FlatBufferBuilder b;
  using flatbuffers::Offset;
  using flatbuffers::Vector;
  const flatbuffers::voffset_t kUnknownScalar = flatbuffers::FieldIndexToOffset(40);
  const flatbuffers::voffset_t kUnknownString = flatbuffers::FieldIndexToOffset(41);

  std::vector<Offset<fb::DataFile>> files;
  for (const RawFile& f : m.files) {
    Offset<flatbuffers::String> name = 0;
    if (f.name) name = b.CreateString(*f.name);
    const auto start = b.StartTable();
    if (f.name) b.AddOffset(fb::DataFile::VT_NAME, name);
    b.AddElement<uint64_t>(fb::DataFile::VT_SIZE, f.size, 0);
    b.AddElement<uint32_t>(fb::DataFile::VT_BASE, f.base, 0);
    files.push_back(Offset<fb::DataFile>(b.EndTable(start)));
  }
  std::vector<Offset<fb::KeyValue>> user;
  for (const auto& kv : m.user) {
    const auto key = b.CreateString(kv.first);
    const Offset<flatbuffers::String> value = m.omit_optional_strings ? 0 : b.CreateString(kv.second);
    user.push_back(fb::CreateKeyValue(b, key, value));
  }
  std::vector<Offset<fb::Entry>> entries;
  Offset<Vector<uint64_t>> shared_offsets = 0, shared_lengths = 0;
  Offset<Vector<const fb::ChunkLoc*>> shared_chunks = 0;
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const RawEntry& e = m.entries[i];
    Offset<flatbuffers::String> name = 0;
    if (e.name) name = b.CreateString(*e.name);
    const auto shape = b.CreateVector(e.shape);
    Offset<Vector<uint64_t>> offsets = shared_offsets, lengths = shared_lengths;
    Offset<Vector<const fb::ChunkLoc*>> chunks = shared_chunks;
    if (!m.share_chunk_vectors || i == 0) {
      offsets = b.CreateVector(e.chunk_offsets);
      lengths = b.CreateVector(e.chunk_lengths);
      std::vector<fb::ChunkLoc> locs;
      for (const auto& c : e.chunks) locs.emplace_back(c.offset, c.length, c.checksum, c.file, c.first_block);
      chunks = b.CreateVectorOfStructs(locs);
    }
    if (m.share_chunk_vectors && i == 0) shared_offsets = offsets, shared_lengths = lengths, shared_chunks = chunks;
    const auto blocks = b.CreateVector(e.block_checksums);
    Offset<Vector<const fb::Hash128*>> hashes = 0;
    if (!e.chunk_hashes.empty()) {
      hashes =
          b.CreateVectorOfStructs(reinterpret_cast<const fb::Hash128*>(e.chunk_hashes.data()), e.chunk_hashes.size());
    }
    Offset<Vector<const fb::ChunkCoding*>> codings = 0;
    if (!e.codings.empty()) {
      codings = b.CreateVectorOfStructs(reinterpret_cast<const fb::ChunkCoding*>(e.codings.data()), e.codings.size());
    }
    Offset<Vector<const fb::StoredBlock*>> stored = 0;
    if (!e.stored_blocks.empty()) {
      stored = b.CreateVectorOfStructs(reinterpret_cast<const fb::StoredBlock*>(e.stored_blocks.data()),
                                       e.stored_blocks.size());
    }
    Offset<flatbuffers::String> extra = 0;
    if (m.unknown_fields) extra = b.CreateString("a field from the future");
    const auto start = b.StartTable();
    if (e.name) b.AddOffset(fb::Entry::VT_NAME, name);
    b.AddElement<uint8_t>(fb::Entry::VT_KIND, e.kind, 0);
    b.AddElement<uint8_t>(fb::Entry::VT_DTYPE, e.dtype, 0);
    b.AddOffset(fb::Entry::VT_SHAPE, shape);
    b.AddOffset(fb::Entry::VT_CHUNK_OFFSETS, offsets);
    b.AddOffset(fb::Entry::VT_CHUNK_LENGTHS, lengths);
    b.AddOffset(fb::Entry::VT_CHUNKS, chunks);
    b.AddOffset(fb::Entry::VT_BLOCK_CHECKSUMS, blocks);
    b.AddOffset(fb::Entry::VT_CHUNK_HASHES, hashes);
    b.AddOffset(fb::Entry::VT_CHUNK_CODINGS, codings);
    b.AddOffset(fb::Entry::VT_STORED_BLOCKS, stored);
    if (m.unknown_fields) {
      b.AddElement<uint64_t>(kUnknownScalar, 0xfeedface, 0);
      b.AddOffset(kUnknownString, extra);
    }
    entries.push_back(Offset<fb::Entry>(b.EndTable(start)));
  }
  const Offset<flatbuffers::String> writer = m.omit_optional_strings ? 0 : b.CreateString(m.writer);
  const Offset<flatbuffers::String> structure = m.omit_optional_strings ? 0 : b.CreateString(m.structure);
  const auto files_vec = b.CreateVector(files);
  const auto entries_vec = b.CreateVector(entries);
  const auto user_vec = b.CreateVector(user);
  Offset<Vector<Offset<fb::BaseRef>>> bases_vec = 0;
  if (!m.bases.empty()) {
    std::vector<Offset<fb::BaseRef>> bases;
    for (const RawBase& base : m.bases) {
      Offset<flatbuffers::String> name = 0;
      if (base.name) name = b.CreateString(*base.name);
      const auto start = b.StartTable();
      if (base.name) b.AddOffset(fb::BaseRef::VT_NAME, name);
      b.AddElement<uint64_t>(fb::BaseRef::VT_METADATA_CHECKSUM, base.metadata_checksum, 0);
      b.AddElement<uint64_t>(fb::BaseRef::VT_METADATA_SIZE, base.metadata_size, 0);
      bases.push_back(Offset<fb::BaseRef>(b.EndTable(start)));
    }
    bases_vec = b.CreateVector(bases);
  }
  Offset<flatbuffers::String> extra = 0;
  if (m.unknown_fields) extra = b.CreateString("another field from the future");
  const auto start = b.StartTable();
  b.AddElement<uint16_t>(fb::Metadata::VT_FORMAT_MAJOR, m.format_major, 0);
  b.AddElement<uint16_t>(fb::Metadata::VT_FORMAT_MINOR, m.format_minor, 0);
  b.AddOffset(fb::Metadata::VT_WRITER, writer);
  b.AddElement<uint64_t>(fb::Metadata::VT_CHECKSUM_BLOCK_SIZE, m.checksum_block_size, 0);
  b.AddElement<uint64_t>(fb::Metadata::VT_ALIGNMENT, m.alignment, 0);
  b.AddOffset(fb::Metadata::VT_FILES, files_vec);
  b.AddOffset(fb::Metadata::VT_ENTRIES, entries_vec);
  b.AddOffset(fb::Metadata::VT_USER, user_vec);
  b.AddOffset(fb::Metadata::VT_STRUCTURE, structure);
  b.AddOffset(fb::Metadata::VT_BASES, bases_vec);
  b.AddElement<uint32_t>(fb::Metadata::VT_CHAIN_LENGTH, m.chain_length, 0);
  if (m.unknown_fields) {
    b.AddElement<uint64_t>(kUnknownScalar, 0xfeedface, 0);
    b.AddOffset(kUnknownString, extra);
  }
  const Offset<fb::Metadata> root(b.EndTable(start));
  fb::FinishMetadataBuffer(b, root);
  std::string out(reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize());
  if (m.trailer) AppendMetadataTrailer(&out);
  return out;
}

}  // namespace testing_util
}  // namespace distckpt
