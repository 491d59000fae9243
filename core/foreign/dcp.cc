// DCP checkpoints read in place. The schema is DCP's (torch/distributed/checkpoint/metadata.py and filesystem.py of
// torch 2.x, as pickled by torch 2.15; python/distckpt/_dcp_metadata.py is the Python reader of the same schema):
//
//   Metadata                 NEWOBJ, BUILD {state_dict_metadata, planner_data, storage_data, storage_meta, version}
//   TensorStorageMetadata    BUILD {properties, size, chunks}
//   BytesStorageMetadata     NEWOBJ, no state
//   TensorProperties         BUILD (dtype, layout, requires_grad, memory_format, pin_memory[, strides])
//   ChunkStorageMetadata     BUILD {offsets, sizes}
//   MetadataIndex            BUILD {fqn, offset?, index?}              (the keys of storage_data)
//   _StorageInfo             BUILD {relative_path, offset, length, transform_descriptors?}
//   StorageMeta              BUILD {checkpoint_id, save_id, load_id, modules}
//   torch.Size               REDUCE torch.Size((ints,))
//   dtypes                   GLOBAL torch.<name>;  layouts: REDUCE torch.serialization._get_layout('torch.strided')
//
// The pickle is a graph whose nodes may be shared (and even cyclic), so the checker walks only the fixed shape of the
// schema (a bounded depth) and charges every container it visits to a budget proportional to the file's size.
#include "core/foreign/dcp.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <unordered_map>

#include "core/base/box.h"
#include "core/base/dtype.h"
#include "core/foreign/pickle.h"
#include "core/foreign/torch_save.h"

namespace distckpt {
namespace {

constexpr char kMetaModule[] = "torch.distributed.checkpoint.metadata";
constexpr char kFsModule[] = "torch.distributed.checkpoint.filesystem";
constexpr size_t kMaxFqnBytes = 1 << 16;  // distckpt's limit on entry names
constexpr size_t kMaxParseDims = 64;      // sanity bound while parsing; distckpt itself takes kMaxDims

std::string Quote(std::string_view s) { return QuoteForMessage(s); }

std::string Dims(const std::vector<uint64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const std::vector<PickleGlobal>& MetadataGlobals() {
  static const std::vector<PickleGlobal>* globals = [] {
    auto* g = new std::vector<PickleGlobal>;
    for (const char* c : {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                          "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"}) {
      g->push_back({kMetaModule, c});
    }
    g->push_back({kFsModule, "_StorageInfo"});
    g->push_back({"torch", "Size"});
    g->push_back({"torch.serialization", "_get_layout"});
    g->push_back({"collections", "OrderedDict"});
    // StorageMeta.checkpoint_id: the path the checkpoint was saved to.
    for (const char* p : {"PosixPath", "PurePosixPath", "Path", "WindowsPath", "PureWindowsPath"}) {
      g->push_back({"pathlib", p});
    }
    for (const std::string& d : KnownTorchDTypeNames()) g->push_back({"torch", d});
    return g;
  }();
  return *globals;
}

// The schema checker over a decoded pickle. Messages are built only when something is wrong: `what` arguments are
// callables that name the place being checked ("entry 'x' chunk #3 offsets").
class Checker {
 public:
  Checker(std::string context, uint64_t budget) : context_(std::move(context)), budget_(budget) {}

  Result<DcpMetadata> Run(const PickleValue& root);

 private:
  // A dataclass's fields: few, so a vector searched from the back (the last value set wins, as for __dict__).
  using Fields = std::vector<std::pair<std::string_view, PickleValue>>;

  Status Bad(const std::string& what) const { return Corrupt(context_ + ": DCP metadata: " + what); }
  Status Spend(uint64_t n) {
    if (n > budget_) {
      return Bad("the pickle shares objects so much that checking it would take more work than its size allows");
    }
    budget_ -= n;
    return OkStatus();
  }

  static bool IsClass(const PickleValue& v, std::string_view module, std::string_view name) {
    return v.is(PickleKind::kObject) && v.name() == name && v.module() == module;
  }
  static std::string Describe(const PickleValue& v) {
    if (v.is(PickleKind::kObject) || v.is(PickleKind::kGlobal)) return v.qualified_name();
    return PickleKindName(v.kind());
  }
  static bool IsPlainOrderedDict(const PickleValue& v) {
    return IsClass(v, "collections", "OrderedDict") && v.args().size() == 0 && !v.state().valid() &&
           !v.list_items().valid();
  }
  static bool IsDictLike(const PickleValue& v) { return v.is(PickleKind::kDict) || IsPlainOrderedDict(v); }
  // A dict's pairs: a dict node, or an OrderedDict object's items (it pickles as REDUCE + SETITEMS).
  static PickleValue AsDict(const PickleValue& v) {
    if (v.is(PickleKind::kDict)) return v;
    if (IsPlainOrderedDict(v)) return v.dict_items();  // invalid (size 0) when empty
    return PickleValue();
  }

  // The fields of a dataclass instance of `module.cls` (its BUILD state).
  template <typename What>
  Result<Fields> FieldsOf(const PickleValue& v, std::string_view module, std::string_view cls, const What& what) {
    if (!IsClass(v, module, cls)) {
      return Bad(what() + " is " + Describe(v) + ", not a " + std::string(module) + "." + std::string(cls));
    }
    if (v.list_items().valid() || v.dict_items().valid()) return Bad(what() + " has items added to it");
    PickleValue state = v.state();
    if (state.is(PickleKind::kTuple) && state.size() == 2 &&
        (state.item(0).is(PickleKind::kNone) || (state.item(0).is(PickleKind::kDict) && state.item(0).size() == 0))) {
      state = state.item(1);  // (dict, slots) form of a class with __slots__
    }
    Fields f;
    if (!state.valid() || state.is(PickleKind::kNone)) return f;
    if (!state.is(PickleKind::kDict)) {
      return Bad(what() + " (" + std::string(cls) + ") has a state that is not a dict");
    }
    DCKPT_RETURN_IF_ERROR(Spend(state.size() + 1));
    f.reserve(state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      if (!state.key(i).is(PickleKind::kString)) return Bad(what() + " has a field name that is not a string");
      f.emplace_back(state.key(i).str(), state.value(i));
    }
    return f;
  }
  static PickleValue Get(const Fields& f, std::string_view k) {
    for (size_t i = f.size(); i-- > 0;) {
      if (f[i].first == k) return f[i].second;
    }
    return PickleValue();
  }
  static bool Absent(const PickleValue& v) { return !v.valid() || v.is(PickleKind::kNone); }

  template <typename What>
  Result<std::string> String(const PickleValue& v, const What& what) {
    if (!v.is(PickleKind::kString)) return Bad(what() + " is " + Describe(v) + ", not a string");
    return std::string(v.str());
  }
  template <typename What>
  Result<uint64_t> Count(const PickleValue& v, const What& what) {
    if (!v.is(PickleKind::kInt) || v.int_value() < 0) {
      return Bad(what() + " is " + v.DebugString(8) + ", not a non-negative integer");
    }
    return static_cast<uint64_t>(v.int_value());
  }
  // A torch.Size (or a plain tuple) of non-negative integers.
  template <typename What>
  Result<std::vector<uint64_t>> Size(const PickleValue& v, const What& what) {
    PickleValue t = v;
    if (IsClass(v, "torch", "Size")) {
      if (v.newobj() || v.state().valid() || v.list_items().valid() || v.dict_items().valid() || v.args().size() != 1) {
        return Bad(what() + " is a torch.Size built in an unexpected way");
      }
      t = v.args().item(0);
    }
    if (!t.is(PickleKind::kTuple) && !t.is(PickleKind::kList)) {
      return Bad(what() + " is " + Describe(v) + ", not a torch.Size");
    }
    DCKPT_RETURN_IF_ERROR(Spend(t.size() + 1));
    if (t.size() > kMaxParseDims) return Bad(what() + " has " + std::to_string(t.size()) + " dimensions");
    std::vector<uint64_t> out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size(); ++i) {
      DCKPT_ASSIGN_OR_RETURN(uint64_t x, Count(t.item(i), [&] { return what() + "[" + std::to_string(i) + "]"; }));
      out.push_back(x);
    }
    return out;
  }

  Status Tensor(const PickleValue& md, DcpEntry* e);
  Status Properties(const PickleValue& props, DcpEntry* e);
  Status StorageData(const PickleValue& sd, DcpMetadata* out);

  std::string context_;
  uint64_t budget_;
  std::unordered_map<std::string_view, size_t> entry_index_;  // fqn -> index in entries
};

Status Checker::Properties(const PickleValue& props, DcpEntry* e) {
  auto what = [e] { return "entry " + Quote(e->fqn); };
  if (!IsClass(props, kMetaModule, "TensorProperties")) {
    return Bad(what() + ".properties is " + Describe(props) + ", not a TensorProperties");
  }
  PickleValue dtype, layout;
  const PickleValue state = props.state();
  if (state.is(PickleKind::kTuple) && (state.size() == 5 || state.size() == 6)) {
    // TensorProperties.__getstate__ of torch 2.x: (dtype, layout, requires_grad, memory_format, pin_memory[, strides])
    dtype = state.item(0);
    layout = state.item(1);
  } else if (state.is(PickleKind::kDict)) {
    DCKPT_ASSIGN_OR_RETURN(Fields f,
                           FieldsOf(props, kMetaModule, "TensorProperties", [&] { return what() + ".properties"; }));
    dtype = Get(f, "dtype");
    layout = Get(f, "layout");
  } else {
    return Bad(what() + ".properties has a state of the wrong form (" + state.DebugString(8) + ")");
  }
  if (!dtype.is(PickleKind::kGlobal) || dtype.module() != "torch") {
    return Bad(what() + " has no torch dtype (" + dtype.DebugString(8) + ")");
  }
  e->torch_dtype = std::string(CanonicalTorchDTypeName(dtype.name()));
  if (!Absent(layout)) {
    if (!IsClass(layout, "torch.serialization", "_get_layout") || layout.args().size() != 1 ||
        !layout.args().item(0).is(PickleKind::kString)) {
      return Bad(what() + " has an invalid torch layout (" + layout.DebugString(8) + ")");
    }
    const std::string_view name = layout.args().item(0).str();
    if (name != "torch.strided") {
      return Unsupported(context_ + ": entry " + Quote(e->fqn) + " has the layout " + Quote(name) +
                         "; only strided (dense) tensors can be read in place");
    }
  }
  return OkStatus();
}

Status Checker::Tensor(const PickleValue& md, DcpEntry* e) {
  auto what = [e] { return "entry " + Quote(e->fqn); };
  DCKPT_ASSIGN_OR_RETURN(Fields f, FieldsOf(md, kMetaModule, "TensorStorageMetadata", what));
  DCKPT_RETURN_IF_ERROR(Properties(Get(f, "properties"), e));
  DCKPT_ASSIGN_OR_RETURN(e->shape, Size(Get(f, "size"), [&] { return what() + ".size"; }));
  const PickleValue chunks = Get(f, "chunks");
  if (!chunks.is(PickleKind::kList)) return Bad(what() + ".chunks is " + Describe(chunks) + ", not a list");
  DCKPT_RETURN_IF_ERROR(Spend(chunks.size() + 1));
  e->chunks.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    auto cw = [&] { return what() + " chunk #" + std::to_string(i); };
    DCKPT_ASSIGN_OR_RETURN(Fields cf, FieldsOf(chunks.item(i), kMetaModule, "ChunkStorageMetadata", cw));
    DcpChunk c;
    DCKPT_ASSIGN_OR_RETURN(c.offsets, Size(Get(cf, "offsets"), [&] { return cw() + " offsets"; }));
    DCKPT_ASSIGN_OR_RETURN(c.sizes, Size(Get(cf, "sizes"), [&] { return cw() + " sizes"; }));
    if (c.offsets.size() != e->shape.size() || c.sizes.size() != e->shape.size()) {
      return Bad(cw() + " has " + std::to_string(c.offsets.size()) + " offsets and " + std::to_string(c.sizes.size()) +
                 " sizes for a tensor of " + std::to_string(e->shape.size()) + " dimensions");
    }
    for (size_t d = 0; d < e->shape.size(); ++d) {
      if (c.offsets[d] > e->shape[d] || c.sizes[d] > e->shape[d] - c.offsets[d]) {
        return Bad(cw() + " at offsets " + Dims(c.offsets) + " of sizes " + Dims(c.sizes) +
                   " lies outside the tensor's size " + Dims(e->shape));
      }
    }
    e->chunks.push_back(std::move(c));
  }
  return OkStatus();
}

// The key of a chunk's storage_data: its FQN and offsets (what MetadataIndex compares; `index` is only a hint).
std::string ItemKey(std::string_view fqn, const std::vector<uint64_t>* offsets) {
  std::string k(fqn);
  k.push_back('\0');
  if (offsets == nullptr) {
    k.push_back('B');
    return k;
  }
  k.push_back('T');
  for (uint64_t o : *offsets) k.append(reinterpret_cast<const char*>(&o), 8);
  return k;
}

Status Checker::StorageData(const PickleValue& sd_in, DcpMetadata* out) {
  const PickleValue sd = AsDict(sd_in);
  DCKPT_RETURN_IF_ERROR(Spend(sd.size() + 1));
  std::unordered_map<std::string, size_t> by_key;  // ItemKey -> item index
  by_key.reserve(sd.size());
  out->items.reserve(sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    DCKPT_ASSIGN_OR_RETURN(
        Fields k, FieldsOf(sd.key(i), kMetaModule, "MetadataIndex", [] { return std::string("a storage_data key"); }));
    DCKPT_ASSIGN_OR_RETURN(std::string fqn,
                           String(Get(k, "fqn"), [] { return std::string("a storage_data key's fqn"); }));
    auto what = [&fqn] { return "storage_data of entry " + Quote(fqn); };
    const auto entry = entry_index_.find(fqn);
    if (entry == entry_index_.end()) return Bad(what() + ": state_dict_metadata has no such entry");
    DcpEntry& e = out->entries[entry->second];
    std::vector<uint64_t> offsets;
    const PickleValue off = Get(k, "offset");
    if (!Absent(off)) {
      DCKPT_ASSIGN_OR_RETURN(offsets, Size(off, [&] { return what() + " offset"; }));
    }
    const PickleValue index = Get(k, "index");
    if (!Absent(index)) {
      DCKPT_RETURN_IF_ERROR(Count(index, [&] { return what() + " index"; }).status());
    }
    if (e.is_bytes != Absent(off)) {
      return Bad(what() + (e.is_bytes ? " has chunk offsets, but the entry is a bytes item"
                                      : " has no chunk offsets, but the entry is a tensor"));
    }
    DCKPT_ASSIGN_OR_RETURN(Fields v, FieldsOf(sd.value(i), kFsModule, "_StorageInfo", what));
    DcpItem item;
    DCKPT_ASSIGN_OR_RETURN(item.file, String(Get(v, "relative_path"), [&] { return what() + " relative_path"; }));
    if (!IsValidFileName(item.file) || item.file == kDcpMetadataFileName || item.file == kMetadataFileName ||
        item.file == kStagingMarkerName) {
      return Bad(what() + " names the file " + Quote(item.file) + ", which is not a data file inside the checkpoint");
    }
    DCKPT_ASSIGN_OR_RETURN(item.offset,
                           Count(Get(v, "offset"), [&] { return what() + " offset in " + Quote(item.file); }));
    DCKPT_ASSIGN_OR_RETURN(item.length,
                           Count(Get(v, "length"), [&] { return what() + " length in " + Quote(item.file); }));
    const PickleValue transforms = Get(v, "transform_descriptors");
    if (!Absent(transforms)) {
      if (!transforms.is(PickleKind::kList) && !transforms.is(PickleKind::kTuple)) {
        return Bad(what() + " transform_descriptors is " + Describe(transforms) + ", not a list");
      }
      if (transforms.size() != 0) {
        std::string names;
        for (size_t t = 0; t < transforms.size() && t < 4; ++t) {
          names += (t ? ", " : "") + (transforms.item(t).is(PickleKind::kString) ? Quote(transforms.item(t).str())
                                                                                 : transforms.item(t).DebugString(4));
        }
        return Unsupported(context_ + ": entry " + Quote(fqn) + " is stored through the transforms [" + names +
                           "] (e.g. compression) in " + Quote(item.file) +
                           "; only untransformed items can be read in place");
      }
    }
    if (!by_key.emplace(ItemKey(fqn, e.is_bytes ? nullptr : &offsets), out->items.size()).second) {
      return Bad(what() + (e.is_bytes ? "" : " at offsets " + Dims(offsets)) + " is given twice");
    }
    out->items.push_back(std::move(item));
  }
  // Every chunk and bytes entry has its item; every item belongs to one.
  size_t used = 0;
  for (DcpEntry& e : out->entries) {
    if (e.is_bytes) {
      const auto it = by_key.find(ItemKey(e.fqn, nullptr));
      if (it == by_key.end()) return Bad("bytes entry " + Quote(e.fqn) + " has no storage_data");
      e.item = it->second;
      ++used;
      continue;
    }
    DCKPT_RETURN_IF_ERROR(Spend(e.chunks.size()));
    for (size_t i = 0; i < e.chunks.size(); ++i) {
      const auto it = by_key.find(ItemKey(e.fqn, &e.chunks[i].offsets));
      if (it == by_key.end()) {
        return Bad("entry " + Quote(e.fqn) + " chunk #" + std::to_string(i) + " at offsets " +
                   Dims(e.chunks[i].offsets) + " has no storage_data");
      }
      e.chunks[i].item = it->second;
      ++used;
    }
  }
  if (used != out->items.size()) {
    // Two chunks of a tensor at the same offsets share an item (the tiling check refuses them later); otherwise an
    // item no chunk uses is a storage_data entry for offsets the tensor has no chunk at.
    std::vector<bool> seen(out->items.size());
    for (const DcpEntry& e : out->entries) {
      if (e.is_bytes) seen[e.item] = true;
      for (const DcpChunk& c : e.chunks) seen[c.item] = true;
    }
    for (size_t i = 0; i < out->items.size(); ++i) {
      if (!seen[i]) {
        return Bad("storage_data item #" + std::to_string(i) + " (in " + Quote(out->items[i].file) +
                   ") belongs to no chunk of its entry");
      }
    }
  }
  return OkStatus();
}

Result<DcpMetadata> Checker::Run(const PickleValue& root) {
  DcpMetadata out;
  DCKPT_ASSIGN_OR_RETURN(Fields f,
                         FieldsOf(root, kMetaModule, "Metadata", [] { return std::string("the pickled object"); }));
  const PickleValue sdm_in = Get(f, "state_dict_metadata");
  if (!IsDictLike(sdm_in)) return Bad("state_dict_metadata is " + Describe(sdm_in) + ", not a dict");
  const PickleValue sdm = AsDict(sdm_in);
  DCKPT_RETURN_IF_ERROR(Spend(sdm.size() + 1));
  out.entries.reserve(sdm.size());
  for (size_t i = 0; i < sdm.size(); ++i) {
    DCKPT_ASSIGN_OR_RETURN(std::string fqn,
                           String(sdm.key(i), [] { return std::string("an FQN of state_dict_metadata"); }));
    if (fqn.empty() || fqn.size() > kMaxFqnBytes || fqn.find('\0') != std::string::npos) {
      return Bad("the FQN " + Quote(fqn) + " is empty, longer than " + std::to_string(kMaxFqnBytes) +
                 " bytes or holds a NUL byte");
    }
    DcpEntry e;
    e.fqn = std::move(fqn);
    const PickleValue md = sdm.value(i);
    if (IsClass(md, kMetaModule, "BytesStorageMetadata")) {
      DCKPT_RETURN_IF_ERROR(
          FieldsOf(md, kMetaModule, "BytesStorageMetadata", [&e] { return "entry " + Quote(e.fqn); }).status());
      e.is_bytes = true;
    } else {
      DCKPT_RETURN_IF_ERROR(Tensor(md, &e));
    }
    out.entries.push_back(std::move(e));
  }
  entry_index_.reserve(out.entries.size());
  for (size_t i = 0; i < out.entries.size(); ++i) {
    if (!entry_index_.emplace(out.entries[i].fqn, i).second) {
      return Bad("the FQN " + Quote(out.entries[i].fqn) + " appears twice in state_dict_metadata");
    }
  }
  const PickleValue pd_in = Get(f, "planner_data");
  if (!Absent(pd_in)) {
    if (!IsDictLike(pd_in)) return Bad("planner_data is " + Describe(pd_in) + ", not a dict");
    const PickleValue pd = AsDict(pd_in);
    DCKPT_RETURN_IF_ERROR(Spend(pd.size() + 1));
    out.planner_data.reserve(pd.size());
    for (size_t i = 0; i < pd.size(); ++i) {
      DCKPT_ASSIGN_OR_RETURN(std::string fqn, String(pd.key(i), [] { return std::string("an FQN of planner_data"); }));
      const PickleValue path = pd.value(i);
      if (!path.is(PickleKind::kTuple) && !path.is(PickleKind::kList)) {
        return Bad("planner_data of " + Quote(fqn) + " is " + Describe(path) + ", not a tuple of keys");
      }
      DCKPT_RETURN_IF_ERROR(Spend(path.size() + 1));
      std::vector<DcpPathKey> keys;
      keys.reserve(path.size());
      for (size_t k = 0; k < path.size(); ++k) {
        DcpPathKey key;
        if (path.item(k).is(PickleKind::kString)) {
          key.key = std::string(path.item(k).str());
        } else if (path.item(k).is(PickleKind::kInt)) {
          key.is_index = true;
          key.index = path.item(k).int_value();
        } else {
          return Bad("planner_data of " + Quote(fqn) + " holds a key that is neither a string nor an integer");
        }
        keys.push_back(std::move(key));
      }
      out.planner_data.emplace_back(std::move(fqn), std::move(keys));
    }
  }
  const PickleValue sd = Get(f, "storage_data");
  if (!Absent(sd) && !IsDictLike(sd)) return Bad("storage_data is " + Describe(sd) + ", not a dict");
  DCKPT_RETURN_IF_ERROR(StorageData(Absent(sd) ? PickleValue() : sd, &out));
  const PickleValue meta = Get(f, "storage_meta");
  if (!Absent(meta)) {
    DCKPT_ASSIGN_OR_RETURN(Fields m,
                           FieldsOf(meta, kMetaModule, "StorageMeta", [] { return std::string("storage_meta"); }));
    const PickleValue save_id = Get(m, "save_id");
    if (!Absent(save_id)) {
      DCKPT_ASSIGN_OR_RETURN(out.save_id, String(save_id, [] { return std::string("storage_meta.save_id"); }));
    }
  }
  const PickleValue version = Get(f, "version");
  if (!Absent(version)) {
    DCKPT_ASSIGN_OR_RETURN(out.version, String(version, [] { return std::string("version"); }));
  }
  return out;
}

// A data file whose reads are counted (DescribeDcpMetadata's read budget).
class CountingFile : public ReadableFile {
 public:
  CountingFile(const ReadableFile& file, uint64_t* count) : file_(file), count_(count) {}
  Status ReadAt(uint64_t offset, void* data, size_t size) const override {
    *count_ += size;
    return file_.ReadAt(offset, data, size);
  }
  uint64_t size() const override { return file_.size(); }
  const std::string& path() const override { return file_.path(); }

 private:
  const ReadableFile& file_;
  uint64_t* count_;
};

// ---- JSON for the planner_data user key -----------------------------------------------------------------------------

void AppendJsonString(std::string* out, std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      out->append("\\u00");
      out->push_back(kHex[u >> 4]);
      out->push_back(kHex[u & 15]);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

std::string PlannerDataJson(const DcpMetadata& md) {
  std::string out = "{";
  for (size_t i = 0; i < md.planner_data.size(); ++i) {
    if (i) out += ", ";
    AppendJsonString(&out, md.planner_data[i].first);
    out += ": [";
    const std::vector<DcpPathKey>& keys = md.planner_data[i].second;
    for (size_t k = 0; k < keys.size(); ++k) {
      if (k) out += ", ";
      if (keys[k].is_index) {
        out += std::to_string(keys[k].index);
      } else {
        AppendJsonString(&out, keys[k].key);
      }
    }
    out += "]";
  }
  return out + "}";
}

}  // namespace

Result<DcpMetadata> ParseDcpMetadata(std::string_view bytes, const std::string& context) {
  if (bytes.size() > kMaxDcpMetadataBytes) {
    return Corrupt(context + ": DCP metadata of " + std::to_string(bytes.size()) + " bytes is larger than the limit");
  }
  PickleOptions opts;
  opts.context = context;
  opts.allowed_globals = MetadataGlobals();
  opts.max_input_bytes = kMaxDcpMetadataBytes;
  DCKPT_ASSIGN_OR_RETURN(DecodedPickle decoded, DecodePickle(bytes, opts));
  Checker checker(context, 16 * static_cast<uint64_t>(bytes.size()) + 1024);
  DCKPT_ASSIGN_OR_RETURN(DcpMetadata md, checker.Run(decoded.root()));
  md.metadata_bytes = bytes.size();
  return md;
}

Result<MetadataRecord> DescribeTorchDcp(Storage* storage, const std::string& dir) {
  const std::string where = "'" + dir + "'";
  auto opened = storage->OpenDirectory(dir);
  if (!opened.ok()) {
    return Status(opened.status().code(),
                  where + " is not a torch.distributed.checkpoint directory: " + opened.status().message());
  }
  std::unique_ptr<Directory> d = std::move(opened).value();
  const std::string meta_path = "'" + dir + "/" + kDcpMetadataFileName + "'";
  auto meta_file = d->OpenFile(kDcpMetadataFileName);
  if (!meta_file.ok()) {
    if (meta_file.status().code() == StatusCode::kNotFound) {
      return NotFound(where + " is not a torch.distributed.checkpoint directory: it has no " +
                      std::string(kDcpMetadataFileName) + " file (or its save did not finish)");
    }
    return meta_file.status();
  }
  const uint64_t meta_size = (*meta_file)->size();
  if (meta_size > kMaxDcpMetadataBytes) {
    return Corrupt(meta_path + ": DCP metadata of " + std::to_string(meta_size) +
                   " bytes is larger than the limit of " + std::to_string(kMaxDcpMetadataBytes));
  }
  std::string bytes(meta_size, '\0');
  DCKPT_RETURN_IF_ERROR((*meta_file)->ReadAt(0, bytes.data(), bytes.size()));
  DCKPT_ASSIGN_OR_RETURN(DcpMetadata md, ParseDcpMetadata(bytes, meta_path));
  bytes = std::string();
  return DescribeDcpMetadata(md, dir, [&d](const std::string& name) { return d->OpenFile(name); });
}

Result<MetadataRecord> DescribeDcpMetadata(const DcpMetadata& md, const std::string& dir,
                                           const DcpFileOpener& open_file) {
  const std::string where = "'" + dir + "'";
  for (const DcpEntry& e : md.entries) {  // ParseDcpMetadata gives valid indices; a hand-made DcpMetadata may not
    bool ok = !e.is_bytes || e.item < md.items.size();
    for (const DcpChunk& c : e.chunks) ok = ok && c.item < md.items.size();
    if (!ok) return InvalidArgument(where + ": entry " + Quote(e.fqn) + " refers to an item that does not exist");
  }
  // The files the non-empty chunks and the bytes entries use, in name order.
  auto chunk_volume_nonzero = [](const DcpChunk& c) {
    for (uint64_t s : c.sizes) {
      if (s == 0) return false;
    }
    return true;
  };
  std::map<std::string, uint32_t> file_index;
  for (const DcpEntry& e : md.entries) {
    if (e.is_bytes) file_index.emplace(md.items[e.item].file, 0);
    for (const DcpChunk& c : e.chunks) {
      if (chunk_volume_nonzero(c)) file_index.emplace(md.items[c.item].file, 0);
    }
  }
  MetadataRecord record;
  record.writer = kDcpWriter;
  record.source = kDcpSource;
  record.alignment = 1;
  std::vector<std::unique_ptr<ReadableFile>> files;
  for (auto& [name, index] : file_index) {
    auto f = open_file(name);
    if (!f.ok()) {
      const std::string msg = where + ": data file '" + name + "' that the DCP metadata refers to: ";
      return Status(f.status().code(), msg + f.status().message());
    }
    index = static_cast<uint32_t>(files.size());
    record.files.push_back(DataFileRecord{name, (*f)->size()});
    files.push_back(std::move(f).value());
  }
  // Legitimate items cost at most 8 KiB of reads each (their first and last 4 KiB) and over 100 bytes of metadata.
  const uint64_t read_budget =
      md.metadata_bytes > (uint64_t{1} << 48) ? UINT64_MAX : 256 * md.metadata_bytes + (uint64_t{1} << 20);
  uint64_t bytes_read = 0;
  auto item_in_file = [&](const DcpItem& item, const std::string& what) -> Result<uint32_t> {
    const uint32_t fi = file_index.at(item.file);
    const uint64_t size = record.files[fi].size;
    if (item.offset > size || item.length > size - item.offset) {
      return Corrupt("'" + dir + "/" + item.file + "': " + what + " at [" + std::to_string(item.offset) + ", +" +
                     std::to_string(item.length) + ") lies past the end of the file (" + std::to_string(size) +
                     " bytes): the file is truncated");
    }
    return fi;
  };

  record.entries.reserve(md.entries.size());
  for (const DcpEntry& e : md.entries) {
    EntryRecord r;
    r.name = e.fqn;
    const std::string what = "entry " + Quote(e.fqn);
    if (e.is_bytes) {
      const DcpItem& item = md.items[e.item];
      DCKPT_ASSIGN_OR_RETURN(uint32_t fi, item_in_file(item, "the bytes of " + what));
      r.kind = EntryKind::kBytes;
      r.dtype = DType::kU8;
      r.shape = {item.length};
      r.chunk_offsets = {0};
      r.chunk_lengths = {item.length};
      r.chunks.push_back(ChunkLocation{item.offset, item.length, 0, fi, kNoBlockTable});
      record.entries.push_back(std::move(r));
      continue;
    }
    r.kind = EntryKind::kTensor;
    r.dtype = DTypeFromTorchName(e.torch_dtype);
    if (r.dtype == DType::kInvalid) {
      return Unsupported(where + ": " + what + " has the torch dtype " + e.torch_dtype +
                         ", which distckpt has no dtype for");
    }
    if (e.shape.size() > kMaxDims) {
      return Unsupported(where + ": " + what + " has " + std::to_string(e.shape.size()) + " dimensions; distckpt " +
                         "reads at most " + std::to_string(kMaxDims));
    }
    const uint64_t itemsize = DTypeSize(r.dtype);
    uint64_t volume = itemsize;
    for (uint64_t s : e.shape) {
      if (s != 0 && volume > std::numeric_limits<uint64_t>::max() / s) {
        return Corrupt(where + ": " + what + " of size " + Dims(e.shape) + " overflows 64 bits");
      }
      volume *= s;
    }
    r.shape = e.shape;
    std::vector<Box> boxes;
    for (size_t i = 0; i < e.chunks.size(); ++i) {
      const DcpChunk& c = e.chunks[i];
      if (!chunk_volume_nonzero(c)) continue;  // an empty shard (a rank with no rows) holds no data
      const DcpItem& item = md.items[c.item];
      const std::string cw = what + " chunk #" + std::to_string(i) + " (offsets " + Dims(c.offsets) + ")";
      DCKPT_ASSIGN_OR_RETURN(uint32_t fi, item_in_file(item, "the item of " + cw));
      const std::string ctx = "'" + dir + "/" + item.file + "': the torch.save item of " + cw + " at [" +
                              std::to_string(item.offset) + ", +" + std::to_string(item.length) + ")";
      if (bytes_read > read_budget) {
        return Corrupt(where + ": " + what + ": the metadata's items would take more than " +
                       std::to_string(read_budget) + " bytes of zip structures to read, out of proportion to its size");
      }
      const CountingFile counted(*files[fi], &bytes_read);
      DCKPT_ASSIGN_OR_RETURN(TorchSavedTensor t, LocateTorchSavedTensor(counted, item.offset, item.length, ctx));
      if (t.torch_dtype != e.torch_dtype) {
        return Corrupt(ctx + ": holds a tensor of " + t.torch_dtype + "; the metadata says " + e.torch_dtype);
      }
      if (t.shape != c.sizes) {
        return Corrupt(ctx + ": holds a tensor of size " + Dims(t.shape) + "; the metadata says " + Dims(c.sizes));
      }
      DCKPT_ASSIGN_OR_RETURN(Box box, Box::Make(c.offsets, c.sizes));
      boxes.push_back(box);
      r.chunk_offsets.insert(r.chunk_offsets.end(), c.offsets.begin(), c.offsets.end());
      r.chunk_lengths.insert(r.chunk_lengths.end(), c.sizes.begin(), c.sizes.end());
      r.chunks.push_back(ChunkLocation{t.data_offset, t.data_length, 0, fi, kNoBlockTable});
    }
    Status tiling = CheckExactTiling(Span<const uint64_t>(e.shape.data(), e.shape.size()), boxes);
    if (!tiling.ok()) {
      return Corrupt(where + ": " + what + ": the chunks do not tile its size " + Dims(e.shape) +
                     " exactly: " + tiling.message());
    }
    record.entries.push_back(std::move(r));
  }
  if (!md.version.empty()) record.user.emplace_back(kDcpVersionKey, md.version);
  if (!md.save_id.empty()) record.user.emplace_back("torch_dcp.save_id", md.save_id);
  if (!md.planner_data.empty()) record.user.emplace_back("torch_dcp.planner_data", PlannerDataJson(md));
  return record;
}

}  // namespace distckpt
