// The torch.save archive reader. The zip structures follow PKWARE's APPNOTE.TXT (sections 4.3.7 local file header,
// 4.3.12 central directory header, 4.3.14-4.3.16 zip64 end of central directory record and locator, end of central
// directory record; 4.5.3 the zip64 extended information extra field). What torch's writer does, checked on archives
// torch 2.15 wrote: every record is stored (method 0) with a data descriptor (flag bit 3), so the local header's sizes
// are 0 and the central directory's are the real ones; the local header's extra field pads each record's data to 64
// bytes (so its length differs from the central directory's extra field); the zip64 end records are always written.
#include "core/foreign/torch_save.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <unordered_map>
#include <utility>

#include "core/foreign/pickle.h"

namespace distckpt {
namespace {

constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kZip64EocdSig = 0x06064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr size_t kEocdBytes = 22;
constexpr size_t kZip64LocatorBytes = 20;
constexpr size_t kZip64EocdBytes = 56;
constexpr size_t kCentralBytes = 46;
constexpr size_t kLocalBytes = 30;
constexpr uint64_t kMaxComment = 0xffff;
// torch.save of one tensor writes about 7 records (a central directory of under 1 KiB) and a data.pkl of about 200
// bytes; an archive with much more is not one. These bounds keep the work per item small whatever the item holds.
constexpr uint64_t kMaxCentralDirectoryBytes = 64 << 10;
constexpr uint64_t kMaxDataPklBytes = 64 << 10;
// The item's first and last bytes are read once each and kept: they hold everything needed in archives torch writes.
constexpr uint64_t kWindowBytes = 4096;

uint64_t LE(const char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string Quote(std::string_view s) { return QuoteForMessage(s); }

// Reads ranges of the item, relative to its start; every range is checked against the item's length first.
class ItemReader {
 public:
  ItemReader(uint64_t length, std::string context) : length_(length), context_(std::move(context)) {}
  virtual ~ItemReader() = default;
  uint64_t length() const { return length_; }
  const std::string& context() const { return context_; }

  Status Read(uint64_t offset, uint64_t size, std::string* out, const char* what) {
    if (offset > length_ || size > length_ - offset) {
      return Corrupt(context_ + ": the " + std::string(what) + " at [" + std::to_string(offset) + ", +" +
                     std::to_string(size) + ") lies outside the item's " + std::to_string(length_) + " bytes");
    }
    return ReadIn(offset, size, out);
  }

 protected:
  virtual Status ReadIn(uint64_t offset, uint64_t size, std::string* out) = 0;

 private:
  uint64_t length_;
  std::string context_;
};

class MemoryItemReader : public ItemReader {
 public:
  MemoryItemReader(std::string_view item, std::string context)
      : ItemReader(item.size(), std::move(context)), item_(item) {}

 protected:
  Status ReadIn(uint64_t offset, uint64_t size, std::string* out) override {
    out->assign(item_.data() + offset, size);
    return OkStatus();
  }

 private:
  std::string_view item_;
};

// Over a file: the item's head and tail windows are read once and kept; other ranges are read as asked.
class FileItemReader : public ItemReader {
 public:
  FileItemReader(const ReadableFile& file, uint64_t base, uint64_t length, std::string context)
      : ItemReader(length, std::move(context)), file_(file), base_(base) {}

 protected:
  Status ReadIn(uint64_t offset, uint64_t size, std::string* out) override {
    const uint64_t n = length();
    if (n <= 2 * kWindowBytes) {  // small item: one read of all of it
      DCKPT_RETURN_IF_ERROR(Load(&head_, 0, n));
      out->assign(head_.bytes.data() + offset, size);
      return OkStatus();
    }
    Window* w = nullptr;
    if (offset + size <= kWindowBytes) {
      DCKPT_RETURN_IF_ERROR(Load(&head_, 0, kWindowBytes));
      w = &head_;
    } else if (offset >= n - kWindowBytes) {
      DCKPT_RETURN_IF_ERROR(Load(&tail_, n - kWindowBytes, kWindowBytes));
      w = &tail_;
    }
    if (w != nullptr) {
      out->assign(w->bytes.data() + (offset - w->start), size);
      return OkStatus();
    }
    out->resize(size);
    return file_.ReadAt(base_ + offset, out->data(), size);
  }

 private:
  struct Window {
    bool loaded = false;
    uint64_t start = 0;
    std::string bytes;
  };
  Status Load(Window* w, uint64_t start, uint64_t size) {
    if (w->loaded) return OkStatus();
    w->bytes.resize(size);
    DCKPT_RETURN_IF_ERROR(file_.ReadAt(base_ + start, w->bytes.data(), size));
    w->start = start;
    w->loaded = true;
    return OkStatus();
  }
  const ReadableFile& file_;
  uint64_t base_;
  Window head_, tail_;
};

struct Record {
  std::string name;
  uint64_t size = 0;          // stored = uncompressed size
  uint64_t local_header = 0;  // offset of the local header
};

class ArchiveParser {
 public:
  explicit ArchiveParser(ItemReader* r) : r_(r) {}

  Status Parse() {
    DCKPT_RETURN_IF_ERROR(FindEnd());
    return ReadCentralDirectory();
  }

  // The record named `name`, or nullptr.
  const Record* Find(const std::string& name) const {
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &records_[it->second];
  }
  const std::string& prefix() const { return prefix_; }
  uint64_t central_directory_offset() const { return cd_offset_; }

  // Where a record's data starts (after its local header), checked to lie before the central directory.
  Result<uint64_t> DataStart(const Record& rec) {
    std::string h;
    DCKPT_RETURN_IF_ERROR(r_->Read(rec.local_header, kLocalBytes, &h, "local header"));
    if (LE(h.data(), 4) != kLocalSig) return Bad("the local header of record " + Quote(rec.name) + " is missing");
    const uint64_t flags = LE(h.data() + 6, 2);
    const uint64_t method = LE(h.data() + 8, 2);
    if ((flags & 1) != 0) return Unsupported(r_->context() + ": record " + Quote(rec.name) + " is encrypted");
    if (method != 0) {
      return Unsupported(r_->context() + ": record " + Quote(rec.name) + " is compressed (method " +
                         std::to_string(method) + "); torch.save writes stored records");
    }
    const uint64_t name_len = LE(h.data() + 26, 2);
    const uint64_t extra_len = LE(h.data() + 28, 2);
    std::string name;
    DCKPT_RETURN_IF_ERROR(r_->Read(rec.local_header + kLocalBytes, name_len, &name, "local header's name"));
    if (name != rec.name) {
      return Bad("the local header of record " + Quote(rec.name) + " names " + Quote(name) +
                 ", not the central directory's name");
    }
    const uint64_t start = rec.local_header + kLocalBytes + name_len + extra_len;  // < 2^64: local_header < 2^63
    if (start > cd_offset_ || rec.size > cd_offset_ - start) {
      return Bad("the data of record " + Quote(rec.name) + " at [" + std::to_string(start) + ", +" +
                 std::to_string(rec.size) + ") runs into the central directory at " + std::to_string(cd_offset_));
    }
    return start;
  }

  Result<std::string> ReadRecord(const Record& rec, uint64_t max_size) {
    if (rec.size > max_size) {
      return Bad("record " + Quote(rec.name) + " has " + std::to_string(rec.size) + " bytes; at most " +
                 std::to_string(max_size) + " are expected");
    }
    DCKPT_ASSIGN_OR_RETURN(uint64_t start, DataStart(rec));
    std::string out;
    DCKPT_RETURN_IF_ERROR(r_->Read(start, rec.size, &out, "record"));
    return out;
  }

 private:
  Status Bad(const std::string& what) const { return Corrupt(r_->context() + ": " + what); }

  // Finds the end of central directory record (and the zip64 one): sets cd_offset_, cd_size_, entries_.
  Status FindEnd() {
    const uint64_t n = r_->length();
    if (n < kEocdBytes) {
      return Bad("an item of " + std::to_string(n) + " bytes is too short to be a torch.save archive (zip)");
    }
    // The record is 22 bytes plus a comment of up to 65535; torch writes no comment, so the last 4 KiB are read
    // first and the rest only if the record is not there.
    uint64_t eocd = 0;
    bool found = false;
    std::string tail;
    for (uint64_t span : {std::min<uint64_t>(n, kWindowBytes), std::min<uint64_t>(n, kEocdBytes + kMaxComment)}) {
      DCKPT_RETURN_IF_ERROR(r_->Read(n - span, span, &tail, "end of the archive"));
      for (uint64_t i = span - kEocdBytes + 1; i-- > 0;) {
        if (LE(tail.data() + i, 4) == kEocdSig && LE(tail.data() + i + 20, 2) == span - i - kEocdBytes) {
          eocd = n - span + i;
          found = true;
          break;
        }
      }
      if (found || span == n) break;
    }
    if (!found) return Bad("no end of central directory record: the item is not a zip archive (torch.save)");
    std::string e;
    DCKPT_RETURN_IF_ERROR(r_->Read(eocd, kEocdBytes, &e, "end of central directory record"));
    const uint64_t disk = LE(e.data() + 4, 2), cd_disk = LE(e.data() + 6, 2);
    const uint64_t here = LE(e.data() + 8, 2), total = LE(e.data() + 10, 2);
    const uint64_t cd_size = LE(e.data() + 12, 4), cd_offset = LE(e.data() + 16, 4);
    uint64_t end_of_cd_area = eocd;  // the central directory must end before this
    const bool has_locator = eocd >= kZip64LocatorBytes && [&] {
      std::string loc;
      return r_->Read(eocd - kZip64LocatorBytes, 4, &loc, "zip64 locator").ok() &&
             LE(loc.data(), 4) == kZip64LocatorSig;
    }();
    if (has_locator) {
      std::string loc;
      DCKPT_RETURN_IF_ERROR(r_->Read(eocd - kZip64LocatorBytes, kZip64LocatorBytes, &loc, "zip64 locator"));
      const uint64_t z_disk = LE(loc.data() + 4, 4), z_off = LE(loc.data() + 8, 8), disks = LE(loc.data() + 16, 4);
      if (z_disk != 0 || disks > 1) return Unsupported(r_->context() + ": the zip archive spans several disks");
      const uint64_t locator = eocd - kZip64LocatorBytes;
      if (z_off > locator || locator - z_off < kZip64EocdBytes) {
        return Bad("the zip64 end of central directory record at " + std::to_string(z_off) +
                   " does not lie before its locator at " + std::to_string(locator));
      }
      std::string z;
      DCKPT_RETURN_IF_ERROR(r_->Read(z_off, kZip64EocdBytes, &z, "zip64 end of central directory record"));
      if (LE(z.data(), 4) != kZip64EocdSig) {
        return Bad("no zip64 end of central directory record at " + std::to_string(z_off));
      }
      const uint64_t rec_size = LE(z.data() + 4, 8);  // the size of the rest of the record (>= 44)
      if (rec_size < kZip64EocdBytes - 12 || rec_size > locator - z_off - 12) {
        return Bad("the zip64 end of central directory record has an invalid size " + std::to_string(rec_size));
      }
      const uint64_t z_this_disk = LE(z.data() + 16, 4), z_cd_disk = LE(z.data() + 20, 4);
      const uint64_t z_here = LE(z.data() + 24, 8), z_total = LE(z.data() + 32, 8);
      const uint64_t z_cd_size = LE(z.data() + 40, 8), z_cd_offset = LE(z.data() + 48, 8);
      if (z_this_disk != 0 || z_cd_disk != 0 || z_here != z_total) {
        return Unsupported(r_->context() + ": the zip archive spans several disks");
      }
      // Where the plain record has a real value (not the 0xFF.. that defers to zip64), the two must agree.
      auto agree = [](uint64_t plain, uint64_t sentinel, uint64_t z64) { return plain == sentinel || plain == z64; };
      if (!agree(here, 0xffff, z_here) || !agree(total, 0xffff, z_total) || !agree(cd_size, 0xffffffff, z_cd_size) ||
          !agree(cd_offset, 0xffffffff, z_cd_offset) || !agree(disk, 0xffff, 0) || !agree(cd_disk, 0xffff, 0)) {
        return Bad("the end of central directory record and its zip64 form disagree");
      }
      entries_ = z_total;
      cd_size_ = z_cd_size;
      cd_offset_ = z_cd_offset;
      end_of_cd_area = z_off;
    } else {
      if (disk != 0 || cd_disk != 0 || here != total) {
        return Unsupported(r_->context() + ": the zip archive spans several disks");
      }
      if (total == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff) {
        return Bad("the end of central directory record defers to a zip64 record that is not there");
      }
      entries_ = total;
      cd_size_ = cd_size;
      cd_offset_ = cd_offset;
    }
    if (cd_offset_ > end_of_cd_area || cd_size_ != end_of_cd_area - cd_offset_) {
      return Bad("the central directory at [" + std::to_string(cd_offset_) + ", +" + std::to_string(cd_size_) +
                 ") does not end where the end records start (" + std::to_string(end_of_cd_area) + ")");
    }
    if (cd_size_ > kMaxCentralDirectoryBytes) {
      return Bad("a central directory of " + std::to_string(cd_size_) + " bytes is larger than a torch.save archive's");
    }
    if (entries_ > cd_size_ / kCentralBytes) {
      return Bad(std::to_string(entries_) + " records cannot fit a central directory of " + std::to_string(cd_size_) +
                 " bytes");
    }
    return OkStatus();
  }

  Status ReadCentralDirectory() {
    std::string cd;
    DCKPT_RETURN_IF_ERROR(r_->Read(cd_offset_, cd_size_, &cd, "central directory"));
    size_t p = 0;
    records_.reserve(entries_);
    for (uint64_t i = 0; i < entries_; ++i) {
      const std::string where = "central directory entry #" + std::to_string(i);
      if (cd.size() - p < kCentralBytes || LE(cd.data() + p, 4) != kCentralSig) {
        return Bad(where + " is missing or truncated");
      }
      const char* h = cd.data() + p;
      const uint64_t flags = LE(h + 8, 2), method = LE(h + 10, 2);
      uint64_t csize = LE(h + 20, 4), usize = LE(h + 24, 4);
      const uint64_t name_len = LE(h + 28, 2), extra_len = LE(h + 30, 2), comment_len = LE(h + 32, 2);
      uint64_t disk = LE(h + 34, 2), lho = LE(h + 42, 4);
      if (cd.size() - p - kCentralBytes < name_len + extra_len + comment_len) return Bad(where + " is truncated");
      Record rec;
      rec.name.assign(h + kCentralBytes, name_len);
      // The zip64 extended information holds, in this order, the fields whose plain value is all ones.
      const char* extra = h + kCentralBytes + name_len;
      const bool need_u = usize == 0xffffffff, need_c = csize == 0xffffffff, need_o = lho == 0xffffffff,
                 need_d = disk == 0xffff;
      if (need_u || need_c || need_o || need_d) {
        bool found = false;
        for (uint64_t q = 0; q + 4 <= extra_len;) {
          const uint64_t id = LE(extra + q, 2), len = LE(extra + q + 2, 2);
          if (len > extra_len - q - 4) return Bad(where + " has a truncated extra field");
          if (id == 0x0001) {
            const char* z = extra + q + 4;
            uint64_t at = 0;
            auto take = [&](uint64_t* v, size_t bytes) {
              if (at + bytes > len) return false;
              *v = LE(z + at, bytes);
              at += bytes;
              return true;
            };
            if ((need_u && !take(&usize, 8)) || (need_c && !take(&csize, 8)) || (need_o && !take(&lho, 8)) ||
                (need_d && !take(&disk, 4))) {
              return Bad(where + " has a zip64 extra field too short for the sizes it defers to it");
            }
            found = true;
            break;
          }
          q += 4 + len;
        }
        if (!found) return Bad(where + " defers its sizes to a zip64 extra field that is not there");
      }
      if ((flags & 1) != 0) return Unsupported(r_->context() + ": record " + Quote(rec.name) + " is encrypted");
      if (method != 0) {
        return Unsupported(r_->context() + ": record " + Quote(rec.name) + " is compressed (method " +
                           std::to_string(method) + "); torch.save writes stored records");
      }
      if (csize != usize) {
        return Bad("record " + Quote(rec.name) + " is stored, yet its compressed and uncompressed sizes differ");
      }
      if (disk != 0) return Unsupported(r_->context() + ": the zip archive spans several disks");
      if (lho >= cd_offset_) {
        return Bad("record " + Quote(rec.name) + " starts at " + std::to_string(lho) +
                   ", not before the central directory");
      }
      rec.size = usize;
      rec.local_header = lho;
      if (i == 0) {
        const size_t slash = rec.name.find('/');
        if (slash == std::string::npos || slash == 0) {
          return Bad("the first record " + Quote(rec.name) + " is not inside a directory (torch.save's archive name)");
        }
        prefix_ = rec.name.substr(0, slash + 1);
      }
      if (!by_name_.emplace(rec.name, records_.size()).second) {
        return Bad("record " + Quote(rec.name) + " appears twice");
      }
      records_.push_back(std::move(rec));
      p += kCentralBytes + name_len + extra_len + comment_len;
    }
    if (p != cd.size()) {
      return Bad("the central directory has " + std::to_string(cd.size() - p) + " bytes after its " +
                 std::to_string(entries_) + " entries");
    }
    if (entries_ == 0) return Bad("the archive is empty");
    return OkStatus();
  }

  ItemReader* r_;
  uint64_t entries_ = 0, cd_size_ = 0, cd_offset_ = 0;
  std::vector<Record> records_;
  std::unordered_map<std::string, size_t> by_name_;  // index in records_
  std::string prefix_;
};

// ---- dtypes ---------------------------------------------------------------------------------------------------------

struct TorchDType {
  const char* name;     // canonical
  const char* storage;  // the legacy typed storage class torch.save names, or nullptr (then _rebuild_tensor_v3)
  DType dtype;
};

constexpr TorchDType kTorchDTypes[] = {
    {"bool", "BoolStorage", DType::kBool},
    {"uint8", "ByteStorage", DType::kU8},
    {"int8", "CharStorage", DType::kI8},
    {"uint16", nullptr, DType::kU16},
    {"int16", "ShortStorage", DType::kI16},
    {"uint32", nullptr, DType::kU32},
    {"int32", "IntStorage", DType::kI32},
    {"uint64", nullptr, DType::kU64},
    {"int64", "LongStorage", DType::kI64},
    {"float16", "HalfStorage", DType::kF16},
    {"bfloat16", "BFloat16Storage", DType::kBF16},
    {"float32", "FloatStorage", DType::kF32},
    {"float64", "DoubleStorage", DType::kF64},
    {"complex64", "ComplexFloatStorage", DType::kC64},
    {"complex128", "ComplexDoubleStorage", DType::kC128},
    {"float8_e4m3fn", nullptr, DType::kF8E4M3FN},
    {"float8_e5m2", nullptr, DType::kF8E5M2},
};

constexpr std::pair<const char*, const char*> kAliases[] = {
    {"half", "float16"}, {"float", "float32"},    {"double", "float64"},     {"short", "int16"},     {"int", "int32"},
    {"long", "int64"},   {"cfloat", "complex64"}, {"cdouble", "complex128"}, {"chalf", "complex32"},
};

// dtypes of torch 2.x distckpt has no dtype for.
constexpr const char* kOtherTorchDTypes[] = {
    "complex32",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "qint8",
    "quint8",
    "qint32",
    "quint4x2",
    "quint2x4",
    "bits1x8",
    "bits2x4",
    "bits4x2",
    "bits8",
    "bits16",
    "uint1",
    "uint2",
    "uint3",
    "uint4",
    "uint5",
    "uint6",
    "uint7",
    "int1",
    "int2",
    "int3",
    "int4",
    "int5",
    "int6",
    "int7",
};

const TorchDType* FindTorchDType(std::string_view name) {
  name = CanonicalTorchDTypeName(name);
  for (const TorchDType& t : kTorchDTypes) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

// ---- data.pkl -------------------------------------------------------------------------------------------------------

const std::vector<PickleGlobal>& DataPklGlobals() {
  static const std::vector<PickleGlobal>* globals = [] {
    auto* g = new std::vector<PickleGlobal>{
        {"torch._utils", "_rebuild_tensor_v2"}, {"torch._utils", "_rebuild_tensor_v3"},
        {"torch.storage", "UntypedStorage"},    {"torch", "UntypedStorage"},
        {"collections", "OrderedDict"},
    };
    for (const TorchDType& t : kTorchDTypes) {
      if (t.storage != nullptr) g->push_back({"torch", t.storage});
    }
    for (const std::string& d : KnownTorchDTypeNames()) g->push_back({"torch", d});
    return g;
  }();
  return *globals;
}

struct TensorPickle {
  const TorchDType* dtype = nullptr;
  bool untyped = false;  // UntypedStorage: the storage size counts bytes, not elements
  std::string key;
  uint64_t storage_numel = 0;
  uint64_t storage_offset = 0;
  std::vector<uint64_t> size, stride;
};

class DataPklReader {
 public:
  explicit DataPklReader(std::string context) : context_(std::move(context)) {}

  Result<TensorPickle> Read(const PickleValue& root) {
    TensorPickle t;
    if (!root.is(PickleKind::kObject) || root.module() != "torch._utils" ||
        (root.name() != "_rebuild_tensor_v2" && root.name() != "_rebuild_tensor_v3")) {
      const std::string what = root.is(PickleKind::kObject) ? root.qualified_name() : PickleKindName(root.kind());
      return Unsupported(context_ + ": the pickled object is " + what +
                         ", not a plain tensor (torch._utils._rebuild_tensor_v2/v3)");
    }
    const bool v3 = root.name() == "_rebuild_tensor_v3";
    if (root.newobj() || root.state().valid() || root.list_items().valid() || root.dict_items().valid()) {
      return Bad("the tensor is not built by a plain call of " + root.qualified_name());
    }
    const PickleValue args = root.args();
    const size_t base = v3 ? 7 : 6;  // (storage, offset, size, stride, requires_grad, hooks[, dtype]) [+ metadata]
    if (args.size() != base && args.size() != base + 1) {
      return Bad(root.qualified_name() + " has " + std::to_string(args.size()) + " arguments, not " +
                 std::to_string(base) + " or " + std::to_string(base + 1));
    }
    // The storage: persistent id ('storage', <class>, key, location, numel).
    const PickleValue pid = args.item(0).persistent_id();
    if (!pid.is(PickleKind::kTuple) || pid.size() != 5 || pid.item(0).str() != "storage" ||
        !pid.item(0).is(PickleKind::kString)) {
      return Bad("the tensor's storage is not a persistent id ('storage', class, key, location, size)");
    }
    const PickleValue cls = pid.item(1);
    if (!cls.is(PickleKind::kGlobal)) return Bad("the storage's class is not a global");
    if (cls.name() == "UntypedStorage") {
      t.untyped = true;
    } else {
      for (const TorchDType& d : kTorchDTypes) {
        if (d.storage != nullptr && cls.module() == "torch" && cls.name() == d.storage) t.dtype = &d;
      }
      if (t.dtype == nullptr)
        return Unsupported(context_ + ": storage class " + cls.qualified_name() + " is not supported");
    }
    if (!pid.item(2).is(PickleKind::kString) || !pid.item(3).is(PickleKind::kString)) {
      return Bad("the storage's key or location is not a string");
    }
    t.key = std::string(pid.item(2).str());
    DCKPT_ASSIGN_OR_RETURN(t.storage_numel, Count(pid.item(4), "the storage's size"));
    if (v3) {
      const PickleValue dt = args.item(6);
      if (!dt.is(PickleKind::kGlobal) || dt.module() != "torch") return Bad("the tensor's dtype is not a torch dtype");
      if (!t.untyped) return Bad("_rebuild_tensor_v3 with a typed storage");
      t.dtype = FindTorchDType(dt.name());
      if (t.dtype == nullptr) {
        return Unsupported(context_ + ": the tensor's dtype torch." + std::string(dt.name()) +
                           " has no distckpt dtype");
      }
    } else if (t.untyped) {
      return Bad("_rebuild_tensor_v2 with an UntypedStorage has no dtype");
    }
    DCKPT_ASSIGN_OR_RETURN(t.storage_offset, Count(args.item(1), "the storage offset"));
    DCKPT_RETURN_IF_ERROR(Ints(args.item(2), "the size", &t.size));
    DCKPT_RETURN_IF_ERROR(Ints(args.item(3), "the stride", &t.stride));
    if (t.size.size() != t.stride.size()) {
      return Bad("the tensor has " + std::to_string(t.size.size()) + " sizes and " + std::to_string(t.stride.size()) +
                 " strides");
    }
    if (!args.item(4).is(PickleKind::kBool)) return Bad("requires_grad is not a bool");
    const PickleValue hooks = args.item(5);
    const bool empty_hooks = (hooks.is(PickleKind::kDict) && hooks.size() == 0) ||
                             (hooks.is(PickleKind::kObject) && hooks.qualified_name() == "collections.OrderedDict" &&
                              hooks.args().size() == 0 && !hooks.state().valid() && hooks.dict_items().size() == 0 &&
                              hooks.list_items().size() == 0);
    if (!empty_hooks) return Unsupported(context_ + ": the tensor has backward hooks");
    if (args.size() == base + 1) {  // torch._utils.get_tensor_metadata: e.g. {'conj': True}, {'neg': True}
      const PickleValue meta = args.item(base);
      if (!meta.is(PickleKind::kDict)) return Bad("the tensor's metadata is not a dict");
      if (meta.size() != 0) {
        return Unsupported(context_ + ": the tensor carries metadata " + meta.DebugString(16) +
                           " (a conjugate or negative view, whose bytes are not its values)");
      }
    }
    return t;
  }

 private:
  Status Bad(const std::string& what) const { return Corrupt(context_ + ": " + what); }
  Result<uint64_t> Count(const PickleValue& v, const char* what) const {
    if (!v.is(PickleKind::kInt) || v.int_value() < 0) {
      return Bad(std::string(what) + " is " + v.DebugString(8) + ", not a non-negative integer");
    }
    return static_cast<uint64_t>(v.int_value());
  }
  Status Ints(const PickleValue& v, const char* what, std::vector<uint64_t>* out) const {
    if (!v.is(PickleKind::kTuple)) return Bad(std::string(what) + " is not a tuple");
    if (v.size() > 64) return Bad(std::string(what) + " has " + std::to_string(v.size()) + " dimensions");
    for (size_t i = 0; i < v.size(); ++i) {
      DCKPT_ASSIGN_OR_RETURN(uint64_t x, Count(v.item(i), what));
      out->push_back(x);
    }
    return OkStatus();
  }
  std::string context_;
};

Result<TorchSavedTensor> Locate(ItemReader* r, uint64_t base) {
  ArchiveParser zip(r);
  DCKPT_RETURN_IF_ERROR(zip.Parse());
  const std::string& prefix = zip.prefix();
  const Record* pkl = zip.Find(prefix + "data.pkl");
  if (pkl == nullptr) {
    return Corrupt(r->context() + ": the archive has no record " + Quote(prefix + "data.pkl") +
                   " (not a torch.save archive)");
  }
  const Record* order = zip.Find(prefix + "byteorder");
  if (order == nullptr) {
    return Unsupported(r->context() + ": the archive has no record " + Quote(prefix + "byteorder") +
                       " (written by a torch older than 2.1?), so the byte order of its data is unknown");
  }
  DCKPT_ASSIGN_OR_RETURN(std::string byteorder, zip.ReadRecord(*order, 16));
  if (byteorder != "little") {
    return Unsupported(r->context() + ": the tensor's bytes are in " + Quote(byteorder) +
                       " byte order; distckpt reads little-endian data in place");
  }
  DCKPT_ASSIGN_OR_RETURN(std::string pkl_bytes, zip.ReadRecord(*pkl, kMaxDataPklBytes));
  PickleOptions opts;
  opts.context = r->context() + ": record " + Quote(pkl->name);
  opts.allowed_globals = DataPklGlobals();
  opts.allow_persistent_ids = true;
  opts.max_input_bytes = kMaxDataPklBytes;
  DCKPT_ASSIGN_OR_RETURN(DecodedPickle decoded, DecodePickle(pkl_bytes, opts));
  DataPklReader reader(opts.context);
  DCKPT_ASSIGN_OR_RETURN(TensorPickle t, reader.Read(decoded.root()));

  TorchSavedTensor out;
  out.torch_dtype = t.dtype->name;
  out.dtype = t.dtype->dtype;
  out.shape = t.size;
  const uint64_t itemsize = DTypeSize(t.dtype->dtype);
  // numel, checking for overflow, and C-contiguity: each stride equals the product of the later sizes (dimensions of
  // size 1 may have any stride; an empty tensor any strides).
  uint64_t numel = 1;
  bool empty = false;
  for (uint64_t s : t.size) empty = empty || s == 0;
  for (size_t d = t.size.size(); d-- > 0;) {
    if (!empty && t.size[d] != 1 && t.stride[d] != numel) {
      std::string strides;
      for (size_t k = 0; k < t.stride.size(); ++k) strides += (k ? ", " : "") + std::to_string(t.stride[k]);
      return Unsupported(r->context() + ": the tensor is saved with strides (" + strides +
                         "), not in C order (contiguous); distckpt describes C-order chunks only");
    }
    if (t.size[d] != 0 && numel > std::numeric_limits<uint64_t>::max() / t.size[d]) {
      return Corrupt(r->context() + ": the tensor's size overflows 64 bits");
    }
    numel *= t.size[d];
  }
  if (numel > std::numeric_limits<uint64_t>::max() / itemsize) {
    return Corrupt(r->context() + ": the tensor's byte size overflows 64 bits");
  }
  out.data_length = numel * itemsize;
  // The storage's byte size, and the tensor's place in it.
  uint64_t storage_bytes = t.storage_numel;
  if (!t.untyped) {
    if (storage_bytes > std::numeric_limits<uint64_t>::max() / itemsize) {
      return Corrupt(r->context() + ": the storage's byte size overflows 64 bits");
    }
    storage_bytes *= itemsize;
  }
  if (t.storage_offset > std::numeric_limits<uint64_t>::max() / itemsize) {
    return Corrupt(r->context() + ": the storage offset overflows 64 bits");
  }
  const uint64_t start = t.storage_offset * itemsize;
  if (numel > 0 && (start > storage_bytes || out.data_length > storage_bytes - start)) {
    return Corrupt(r->context() + ": the tensor's bytes [" + std::to_string(start) + ", +" +
                   std::to_string(out.data_length) + ") lie outside its storage of " + std::to_string(storage_bytes) +
                   " bytes");
  }
  const Record* data = zip.Find(prefix + "data/" + t.key);
  if (data == nullptr) {
    return Corrupt(r->context() + ": the archive has no record " + Quote(prefix + "data/" + t.key) +
                   " for the tensor's storage");
  }
  if (data->size != storage_bytes) {
    return Corrupt(r->context() + ": record " + Quote(data->name) + " has " + std::to_string(data->size) +
                   " bytes; the storage it holds has " + std::to_string(storage_bytes));
  }
  DCKPT_ASSIGN_OR_RETURN(uint64_t data_start, zip.DataStart(*data));
  // data_start + storage_bytes <= the item's length (DataStart checked), so none of this overflows.
  out.data_offset = base + data_start + (numel > 0 ? start : 0);
  return out;
}

}  // namespace

std::string_view CanonicalTorchDTypeName(std::string_view name) {
  for (const auto& a : kAliases) {
    if (name == a.first) return a.second;
  }
  return name;
}

DType DTypeFromTorchName(std::string_view name) {
  const TorchDType* t = FindTorchDType(name);
  return t ? t->dtype : DType::kInvalid;
}

const std::vector<std::string>& KnownTorchDTypeNames() {
  static const std::vector<std::string>* names = [] {
    auto* v = new std::vector<std::string>;
    for (const TorchDType& t : kTorchDTypes) v->push_back(t.name);
    for (const auto& a : kAliases) v->push_back(a.first);
    for (const char* o : kOtherTorchDTypes) v->push_back(o);
    return v;
  }();
  return *names;
}

Result<TorchSavedTensor> LocateTorchSavedTensor(const ReadableFile& file, uint64_t offset, uint64_t length,
                                                const std::string& context) {
  const uint64_t size = file.size();
  if (offset > size || length > size - offset) {
    return Corrupt(context + ": the item [" + std::to_string(offset) + ", +" + std::to_string(length) +
                   ") lies outside the file's " + std::to_string(size) + " bytes (truncated?)");
  }
  FileItemReader r(file, offset, length, context);
  return Locate(&r, offset);
}

Result<TorchSavedTensor> LocateTorchSavedTensorInMemory(std::string_view item, const std::string& context) {
  MemoryItemReader r(item, context);
  return Locate(&r, 0);
}

}  // namespace distckpt
