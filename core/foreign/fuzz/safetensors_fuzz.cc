// libFuzzer target for the core's safetensors header parser (ParseSafetensorsHeader, and the JSON reader under it).
// The input is a whole safetensors file: 8-byte little-endian header length, header, data. Built and run by
// scripts/fuzz.sh (clang-14, ASan + UBSan) as target `safetensors_header`; tests/fuzz:safetensors_header_regressions
// replays the committed inputs. Properties: the parser never crashes, hangs or reads out of bounds; whatever it
// accepts has tensors whose byte ranges tile the data exactly, inside the file, each as long as its shape needs.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/base/box.h"
#include "core/foreign/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  uint64_t n = 0;
  if (size >= 8) {
    for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  }
  std::string_view json;
  if (size >= 8 && n <= size - 8) json = file.substr(8, n);
  auto h = distckpt::ParseSafetensorsHeader(json, n, size, "fuzz.safetensors");
  if (!h.ok()) {
    if (h.status().message().find("fuzz.safetensors") == std::string::npos) std::abort();  // errors name the file
    return 0;
  }
  uint64_t at = 0;
  for (const auto& t : h->tensors) {
    if (t.begin != at || t.end < t.begin) std::abort();
    auto bytes = distckpt::CheckedVolume(distckpt::Span<const uint64_t>(t.shape.data(), t.shape.size()),
                                         distckpt::DTypeSize(t.dtype));
    if (!bytes.ok() || *bytes != t.end - t.begin || t.shape.size() > distckpt::kMaxDims) std::abort();
    at = t.end;
  }
  if (h->data_start + at != size) std::abort();
  return 0;
}
