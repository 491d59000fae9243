// libFuzzer target for everything core/foreign reads from a PyTorch checkpoint: the restricted pickle decoder, DCP's
// .metadata (decode + schema check + description against real data files), and torch.save archives. Built and run by
// scripts/fuzz.sh (target dcp_pickle; clang-14, ASan + UBSan); tests/fuzz:dcp_pickle_regressions replays the committed
// inputs. Properties: nothing crashes, leaks, reads out of bounds or runs past the sanitizers' limits; every accessor
// of what decodes is safe; a located tensor lies inside its item; and every DCP description is one the format takes
// (EncodeMetadata, then MetadataView::ParseForeign), with every chunk inside its file.
//
// The first byte picks what the rest is (seeds from core/foreign/fuzz/make_seeds.cc):
//   % 3 == 0  a pickle, decoded with the union of the allow-lists (persistent ids allowed), then printed and walked
//   % 3 == 1  a .metadata file; the second byte picks the data files it is described against (a fixture of
//             tests/fixtures/dcp, loaded once: fsdp2_3ranks, single_dtensor, fsdp2_2ranks or dtensor_2ranks)
//   % 3 == 2  a torch.save archive (one item of a .distcp file)
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/foreign/dcp.h"
#include "core/foreign/pickle.h"
#include "core/foreign/torch_save.h"
#include "core/format/metadata.h"

namespace {

using distckpt::PickleKind;
using distckpt::PickleValue;

class MemoryFile : public distckpt::ReadableFile {
 public:
  MemoryFile(std::string path, const std::string* data) : path_(std::move(path)), data_(data) {}
  distckpt::Status ReadAt(uint64_t offset, void* out, size_t size) const override {
    if (offset > data_->size() || size > data_->size() - offset) return distckpt::Corrupt(path_ + " is truncated");
    std::copy(data_->data() + offset, data_->data() + offset + size, static_cast<char*>(out));
    return distckpt::OkStatus();
  }
  uint64_t size() const override { return data_->size(); }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  const std::string* data_;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The fixtures' data files by set and name. Found relative to the working directory (a Bazel test's runfiles) or
// under DCKPT_SOURCE_ROOT (scripts/fuzz.sh compiles it in).
const std::vector<std::map<std::string, std::string>>& Fixtures() {
  static const auto* sets = [] {
    auto* v = new std::vector<std::map<std::string, std::string>>;
    const std::vector<std::pair<std::string, std::vector<std::string>>> wanted = {
        {"fsdp2_3ranks", {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp"}},
        {"single_dtensor", {"__0_0.distcp"}},
        {"fsdp2_2ranks", {"__0_0.distcp", "__1_0.distcp"}},
        {"dtensor_2ranks", {"__0_0.distcp", "__1_0.distcp"}},
    };
    std::vector<std::string> roots = {"."};
#ifdef DCKPT_SOURCE_ROOT
    roots.push_back(DCKPT_SOURCE_ROOT);
#endif
    for (const auto& [dir, names] : wanted) {
      std::map<std::string, std::string> files;
      for (const std::string& root : roots) {
        for (const std::string& n : names) {
          std::string bytes = Slurp(root + "/tests/fixtures/dcp/" + dir + "/" + n);
          if (!bytes.empty()) files[n] = std::move(bytes);
        }
        if (!files.empty()) break;
      }
      v->push_back(std::move(files));
    }
    return v;
  }();
  return *sets;
}

std::vector<distckpt::PickleGlobal> AllGlobals() {
  std::vector<distckpt::PickleGlobal> g = {
      {"torch._utils", "_rebuild_tensor_v2"},
      {"torch._utils", "_rebuild_tensor_v3"},
      {"torch.storage", "UntypedStorage"},
      {"torch", "FloatStorage"},
      {"torch", "BFloat16Storage"},
      {"collections", "OrderedDict"},
      {"torch", "Size"},
      {"torch.serialization", "_get_layout"},
      {"pathlib", "PosixPath"},
      {"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
  };
  for (const char* c : {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"}) {
    g.push_back({"torch.distributed.checkpoint.metadata", c});
  }
  for (const std::string& d : distckpt::KnownTorchDTypeNames()) g.push_back({"torch", d});
  return g;
}

// Visits up to `budget` nodes through every accessor, depth-bounded (the graph may share nodes or be cyclic).
void Walk(const PickleValue& v, int depth, size_t* budget, uint64_t* sink) {
  if (*budget == 0 || depth > 32) return;
  --*budget;
  *sink += static_cast<uint64_t>(v.kind()) + v.bool_value() + static_cast<uint64_t>(v.int_value()) + v.str().size() +
           v.module().size() + v.name().size() + v.newobj();
  for (size_t i = 0; i < v.size() && *budget > 0; ++i) {
    Walk(v.item(i), depth + 1, budget, sink);
    Walk(v.key(i), depth + 1, budget, sink);
    Walk(v.value(i), depth + 1, budget, sink);
  }
  for (const PickleValue& c : {v.args(), v.state(), v.list_items(), v.dict_items(), v.persistent_id()}) {
    if (c.valid()) Walk(c, depth + 1, budget, sink);
  }
}

void FuzzPickle(const std::string& bytes) {
  distckpt::PickleOptions opts;
  opts.context = "fuzz";
  static const std::vector<distckpt::PickleGlobal> globals = AllGlobals();
  opts.allowed_globals = globals;
  opts.allow_persistent_ids = true;
  distckpt::Result<distckpt::DecodedPickle> p = distckpt::DecodePickle(bytes, opts);
  if (!p.ok()) return;
  if (p->num_nodes() > bytes.size() + 8) std::abort();  // the documented bound
  const std::string s = p->root().DebugString(256);
  // 256 nodes, each printed in at most about 230 characters (strings are cut after 200), as valid UTF-8.
  if (s.size() > 256 * 256 || distckpt::QuoteForMessage(s, s.size() + 16).size() < s.size()) std::abort();
  size_t budget = 4096;
  uint64_t sink = s.size();
  Walk(p->root(), 0, &budget, &sink);
  (void)sink;
}

void FuzzMetadata(const std::string& bytes, size_t set) {
  distckpt::Result<distckpt::DcpMetadata> md = distckpt::ParseDcpMetadata(bytes, "'fuzz/.metadata'");
  if (!md.ok()) return;
  for (const distckpt::DcpEntry& e : md->entries) {
    if (e.is_bytes && e.item >= md->items.size()) std::abort();
    for (const distckpt::DcpChunk& c : e.chunks) {
      if (c.item >= md->items.size() || c.offsets.size() != e.shape.size() || c.sizes.size() != e.shape.size()) {
        std::abort();
      }
    }
  }
  const auto& files = Fixtures()[set % Fixtures().size()];
  distckpt::Result<distckpt::MetadataRecord> r =
      distckpt::DescribeDcpMetadata(*md, "fuzz", [&files](const std::string& name) {
        distckpt::Result<std::unique_ptr<distckpt::ReadableFile>> out = distckpt::NotFound(name + " not found");
        const auto it = files.find(name);
        if (it != files.end()) out = std::unique_ptr<distckpt::ReadableFile>(new MemoryFile(name, &it->second));
        return out;
      });
  if (!r.ok()) return;
  for (const distckpt::EntryRecord& e : r->entries) {
    for (const distckpt::ChunkLocation& c : e.chunks) {
      if (c.file >= r->files.size() || c.offset > r->files[c.file].size ||
          c.length > r->files[c.file].size - c.offset) {
        std::abort();
      }
    }
  }
  distckpt::Result<std::string> encoded = distckpt::EncodeMetadata(*r);
  if (!encoded.ok()) std::abort();  // the description is one the format refuses
  if (!distckpt::MetadataView::ParseForeign(std::make_shared<const std::string>(std::move(encoded).value()), "fuzz")
           .ok()) {
    std::abort();
  }
}

void FuzzArchive(const std::string& bytes) {
  distckpt::Result<distckpt::TorchSavedTensor> t = distckpt::LocateTorchSavedTensorInMemory(bytes, "fuzz");
  if (!t.ok()) return;
  if (t->data_offset > bytes.size() || t->data_length > bytes.size() - t->data_offset) std::abort();
  uint64_t numel = 1;
  for (uint64_t s : t->shape) numel *= s;
  if (numel * distckpt::DTypeSize(t->dtype) != t->data_length) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      FuzzPickle(bytes);
      break;
    case 1:
      if (!bytes.empty()) FuzzMetadata(bytes.substr(1), static_cast<uint8_t>(bytes[0]));
      break;
    default:
      FuzzArchive(bytes);
      break;
  }
  return 0;
}
