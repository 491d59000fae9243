// The safetensors exporter: files are parsed back with an independent JSON reader and checked byte for byte against
// the checkpoint (the Python suite also loads them with the real `safetensors` package).
#include "core/tools/safetensors_export.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/base/testing/read_file.h"
#include "core/base/testing/temp_dir.h"
#include "core/comm/gloo/gloo.h"
#include "core/comm/gloo/gloo_test_util.h"
#include "core/engine/reader.h"
#include "core/engine/save.h"

namespace distckpt {
namespace {

using testing_util::MakeTempDir;
using testing_util::ReadFileToString;

// ---- A minimal JSON reader (objects, arrays, strings, unsigned integers), enough for safetensors headers. ----

struct Json {
  enum Kind { kNull, kNumber, kString, kArray, kObject } kind = kNull;
  uint64_t number = 0;
  std::string str;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;  // in file order

  const Json& operator[](const std::string& key) const {
    for (const auto& [k, v] : members) {
      if (k == key) return v;
    }
    static const Json null;
    return null;
  }
  std::vector<uint64_t> Numbers() const {
    std::vector<uint64_t> out;
    for (const Json& j : items) out.push_back(j.number);
    return out;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  bool Parse(Json* out) {
    if (!Value(out)) return false;
    Ws();
    return i_ == s_.size();
  }

 private:
  void Ws() {
    while (i_ < s_.size() && std::strchr(" \t\r\n", s_[i_]) != nullptr) ++i_;
  }
  bool Eat(char c) {
    Ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') {
        if (++i_ >= s_.size()) return false;
        char c = s_[i_];
        if (c == 'u') {
          if (i_ + 4 >= s_.size()) return false;
          out->push_back(static_cast<char>(std::stoi(s_.substr(i_ + 1, 4), nullptr, 16)));
          i_ += 4;
        } else {
          out->push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : c == 'f' ? '\f' : c);
        }
        ++i_;
      } else {
        out->push_back(s_[i_++]);
      }
    }
    return Eat('"');
  }
  bool Value(Json* out) {
    Ws();
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '"') {
      out->kind = Json::kString;
      return String(&out->str);
    }
    if (c == '[') {
      ++i_;
      out->kind = Json::kArray;
      if (Eat(']')) return true;
      do {
        out->items.emplace_back();
        if (!Value(&out->items.back())) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '{') {
      ++i_;
      out->kind = Json::kObject;
      if (Eat('}')) return true;
      do {
        std::string key;
        if (!String(&key) || !Eat(':')) return false;
        out->members.emplace_back(key, Json());
        if (!Value(&out->members.back().second)) return false;
      } while (Eat(','));
      return Eat('}');
    }
    if (c >= '0' && c <= '9') {
      out->kind = Json::kNumber;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') out->number = out->number * 10 + (s_[i_++] - '0');
      return true;
    }
    return false;
  }
  const std::string& s_;
  size_t i_ = 0;
};

// ---- Helpers ----

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> ListDir(const std::string& dir) {
  auto r = DefaultStorage()->ListDir(dir);
  return r.ok() ? *r : std::vector<std::string>{};
}

struct TestTensor {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;
};

TestTensor MakeTensor(const std::string& name, DType dtype, std::vector<uint64_t> shape) {
  TestTensor t{name, dtype, shape, {}};
  uint64_t n = DTypeSize(dtype);
  for (uint64_t d : shape) n *= d;
  t.data.resize(n);
  for (uint64_t i = 0; i < n; ++i) t.data[i] = static_cast<uint8_t>((i * 7 + name.size() * 13 + i / 251) % 256);
  return t;
}

// Saves the tensors, each split in two row pieces where it has rows, plus the given bytes entry and user metadata.
void SaveCheckpoint(const std::string& path, std::vector<TestTensor>& tensors,
                    const std::map<std::string, std::string>& user = {}, std::string blob = "") {
  State state;
  for (TestTensor& t : tensors) {
    ASSERT_TRUE(state.AddTensor(t.name, t.dtype, t.shape).ok());
    if (t.shape.empty() || t.shape[0] < 2) {
      std::vector<uint64_t> zero(t.shape.size(), 0);
      ASSERT_TRUE(state.AddPiece(t.name, zero, t.shape, t.data.data()).ok());
      continue;
    }
    uint64_t half = t.shape[0] / 2;
    uint64_t row = t.data.size() / t.shape[0];
    std::vector<uint64_t> off(t.shape.size(), 0), len = t.shape;
    len[0] = half;
    ASSERT_TRUE(state.AddPiece(t.name, off, len, t.data.data()).ok());
    off[0] = half;
    len[0] = t.shape[0] - half;
    ASSERT_TRUE(state.AddPiece(t.name, off, len, t.data.data() + half * row).ok());
  }
  if (!blob.empty()) {
    ASSERT_TRUE(state.AddBytes("blob", blob.data(), blob.size()).ok());
  }
  for (const auto& [k, v] : user) state.SetUserMetadata(k, v);
  SaveOptions so;
  so.sync = false;
  auto r = Save(path, state, nullptr, so);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

struct ParsedFile {
  uint64_t header_len = 0;
  std::string raw_header;
  Json header;
  std::string data;  // everything after the header
};

ParsedFile ParseSafetensors(const std::string& path) {
  ParsedFile p;
  std::string bytes = ReadFileToString(path);
  EXPECT_GE(bytes.size(), 8u) << path;
  if (bytes.size() < 8) return p;
  for (int b = 7; b >= 0; --b) p.header_len = (p.header_len << 8) | static_cast<uint8_t>(bytes[b]);
  EXPECT_LE(8 + p.header_len, bytes.size()) << path;
  p.raw_header = bytes.substr(8, p.header_len);
  p.data = bytes.substr(8 + p.header_len);
  EXPECT_TRUE(JsonParser(p.raw_header).Parse(&p.header)) << p.raw_header;
  return p;
}

// Checks the structural rules of the format (safetensors' own validator) and returns name -> bytes.
std::map<std::string, std::string> CheckFile(const std::string& path, std::map<std::string, Json>* infos = nullptr) {
  ParsedFile p = ParseSafetensors(path);
  EXPECT_EQ(p.header_len % 8, 0u) << "header not padded to 8 bytes";
  EXPECT_EQ(p.raw_header.front(), '{');
  EXPECT_EQ(p.raw_header.find_last_not_of(' '), p.raw_header.rfind('}')) << "padding must be spaces";
  EXPECT_EQ(p.header.kind, Json::kObject);
  std::map<std::string, std::string> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, info] : p.header.members) {
    if (name == "__metadata__") {
      for (const auto& kv : info.members) EXPECT_EQ(kv.second.kind, Json::kString) << "metadata values are strings";
      continue;
    }
    std::vector<uint64_t> offs = info["data_offsets"].Numbers();
    EXPECT_EQ(offs.size(), 2u);
    DType dt = DTypeFromName(info["dtype"].str);
    EXPECT_NE(dt, DType::kInvalid) << info["dtype"].str;
    uint64_t expect = DTypeSize(dt);
    for (uint64_t d : info["shape"].Numbers()) expect *= d;
    EXPECT_EQ(offs[1] - offs[0], expect) << name;
    EXPECT_EQ(offs[0] % DTypeSize(dt), 0u) << name << " is not aligned to its element size";
    ranges.emplace_back(offs[0], offs[1]);
    out[name] = p.data.substr(offs[0], offs[1] - offs[0]);
    if (infos) (*infos)[name] = info;
  }
  // No holes, no overlaps, nothing after the last tensor.
  std::sort(ranges.begin(), ranges.end());
  uint64_t end = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, end);
    end = e;
  }
  EXPECT_EQ(end, p.data.size());
  return out;
}

std::string Bytes(const TestTensor& t) { return std::string(t.data.begin(), t.data.end()); }

// ---- Tests ----

TEST(SafetensorsExportTest, ShardsStreamsAndRoundTripsEveryDtype) {
  std::vector<TestTensor> tensors = {
      MakeTensor("a.f32", DType::kF32, {6, 5}),
      MakeTensor("b.bf16", DType::kBF16, {17}),
      MakeTensor("c.scalar_i64", DType::kI64, {}),
      MakeTensor("d.empty_u8", DType::kU8, {0, 4}),
      MakeTensor("e.bool", DType::kBool, {3, 3}),
      MakeTensor("f.f8e4m3", DType::kF8E4M3FN, {8}),
      MakeTensor("g.f8e5m2", DType::kF8E5M2, {8}),
      MakeTensor("h.big_f64", DType::kF64, {7, 9, 11}),  // 5544 bytes: larger than the buffer, and than a shard
      MakeTensor("i.c64", DType::kC64, {4, 2}),
      MakeTensor("j.u16", DType::kU16, {5}),
      MakeTensor("k.i8", DType::kI8, {2, 1, 1, 1, 1, 1, 1, 3}),
      MakeTensor("l.f16", DType::kF16, {33}),
      MakeTensor("m.u32", DType::kU32, {3}),
      MakeTensor("n.i32", DType::kI32, {3}),
      MakeTensor("o.u64", DType::kU64, {2}),
      MakeTensor("p.i16", DType::kI16, {2}),
  };
  std::string ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(ckpt, tensors, {{"step", "100"}, {"quote\"key", "line\nbreak"}}, "opaque blob");
  std::string out = MakeTempDir("st_export_out_");

  SafetensorsExportOptions opts;
  opts.max_shard_bytes = 1500;
  opts.buffer_bytes = 64;  // 32-byte halves: every tensor above that is streamed slab by slab
  uint64_t last_done = 0, last_total = 0;
  int calls = 0;
  opts.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
    ++calls;
    return 0;
  };
  auto r = ExportSafetensors(ckpt, out, opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_tensors, tensors.size());
  EXPECT_EQ(r->skipped_bytes_entries, 1u);
  uint64_t total = 0;
  for (const TestTensor& t : tensors) total += t.data.size();
  EXPECT_EQ(r->total_size, total);
  EXPECT_EQ(last_done, total);
  EXPECT_EQ(last_total, total);
  EXPECT_GT(calls, 100);  // streamed in many small pieces
  ASSERT_GE(r->files.size(), 3u);

  const size_t n = r->files.size();
  std::map<std::string, std::string> got;
  std::map<std::string, std::string> file_of;
  for (size_t i = 0; i < n; ++i) {
    char expect_name[64];
    std::snprintf(expect_name, sizeof expect_name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    EXPECT_EQ(r->files[i], expect_name);
    const std::string path = out + "/" + r->files[i];
    std::map<std::string, Json> infos;
    auto tensors_in_file = CheckFile(path, &infos);
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    if (tensors_in_file.count("h.big_f64") == 0) {
      EXPECT_LE(static_cast<uint64_t>(st.st_size), opts.max_shard_bytes) << path;
    } else {
      EXPECT_EQ(tensors_in_file.size(), 1u) << "an oversized tensor gets a file of its own";
    }
    for (auto& [name, bytes] : tensors_in_file) {
      got[name] = bytes;
      file_of[name] = r->files[i];
    }
    ParsedFile p = ParseSafetensors(path);
    const Json& md = p.header["__metadata__"];
    EXPECT_EQ(md["step"].str, "100");
    EXPECT_EQ(md["quote\"key"].str, "line\nbreak");
    EXPECT_EQ(md["format"].str, "pt");
  }
  ASSERT_EQ(got.size(), tensors.size());
  for (const TestTensor& t : tensors) EXPECT_EQ(got[t.name], Bytes(t)) << t.name;

  // Names, shapes and dtypes come through as safetensors spells them.
  {
    std::map<std::string, Json> infos;
    for (const std::string& f : r->files) CheckFile(out + "/" + f, &infos);
    EXPECT_EQ(infos["f.f8e4m3"]["dtype"].str, "F8_E4M3");
    EXPECT_EQ(infos["b.bf16"]["dtype"].str, "BF16");
    EXPECT_EQ(infos["e.bool"]["dtype"].str, "BOOL");
    EXPECT_EQ(infos["c.scalar_i64"]["shape"].items.size(), 0u);
    EXPECT_EQ(infos["d.empty_u8"]["shape"].Numbers(), (std::vector<uint64_t>{0, 4}));
    EXPECT_EQ(infos["h.big_f64"]["shape"].Numbers(), (std::vector<uint64_t>{7, 9, 11}));
  }

  // The index names every tensor's file and the total size.
  Json index;
  std::string index_text = ReadFileToString(out + "/model.safetensors.index.json");
  ASSERT_TRUE(JsonParser(index_text).Parse(&index)) << index_text;
  EXPECT_EQ(index["metadata"]["total_size"].number, total);
  EXPECT_EQ(index["weight_map"].members.size(), tensors.size());
  for (const auto& [name, file] : index["weight_map"].members) EXPECT_EQ(file.str, file_of[name]) << name;

  // No temporary file is left behind.
  for (const std::string& name : ListDir(out)) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
}

TEST(SafetensorsExportTest, SingleFileIsStillIndexedAndPrefixIsUsed) {
  std::vector<TestTensor> tensors = {MakeTensor("w", DType::kF32, {4, 4}), MakeTensor("x", DType::kU8, {3})};
  std::string ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(ckpt, tensors, {{"format", "flax"}});
  std::string out = MakeTempDir("st_export_out_");
  SafetensorsExportOptions opts;
  opts.prefix = "weights";
  auto r = ExportSafetensors(ckpt, out, opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->files, (std::vector<std::string>{"weights-00001-of-00001.safetensors"}));
  EXPECT_EQ(r->index_file, "weights.safetensors.index.json");
  EXPECT_TRUE(Exists(out + "/weights.safetensors.index.json"));
  ParsedFile p = ParseSafetensors(out + "/" + r->files[0]);
  EXPECT_EQ(p.header["__metadata__"]["format"].str, "flax") << "the user's format is kept";
  auto got = CheckFile(out + "/" + r->files[0]);
  EXPECT_EQ(got["w"], Bytes(tensors[0]));
  EXPECT_EQ(got["x"], Bytes(tensors[1]));

  // Exporting again replaces the files.
  r = ExportSafetensors(ckpt, out, opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CheckFile(out + "/" + r->files[0])["w"], Bytes(tensors[0]));
}

TEST(SafetensorsExportTest, Complex128IsRefusedBeforeWritingAnything) {
  std::vector<TestTensor> tensors = {MakeTensor("fine", DType::kF32, {2}), MakeTensor("z.c128", DType::kC128, {2})};
  std::string ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(ckpt, tensors);
  std::string out = MakeTempDir("st_export_out_");
  auto r = ExportSafetensors(ckpt, out, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("z.c128"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("C128"), std::string::npos) << r.status().message();
  EXPECT_TRUE(ListDir(out).empty());
}

TEST(SafetensorsExportTest, BadArgumentsAndAbortLeaveNothingBehind) {
  std::vector<TestTensor> tensors = {MakeTensor("a", DType::kF32, {64, 64}), MakeTensor("b", DType::kF32, {64})};
  std::string ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(ckpt, tensors);
  std::string out = MakeTempDir("st_export_out_");

  auto r = ExportSafetensors(ckpt, out + "/missing", {});
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("missing"), std::string::npos);

  SafetensorsExportOptions bad;
  bad.prefix = "../evil";
  EXPECT_EQ(ExportSafetensors(ckpt, out, bad).status().code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(ExportSafetensors(ckpt + "-nope", out, {}).status().code(), StatusCode::kNotFound);

  SafetensorsExportOptions abort;
  abort.buffer_bytes = 1024;
  abort.max_shard_bytes = 8192;
  abort.progress = [](uint64_t done, uint64_t) { return done > 4096 ? 1 : 0; };
  r = ExportSafetensors(ckpt, out, abort);
  EXPECT_EQ(r.status().code(), StatusCode::kUser);
  EXPECT_TRUE(ListDir(out).empty()) << "temporary files must be removed";

  // Aborted with writes still in flight (a ring of four page-sized buffers, on one thread and on two): every write
  // ends before its file and buffers go (ASan checks), and nothing is left.
  std::vector<TestTensor> big = {MakeTensor("a", DType::kF32, {256, 256}), MakeTensor("b", DType::kF32, {256, 200})};
  const std::string big_ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(big_ckpt, big);
  for (size_t threads : {1, 2}) {
    SafetensorsExportOptions in_flight;
    in_flight.buffer_bytes = 5 * 4096 * threads;
    in_flight.io_threads = threads;
    in_flight.max_shard_bytes = 300000;
    in_flight.progress = [](uint64_t done, uint64_t) { return done > 3 * 4096 ? 1 : 0; };
    r = ExportSafetensors(big_ckpt, out, in_flight);
    EXPECT_EQ(r.status().code(), StatusCode::kUser) << r.status().ToString();
    EXPECT_TRUE(ListDir(out).empty());
  }
}

TEST(SafetensorsExportTest, CorruptDataIsReportedWhenVerifying) {
  std::vector<TestTensor> tensors = {MakeTensor("a", DType::kF32, {128})};
  std::string ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(ckpt, tensors);
  // Flip one byte of the data file.
  std::string data_file = ckpt + "/data-00000.bin";
  std::string bytes = ReadFileToString(data_file);
  ASSERT_FALSE(bytes.empty());
  bytes[0] ^= 0xff;
  std::ofstream(data_file, std::ios::binary | std::ios::trunc) << bytes;
  std::string out = MakeTempDir("st_export_out_");
  auto r = ExportSafetensors(ckpt, out, {});
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().ToString();
  EXPECT_TRUE(ListDir(out).empty());
  SafetensorsExportOptions no_verify;
  no_verify.verify = false;
  EXPECT_TRUE(ExportSafetensors(ckpt, out, no_verify).ok());
}

// A data file replaced by a link to a valid copy outside the checkpoint: refused, with or without verification,
// and nothing is written.
TEST(SafetensorsExportTest, NeverReadsThroughALinkInsideTheCheckpoint) {
  std::vector<TestTensor> tensors = {MakeTensor("a", DType::kF32, {128})};
  const std::string dir = MakeTempDir("st_export_ckpt_");
  const std::string ckpt = dir + "/ckpt";
  SaveCheckpoint(ckpt, tensors);
  const std::string data_file = ckpt + "/data-00000.bin";
  ASSERT_EQ(::rename(data_file.c_str(), (dir + "/outside.bin").c_str()), 0);
  ASSERT_EQ(::symlink((dir + "/outside.bin").c_str(), data_file.c_str()), 0);
  for (const bool verify : {true, false}) {
    SafetensorsExportOptions opts;
    opts.verify = verify;
    const std::string out = MakeTempDir("st_export_out_");
    auto r = ExportSafetensors(ckpt, out, opts);
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().ToString();
    EXPECT_NE(r.status().message().find(data_file + "' is a symbolic link"), std::string::npos)
        << r.status().ToString();
    EXPECT_TRUE(ListDir(out).empty());
  }
}

// ---- Rename rules, buffers of every size, file size limits, several threads and several ranks ----

// Reads every file of an export through its index: name -> bytes; checks that the index lists exactly the files
// (and the tensors) there are, and that no temporary file is left.
std::map<std::string, std::string> ReadExport(const std::string& out, const std::string& prefix = "model") {
  Json index;
  std::string text = ReadFileToString(out + "/" + prefix + ".safetensors.index.json");
  EXPECT_TRUE(JsonParser(text).Parse(&index)) << text;
  std::map<std::string, std::string> got;
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].members) files.insert(file.str);
  for (const std::string& f : files) {
    for (auto& [name, bytes] : CheckFile(out + "/" + f)) {
      EXPECT_EQ(got.count(name), 0u) << name << " is in two files";
      EXPECT_EQ(index["weight_map"][name].str, f) << name;
      got[name] = bytes;
    }
  }
  EXPECT_EQ(got.size(), index["weight_map"].members.size());
  for (const std::string& name : ListDir(out)) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
  return got;
}

TEST(SafetensorsExportTest, RenameRulesRenameDropAndAreCheckedBeforeWriting) {
  std::vector<TestTensor> tensors = {
      MakeTensor("params.layers_0.kernel", DType::kF32, {4, 3}),
      MakeTensor("params.layers_1.kernel", DType::kBF16, {5, 2}),
      MakeTensor("params.embed", DType::kF16, {7}),
      MakeTensor("opt.mu.layers_0", DType::kF32, {4, 3}),
      MakeTensor("opt.nu.complex", DType::kC128, {2}),  // dropped by a rule: no longer refused
  };
  const std::string ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(ckpt, tensors);
  const std::string out = MakeTempDir("st_export_out_");
  SafetensorsExportOptions opts;
  opts.rename_rules = {{R"(params\.layers_(\d+)\.kernel)", R"(model.layers.\1.weight)"},
                       {R"(params\.(.*))", R"(model.\1)"},
                       {R"(opt\..*)", ""}};
  auto r = ExportSafetensors(ckpt, out, opts);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_tensors, 3u);
  EXPECT_EQ(r->dropped_tensors, 2u);
  EXPECT_EQ(r->total_size, tensors[0].data.size() + tensors[1].data.size() + tensors[2].data.size());
  auto got = ReadExport(out);
  EXPECT_EQ(got, (std::map<std::string, std::string>{{"model.layers.0.weight", Bytes(tensors[0])},
                                                     {"model.layers.1.weight", Bytes(tensors[1])},
                                                     {"model.embed", Bytes(tensors[2])}}));

  // Two tensors onto one name: refused before anything is written, naming both.
  const std::string out2 = MakeTempDir("st_export_out_");
  SafetensorsExportOptions clash;
  clash.rename_rules = {{R"(params\.layers_\d+\.kernel)", "kernel"}};
  r = ExportSafetensors(ckpt, out2, clash);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  for (const char* m : {"'params.layers_0.kernel'", "'params.layers_1.kernel'", "'kernel'", ckpt.c_str()}) {
    EXPECT_NE(r.status().message().find(m), std::string::npos) << m << " in " << r.status().message();
  }
  EXPECT_TRUE(ListDir(out2).empty());
  // A bad pattern, likewise.
  SafetensorsExportOptions bad;
  bad.rename_rules = {{"opt.[", ""}};
  r = ExportSafetensors(ckpt, out2, bad);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("rule 1"), std::string::npos) << r.status().message();
  EXPECT_TRUE(ListDir(out2).empty());
  // The C128 tensor not dropped: refused by name.
  SafetensorsExportOptions keep;
  keep.rename_rules = {{R"(opt\.mu\..*)", ""}};
  r = ExportSafetensors(ckpt, out2, keep);
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("opt.nu.complex"), std::string::npos) << r.status().message();
}

// Odd shapes read through buffers of every size, from one element to more than a file: every buffer boundary falls
// somewhere else inside the tensors (the flat-range-to-boxes split), with one writing thread or several.
TEST(SafetensorsExportTest, EveryBufferSizeAndThreadCountWritesTheSameBytes) {
  std::vector<TestTensor> tensors = {
      MakeTensor("a", DType::kF64, {3, 5, 7}),
      MakeTensor("b", DType::kF32, {11, 13}),
      MakeTensor("c", DType::kBF16, {2, 3, 5, 7}),
      MakeTensor("d", DType::kU8, {1001}),
      MakeTensor("e", DType::kI64, {}),
      MakeTensor("f", DType::kC64, {9, 1, 3}),
      MakeTensor("g", DType::kBool, {0, 5}),
      MakeTensor("h", DType::kI16, {1, 1, 37}),
      MakeTensor("i", DType::kF32, {64, 64, 3}),
      MakeTensor("j", DType::kF8E5M2, {3}),
  };
  const std::string ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(ckpt, tensors);
  std::map<std::string, std::string> want;
  for (const TestTensor& t : tensors) want[t.name] = Bytes(t);
  for (uint64_t buffer : {16ull, 48ull, 200ull, 4096ull * 2, 8200ull * 2, 1ull << 20}) {
    for (size_t threads : {1, 3}) {
      SCOPED_TRACE("buffer " + std::to_string(buffer) + ", threads " + std::to_string(threads));
      const std::string out = MakeTempDir("st_export_out_");
      SafetensorsExportOptions opts;
      opts.buffer_bytes = buffer;
      opts.io_threads = threads;
      opts.max_shard_bytes = 20000;
      auto r = ExportSafetensors(ckpt, out, opts);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_GE(r->files.size(), 3u);
      EXPECT_EQ(r->files_written_here, r->files.size());
      EXPECT_EQ(ReadExport(out), want);
    }
  }
}

// Files never pass the limit (header included) unless one tensor alone does, and each file is nearly as full as it can
// be: the next file's first tensor would not have fitted (give or take the header entries' worst-case estimate).
TEST(SafetensorsExportTest, FilesStayWithinTheSizeLimit) {
  std::vector<TestTensor> tensors;
  for (int i = 0; i < 40; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "layer.%02d.w", i);
    tensors.push_back(MakeTensor(name, i % 3 ? DType::kF32 : DType::kBF16, {static_cast<uint64_t>(8 + i * 5), 9}));
  }
  tensors.push_back(MakeTensor("zz.huge", DType::kF32, {200, 50}));  // 40000 bytes: more than a file may hold
  const std::string ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(ckpt, tensors);
  for (uint64_t limit : {3000ull, 7777ull, 30000ull}) {
    SCOPED_TRACE("limit " + std::to_string(limit));
    const std::string out = MakeTempDir("st_export_out_");
    SafetensorsExportOptions opts;
    opts.max_shard_bytes = limit;
    auto r = ExportSafetensors(ckpt, out, opts);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::vector<std::string>> names_of(r->files.size());
    std::string last;
    for (size_t i = 0; i < r->files.size(); ++i) {
      const std::string path = out + "/" + r->files[i];
      const uint64_t size = ReadFileToString(path).size();
      auto in_file = CheckFile(path);
      for (const auto& [name, bytes] : in_file) names_of[i].push_back(name);
      if (in_file.size() == 1 && in_file.begin()->second.size() + 64 > limit) continue;  // a tensor too big alone
      EXPECT_LE(size, limit) << r->files[i];
      // Names run in order across the files.
      EXPECT_LT(last, names_of[i].front());
      last = names_of[i].back();
      if (i + 1 < r->files.size()) {
        const std::string next = CheckFile(out + "/" + r->files[i + 1]).begin()->first;
        uint64_t next_bytes = 0;
        for (const TestTensor& t : tensors) {
          if (t.name == next) next_bytes = t.data.size();
        }
        // The planner counts each header entry at its largest (20-digit offsets): up to ~160 bytes of slack here.
        EXPECT_GT(size + next_bytes + 160, limit) << r->files[i + 1] << " starts with " << next << ", which fits";
      }
    }
    std::map<std::string, std::string> want;
    for (const TestTensor& t : tensors) want[t.name] = Bytes(t);
    EXPECT_EQ(ReadExport(out), want);
  }
}

// Runs `fn(rank, comm)` on `world` threads, each with its own Gloo communicator over loopback.
void OnRanks(int world, const std::function<void(int, Communicator*)>& fn) {
  const std::string rendezvous = "file://" + MakeTempDir("st_export_rdv_");
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = NewGlooCommunicator(gloo_testing::Loopback(rank, world, rendezvous, std::chrono::seconds(30)));
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      fn(rank, comm->get());
    });
  }
  for (std::thread& t : threads) t.join();
}

std::vector<TestTensor> ManyTensors(int n) {
  std::vector<TestTensor> tensors;
  for (int i = 0; i < n; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "t%02d", i);
    tensors.push_back(MakeTensor(name, DType::kF32, {static_cast<uint64_t>(100 + 37 * i), 8}));
  }
  return tensors;
}

TEST(SafetensorsExportTest, RanksSplitTheFilesByBytesAndRankZeroIndexesThem) {
  std::vector<TestTensor> tensors = ManyTensors(20);
  const std::string ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(ckpt, tensors);
  const std::string out = MakeTempDir("st_export_out_");
  const int world = 3;
  std::vector<Result<SafetensorsExportSummary>> results(world, Internal("not run"));
  OnRanks(world, [&](int rank, Communicator* comm) {
    SafetensorsExportOptions opts;
    opts.comm = comm;
    opts.max_shard_bytes = 20000;
    opts.buffer_bytes = 4096 * 4;
    opts.io_threads = 2;
    opts.timeout = std::chrono::seconds(30);
    results[rank] = ExportSafetensors(ckpt, out, opts);
  });
  uint64_t files = 0, bytes = 0, most = 0, least = UINT64_MAX;
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank].status().ToString();
    EXPECT_EQ(results[rank]->files, results[0]->files);
    EXPECT_GE(results[rank]->files_written_here, 1u) << "rank " << rank << " wrote nothing";
    files += results[rank]->files_written_here;
    bytes += results[rank]->bytes_written_here;
    most = std::max(most, results[rank]->bytes_written_here);
    least = std::min(least, results[rank]->bytes_written_here);
  }
  EXPECT_GE(results[0]->files.size(), 6u);
  EXPECT_EQ(files, results[0]->files.size());
  uint64_t on_disk = 0;
  for (const std::string& f : results[0]->files) on_disk += ReadFileToString(out + "/" + f).size();
  EXPECT_EQ(bytes, on_disk);
  EXPECT_LE(most - least, 20000u) << "balanced by bytes: the spread is at most one file";
  std::map<std::string, std::string> want;
  for (const TestTensor& t : tensors) want[t.name] = Bytes(t);
  EXPECT_EQ(ReadExport(out), want);
}

// One rank fails while writing: every rank fails, no index appears, every temporary file is removed, and the export
// that was there before is left complete (its index and its files).
TEST(SafetensorsExportTest, AFailedRankLeavesNoIndexAndThePreviousExportIntact) {
  std::vector<TestTensor> tensors = ManyTensors(12);
  const std::string ckpt = MakeTempDir("st_export_ckpt_") + "/ckpt";
  SaveCheckpoint(ckpt, tensors);
  std::map<std::string, std::string> want;
  for (const TestTensor& t : tensors) want[t.name] = Bytes(t);

  const std::string fresh = MakeTempDir("st_export_out_");
  const std::string previous = MakeTempDir("st_export_out_");
  SafetensorsExportOptions first;
  first.max_shard_bytes = 20000;
  ASSERT_TRUE(ExportSafetensors(ckpt, previous, first).ok());
  const std::vector<std::string> before = ListDir(previous);

  for (const std::string& out : {fresh, previous}) {
    const int world = 3;
    std::vector<Status> statuses(world);
    OnRanks(world, [&](int rank, Communicator* comm) {
      SafetensorsExportOptions opts;
      opts.comm = comm;
      opts.max_shard_bytes = 7000;  // other file names than the previous export's
      opts.buffer_bytes = 4096 * 2;
      opts.timeout = std::chrono::seconds(30);
      if (rank == 1) opts.progress = [](uint64_t done, uint64_t) { return done > 0 ? 1 : 0; };
      statuses[rank] = ExportSafetensors(ckpt, out, opts).status();
    });
    EXPECT_EQ(statuses[1].code(), StatusCode::kUser) << statuses[1].ToString();
    for (int rank : {0, 2}) {
      EXPECT_EQ(statuses[rank].code(), StatusCode::kPeer) << statuses[rank].ToString();
      EXPECT_NE(statuses[rank].message().find("rank 1"), std::string::npos) << statuses[rank].ToString();
    }
    for (const std::string& name : ListDir(out)) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
  }
  EXPECT_TRUE(ListDir(fresh).empty());
  EXPECT_EQ(ListDir(previous), before);
  EXPECT_EQ(ReadExport(previous), want);

  // A later export into the same directory replaces the index: it lists only the new files.
  SafetensorsExportOptions again;
  again.max_shard_bytes = 7000;
  auto r = ExportSafetensors(ckpt, previous, again);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ReadExport(previous), want);
  Json index;
  ASSERT_TRUE(JsonParser(ReadFileToString(previous + "/model.safetensors.index.json")).Parse(&index));
  std::set<std::string> listed;
  for (const auto& [name, file] : index["weight_map"].members) listed.insert(file.str);
  EXPECT_EQ(listed, std::set<std::string>(r->files.begin(), r->files.end()));
}

TEST(SafetensorsExportTest, JsonQuoteEscapes) {
  EXPECT_EQ(internal_safetensors::JsonQuote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
  EXPECT_EQ(internal_safetensors::JsonQuote("\xc3\xa9"), "\"\xc3\xa9\"");
}

}  // namespace
}  // namespace distckpt
