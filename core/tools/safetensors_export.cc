#include "core/tools/safetensors_export.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <utility>

#include "core/base/box.h"
#include "core/engine/reader.h"
#include "core/format/metadata.h"

namespace distckpt {
namespace internal_safetensors {

std::string JsonQuote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace internal_safetensors

namespace {

using internal_safetensors::JsonQuote;

// Worst-case width of a uint64 in decimal; the shard-size estimate assumes it for both data offsets.
constexpr uint64_t kMaxDecimalDigits = 20;
// The smallest streaming buffer: it must hold at least one element of every dtype (C64 = 8 bytes), twice.
constexpr uint64_t kMinBufferBytes = 64;

struct TensorToExport {
  size_t entry = 0;  // index in the metadata
  std::string name;
  DType dtype = DType::kInvalid;
  std::vector<uint64_t> shape;
  uint64_t nbytes = 0;
  uint64_t begin = 0;  // data_offsets inside its file, once laid out
};

struct ShardFile {
  std::vector<TensorToExport> tensors;
  std::string name;      // final file name
  std::string tmp_path;  // where it is written before the rename
};

std::string ShapeJson(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d) s += ",";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

// `"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}`
std::string TensorHeader(const TensorToExport& t) {
  return JsonQuote(t.name) + ":{\"dtype\":\"" + SafetensorsDTypeName(t.dtype) + "\",\"shape\":" + ShapeJson(t.shape) +
         ",\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.begin + t.nbytes) + "]}";
}

// An upper bound of TensorHeader(t).size() + 1 (the separating comma), whatever the offsets turn out to be.
uint64_t TensorHeaderBound(const TensorToExport& t) {
  TensorToExport zero = t;
  zero.begin = 0;
  zero.nbytes = 0;
  return TensorHeader(zero).size() + 1 + 2 * (kMaxDecimalDigits - 1);
}

std::string FileName(const std::string& prefix, size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, n);
  return prefix + buf;
}

// Streams tensor `t` into `file` at `file_offset`, through two halves of `buffer` (read one while the other is being
// written). Tensors larger than a half are read as slabs: boxes of length 1 in the dimensions before `d`, up to
// `rows` in dimension `d`, and whole in the dimensions after it, visited in row-major order so that the bytes land
// contiguously.
class TensorCopier {
 public:
  TensorCopier(Reader* reader, char* buffer, uint64_t half, const std::function<Status(uint64_t)>& on_written)
      : reader_(reader), half_(half), on_written_(on_written) {
    bufs_[0] = buffer;
    bufs_[1] = buffer + half;
  }

  Status Copy(const TensorToExport& t, WritableFile* file, uint64_t file_offset) {
    if (t.nbytes == 0) return OkStatus();
    const size_t ndim = t.shape.size();
    const uint64_t itemsize = DTypeSize(t.dtype);
    // Pick the outermost dimension d whose inner block (the elements of one index of d) fits into a half buffer.
    size_t d = 0;
    uint64_t inner = t.nbytes;
    if (ndim > 0) {
      std::vector<uint64_t> inner_of(ndim);
      uint64_t acc = itemsize;
      for (size_t k = ndim; k-- > 0;) {
        inner_of[k] = acc;
        acc *= t.shape[k];
      }
      d = 0;
      while (d + 1 < ndim && inner_of[d] > half_) ++d;
      inner = inner_of[d];
    }
    Box box;
    box.ndim = static_cast<uint32_t>(ndim);
    for (size_t k = 0; k < ndim; ++k) box.length[k] = t.shape[k];
    if (ndim == 0 || t.nbytes <= half_) return Chunk(t, box, t.nbytes, file, file_offset);

    const uint64_t rows = std::max<uint64_t>(1, half_ / inner);
    for (size_t k = 0; k < d; ++k) box.length[k] = 1;
    uint64_t pos = file_offset;
    while (true) {
      for (uint64_t r = 0; r < t.shape[d]; r += rows) {
        box.offset[d] = r;
        box.length[d] = std::min(rows, t.shape[d] - r);
        const uint64_t size = box.length[d] * inner;
        DCKPT_RETURN_IF_ERROR(Chunk(t, box, size, file, pos));
        pos += size;
      }
      // Odometer over the dimensions before d; done when it wraps around.
      size_t k = d;
      while (k > 0) {
        --k;
        if (++box.offset[k] < t.shape[k]) break;
        box.offset[k] = 0;
        if (k == 0) return OkStatus();
      }
      if (d == 0) return OkStatus();
    }
  }

  /// Waits for the write in flight, if any.
  Status Flush() {
    if (!pending_.valid()) return OkStatus();
    auto [st, size] = pending_.get();
    DCKPT_RETURN_IF_ERROR(st);
    return on_written_(size);
  }

 private:
  Status Chunk(const TensorToExport& t, const Box& box, uint64_t size, WritableFile* file, uint64_t pos) {
    char* buf = bufs_[next_];
    next_ ^= 1;
    DCKPT_RETURN_IF_ERROR(reader_->ReadRegion(t.name, box, buf, size));
    DCKPT_RETURN_IF_ERROR(Flush());
    pending_ = std::async(std::launch::async,
                          [file, pos, buf, size]() { return std::make_pair(file->WriteAt(pos, buf, size), size); });
    return OkStatus();
  }

  Reader* reader_;
  char* bufs_[2];
  uint64_t half_;
  int next_ = 0;
  const std::function<Status(uint64_t)>& on_written_;
  std::future<std::pair<Status, uint64_t>> pending_;
};

}  // namespace

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kC128:
    case DType::kInvalid:
      return nullptr;
    default:
      // distckpt's canonical names are safetensors' names wherever safetensors has the dtype (DESIGN.md, Dtypes).
      return DTypeName(dtype);
  }
}

Result<SafetensorsExportSummary> ExportSafetensors(const std::string& ckpt_path, const std::string& out_dir,
                                                   const SafetensorsExportOptions& options) {
  Storage* storage = options.out_storage ? options.out_storage : options.storage ? options.storage : DefaultStorage();
  // Object stores have no rename and no directories: files go straight to their names.
  const bool direct = storage->commit_protocol() == CommitProtocol::kMetadataLast;
  const std::string index_name = options.prefix + ".safetensors.index.json";
  if (options.prefix.empty() || !IsValidFileName(index_name)) {
    return InvalidArgument("safetensors export: prefix '" + options.prefix +
                           "' is not a plain file name (no '/', no '..', no control characters)");
  }
  if (options.max_shard_bytes == 0) return InvalidArgument("safetensors export: max_shard_bytes must be > 0");
  DCKPT_ASSIGN_OR_RETURN(bool is_dir, direct ? Result<bool>(true) : storage->IsDirectory(out_dir));
  if (!is_dir) {
    return NotFound("safetensors export: output directory '" + out_dir + "' does not exist; create it first");
  }

  ReadOptions ro;
  ro.verify = options.verify;
  ro.storage = options.storage;
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, Reader::Open(ckpt_path, nullptr, ro));
  const MetadataView& meta = reader->metadata();

  // Tensors in name order; fail on a dtype safetensors lacks before writing anything.
  SafetensorsExportSummary summary;
  std::vector<TensorToExport> tensors;
  uint64_t largest = 0;
  for (size_t i = 0; i < meta.num_entries(); ++i) {
    EntryView e = meta.entry(i);
    if (e.kind != EntryKind::kTensor) {
      ++summary.skipped_bytes_entries;
      continue;
    }
    if (SafetensorsDTypeName(e.dtype) == nullptr) {
      return Unsupported("safetensors export of '" + ckpt_path + "': tensor '" + std::string(e.name) + "' is " +
                         DTypeName(e.dtype) +
                         ", which safetensors cannot represent; convert it (e.g. to two F64 tensors) or export the "
                         "others from a checkpoint without it");
    }
    TensorToExport t;
    t.entry = i;
    t.name = std::string(e.name);
    t.dtype = e.dtype;
    t.shape.assign(e.shape.begin(), e.shape.end());
    t.nbytes = e.nbytes();
    largest = std::max(largest, t.nbytes);
    summary.total_size += t.nbytes;
    tensors.push_back(std::move(t));
  }
  summary.num_tensors = tensors.size();

  // "__metadata__": the user metadata, plus format=pt unless the user set a format.
  std::map<std::string, std::string> user;
  for (size_t i = 0; i < meta.num_user(); ++i) {
    auto kv = meta.user(i);
    user.emplace(std::string(kv.first), std::string(kv.second));
  }
  user.emplace("format", "pt");
  std::string metadata_json = "\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : user) {
    if (!first) metadata_json += ",";
    first = false;
    metadata_json += JsonQuote(k) + ":" + JsonQuote(v);
  }
  metadata_json += "}";

  // Assign tensors to files in name order, bounding each file's size (header included).
  const uint64_t base_bytes = 8 + 2 + metadata_json.size() + 7;  // length prefix, braces, metadata, padding
  std::vector<ShardFile> shards(1);
  uint64_t current = base_bytes;
  for (TensorToExport& t : tensors) {
    const uint64_t add = TensorHeaderBound(t) + t.nbytes;
    if (!shards.back().tensors.empty() && current + add > options.max_shard_bytes) {
      shards.emplace_back();
      current = base_bytes;
    }
    current += add;
    shards.back().tensors.push_back(std::move(t));
  }

  const std::string nonce = NewNonce();
  std::vector<std::string> written_tmp;
  auto cleanup = [&]() {
    for (const std::string& p : written_tmp) (void)storage->RemoveAll(p);
  };

  const uint64_t half = std::max<uint64_t>(kMinBufferBytes, options.buffer_bytes) / 2;
  const uint64_t buffer_size = std::min<uint64_t>(2 * half, 2 * std::max<uint64_t>(largest, 1));
  std::unique_ptr<char[]> buffer(new char[buffer_size]);
  uint64_t done = 0;
  std::function<Status(uint64_t)> on_written = [&](uint64_t n) -> Status {
    done += n;
    if (options.progress && options.progress(done, summary.total_size) != 0) {
      return Status(StatusCode::kUser, "safetensors export of '" + ckpt_path + "' aborted by the progress callback");
    }
    return OkStatus();
  };
  TensorCopier copier(reader.get(), buffer.get(), buffer_size / 2, on_written);

  for (size_t s = 0; s < shards.size(); ++s) {
    ShardFile& shard = shards[s];
    shard.name = FileName(options.prefix, s, shards.size());
    shard.tmp_path = direct ? out_dir + "/" + shard.name : out_dir + "/." + shard.name + ".tmp-" + nonce;
    // Largest elements first keeps every tensor aligned to its element size (safetensors' own writer does this).
    std::stable_sort(shard.tensors.begin(), shard.tensors.end(), [](const TensorToExport& a, const TensorToExport& b) {
      const size_t sa = DTypeSize(a.dtype), sb = DTypeSize(b.dtype);
      return sa != sb ? sa > sb : a.name < b.name;
    });
    uint64_t data_size = 0;
    std::string header = "{" + metadata_json;
    for (TensorToExport& t : shard.tensors) {
      t.begin = data_size;
      data_size += t.nbytes;
      header += "," + TensorHeader(t);
    }
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');
    const uint64_t data_start = 8 + header.size();

    written_tmp.push_back(shard.tmp_path);
    auto file = storage->CreateFile(shard.tmp_path);
    if (!file.ok()) {
      cleanup();
      return file.status();
    }
    Status st = (*file)->Preallocate(data_start + data_size);
    if (st.ok()) {
      std::string prefix(8, '\0');
      uint64_t n = header.size();
      for (int b = 0; b < 8; ++b) prefix[b] = static_cast<char>((n >> (8 * b)) & 0xff);
      st = (*file)->WriteAt(0, (prefix + header).data(), data_start);
    }
    for (size_t i = 0; st.ok() && i < shard.tensors.size(); ++i) {
      st = copier.Copy(shard.tensors[i], file->get(), data_start + shard.tensors[i].begin);
    }
    Status flushed = copier.Flush();  // always wait for the write in flight before touching the file again
    if (st.ok()) st = flushed;
    if (st.ok()) st = (*file)->Truncate(data_start + data_size);
    if (st.ok()) st = (*file)->Sync();
    if (st.ok()) st = (*file)->Close();
    if (!st.ok()) {
      file->reset();
      cleanup();
      return st.WithContext("safetensors export of '" + ckpt_path + "' into '" + out_dir + "'");
    }
  }

  // The index: weight_map sorted by tensor name, as Hugging Face writes it.
  std::map<std::string, const std::string*> weight_map;
  for (const ShardFile& shard : shards) {
    for (const TensorToExport& t : shard.tensors) weight_map.emplace(t.name, &shard.name);
  }
  std::string index =
      "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(summary.total_size) + "\n  },\n  \"weight_map\": {";
  first = true;
  for (const auto& [name, file] : weight_map) {
    index += first ? "\n    " : ",\n    ";
    first = false;
    index += JsonQuote(name) + ": " + JsonQuote(*file);
  }
  index += first ? "}\n}\n" : "\n  }\n}\n";
  const std::string index_tmp = direct ? out_dir + "/" + index_name : out_dir + "/." + index_name + ".tmp-" + nonce;
  written_tmp.push_back(index_tmp);
  if (Status st = storage->WriteFileDurably(index_tmp, index); !st.ok()) {
    cleanup();
    return st;
  }

  // Everything is complete and durable: move the files into place, the index last.
  auto install = [&](const std::string& tmp, const std::string& name) -> Status {
    const std::string path = out_dir + "/" + name;
    if (direct) return OkStatus();  // already there
    DCKPT_RETURN_IF_ERROR(storage->RemoveAll(path));
    return storage->Rename(tmp, path);
  };
  for (const ShardFile& shard : shards) {
    if (Status st = install(shard.tmp_path, shard.name); !st.ok()) {
      cleanup();
      return st;
    }
    summary.files.push_back(shard.name);
  }
  if (Status st = install(index_tmp, index_name); !st.ok()) {
    cleanup();
    return st;
  }
  summary.index_file = index_name;
  DCKPT_RETURN_IF_ERROR(storage->SyncDir(out_dir));
  return summary;
}

}  // namespace distckpt
