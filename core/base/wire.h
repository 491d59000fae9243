// Compact little-endian binary encoding for messages between ranks (plans, checksum reports, statuses).
// Decoding is bounds-checked: hostile or truncated input yields an error, never a crash or a huge allocation.
#ifndef DISTCKPT_CORE_BASE_WIRE_H_
#define DISTCKPT_CORE_BASE_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/base/status.h"

namespace distckpt {

class WireWriter {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  /// LEB128 varint: small numbers (ranks, indices, dims) take one byte.
  void Var(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void Str(std::string_view s) {
    Var(s.size());
    out_.append(s.data(), s.size());
  }
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void Reserve(size_t n) { out_.reserve(n); }
  std::string& str() { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

/// Every getter returns false once the input is exhausted or malformed; check ok() (or each return) and report.
class WireReader {
 public:
  explicit WireReader(std::string_view in) : in_(in) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool Var(uint64_t* v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= in_.size()) return Fail();
      uint8_t b = static_cast<uint8_t>(in_[pos_++]);
      r |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) {
        *v = r;
        return true;
      }
    }
    return Fail();
  }
  /// A count of items that each take at least `min_item_bytes` bytes: rejects counts the remaining input cannot hold,
  /// so a hostile count cannot trigger a huge reserve().
  bool Count(uint64_t* n, size_t min_item_bytes = 1) {
    if (!Var(n)) return false;
    if (min_item_bytes && *n > remaining() / min_item_bytes) return Fail();
    return true;
  }
  bool Str(std::string* s) {
    uint64_t n;
    if (!Count(&n)) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Raw(void* p, size_t n) {
    if (n > remaining()) return Fail();
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }
  bool ok() const { return ok_; }
  bool done() const { return ok_ && pos_ == in_.size(); }

 private:
  bool Fail() {
    ok_ = false;
    pos_ = in_.size();
    return false;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

/// Status on the wire: code (varint of -code) + message.
inline void PutStatus(WireWriter* w, const Status& s) {
  w->Var(static_cast<uint64_t>(-static_cast<int64_t>(s.code())));
  w->Str(s.message());
}
inline bool GetStatus(WireReader* r, Status* s) {
  uint64_t code;
  std::string msg;
  if (!r->Var(&code) || !r->Str(&msg) || code > 1000) return false;
  *s = code == 0 ? Status() : Status(static_cast<StatusCode>(-static_cast<int64_t>(code)), std::move(msg));
  return true;
}

}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_WIRE_H_
