// The restricted pickle decoder. Written from the pickle protocol's documentation (the pickletools module's opcode
// descriptions, PEP 307, PEP 3154, PEP 574); where the documentation leaves a corner open (the marks and the frames),
// it follows what CPython's C unpickler accepts, or is stricter.
#include "core/foreign/pickle.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/base/utf8.h"

namespace distckpt {
namespace internal_pickle {

constexpr uint32_t kNoNode = std::numeric_limits<uint32_t>::max();

// 16 bytes per node; what `a` and `v` hold depends on the kind (see Graph).
struct Node {
  PickleKind kind = PickleKind::kNone;
  uint32_t a = 0;
  uint64_t v = 0;
};

struct GlobalRec {
  uint32_t module_off, module_len, name_off, name_len;
};

struct ObjectRec {
  uint32_t global = kNoNode;  // the kGlobal node it was made from
  uint32_t args = kNoNode;    // a tuple node
  uint32_t state = kNoNode;
  uint32_t list_items = kNoNode;  // a list node, made at the first APPEND(S)
  uint32_t dict_items = kNoNode;  // a dict node, made at the first SETITEM(S)
  bool newobj = false;
};

// Node meanings:
//   kBool, kInt: v = value (int64 bits); kFloat: v = double bits
//   kString, kBytes: a = offset in text, v = length
//   kTuple: a = first item in tuple_items, v = count (tuples never change, so their items lie in one array)
//   kList, kDict: a = index in containers (kNoNode while empty); a dict's container holds key, value, key, value...
//   kGlobal: a = index in globals; kObject: a = index in objects; kPersistentId: a = payload node
struct Graph {
  std::vector<Node> nodes;
  std::string text;
  std::vector<uint32_t> tuple_items;
  std::vector<std::vector<uint32_t>> containers;
  std::vector<GlobalRec> globals;
  std::vector<ObjectRec> objects;
  uint32_t root = kNoNode;

  std::string_view Text(uint32_t off, uint64_t len) const { return std::string_view(text).substr(off, len); }
};

// Singletons: None, True, False and the empty tuple are immutable, so one node each serves every use (Python shares
// them the same way).
constexpr uint32_t kNoneNode = 0, kTrueNode = 1, kFalseNode = 2, kEmptyTupleNode = 3;

}  // namespace internal_pickle

using internal_pickle::Graph;
using internal_pickle::kNoNode;
using internal_pickle::Node;
using internal_pickle::ObjectRec;

const char* PickleKindName(PickleKind kind) {
  switch (kind) {
    case PickleKind::kNone:
      return "None";
    case PickleKind::kBool:
      return "a bool";
    case PickleKind::kInt:
      return "an int";
    case PickleKind::kFloat:
      return "a float";
    case PickleKind::kString:
      return "a string";
    case PickleKind::kBytes:
      return "a bytes object";
    case PickleKind::kList:
      return "a list";
    case PickleKind::kTuple:
      return "a tuple";
    case PickleKind::kDict:
      return "a dict";
    case PickleKind::kGlobal:
      return "a global";
    case PickleKind::kObject:
      return "an object";
    case PickleKind::kPersistentId:
      return "a persistent id";
  }
  return "an unknown value";
}

// ---- PickleValue ----------------------------------------------------------------------------------------------------

namespace {

const Node& NodeOf(const Graph* g, uint32_t id) { return g->nodes[id]; }

const ObjectRec* ObjectOf(const Graph* g, uint32_t id) {
  const Node& n = NodeOf(g, id);
  return n.kind == PickleKind::kObject ? &g->objects[n.a] : nullptr;
}

const internal_pickle::GlobalRec* GlobalOf(const Graph* g, uint32_t id) {
  const Node& n = NodeOf(g, id);
  if (n.kind == PickleKind::kGlobal) return &g->globals[n.a];
  if (n.kind == PickleKind::kObject) return &g->globals[NodeOf(g, g->objects[n.a].global).a];
  return nullptr;
}

}  // namespace

PickleValue PickleValue::Node(uint32_t id) const { return id == kNoNode ? PickleValue() : PickleValue(g_, id); }

PickleKind PickleValue::kind() const { return valid() ? NodeOf(g_, id_).kind : PickleKind::kNone; }

bool PickleValue::bool_value() const { return is(PickleKind::kBool) && NodeOf(g_, id_).v != 0; }

int64_t PickleValue::int_value() const { return is(PickleKind::kInt) ? static_cast<int64_t>(NodeOf(g_, id_).v) : 0; }

double PickleValue::float_value() const {
  if (!is(PickleKind::kFloat)) return 0;
  double d;
  std::memcpy(&d, &NodeOf(g_, id_).v, 8);
  return d;
}

std::string_view PickleValue::str() const {
  if (!is(PickleKind::kString) && !is(PickleKind::kBytes)) return {};
  const internal_pickle::Node& n = NodeOf(g_, id_);
  return g_->Text(n.a, n.v);
}

size_t PickleValue::size() const {
  if (!valid()) return 0;
  const internal_pickle::Node& n = NodeOf(g_, id_);
  switch (n.kind) {
    case PickleKind::kTuple:
      return n.v;
    case PickleKind::kList:
      return n.a == kNoNode ? 0 : g_->containers[n.a].size();
    case PickleKind::kDict:
      return n.a == kNoNode ? 0 : g_->containers[n.a].size() / 2;
    default:
      return 0;
  }
}

PickleValue PickleValue::item(size_t i) const {
  if (i >= size()) return {};
  const internal_pickle::Node& n = NodeOf(g_, id_);
  if (n.kind == PickleKind::kTuple) return Node(g_->tuple_items[n.a + i]);
  if (n.kind == PickleKind::kList) return Node(g_->containers[n.a][i]);
  return {};
}

PickleValue PickleValue::key(size_t i) const {
  if (!is(PickleKind::kDict) || i >= size()) return {};
  return Node(g_->containers[NodeOf(g_, id_).a][2 * i]);
}

PickleValue PickleValue::value(size_t i) const {
  if (!is(PickleKind::kDict) || i >= size()) return {};
  return Node(g_->containers[NodeOf(g_, id_).a][2 * i + 1]);
}

std::string_view PickleValue::module() const {
  if (!valid()) return {};
  const internal_pickle::GlobalRec* r = GlobalOf(g_, id_);
  return r ? g_->Text(r->module_off, r->module_len) : std::string_view();
}

std::string_view PickleValue::name() const {
  if (!valid()) return {};
  const internal_pickle::GlobalRec* r = GlobalOf(g_, id_);
  return r ? g_->Text(r->name_off, r->name_len) : std::string_view();
}

std::string PickleValue::qualified_name() const { return std::string(module()) + "." + std::string(name()); }

PickleValue PickleValue::args() const {
  const ObjectRec* o = valid() ? ObjectOf(g_, id_) : nullptr;
  return o ? Node(o->args) : PickleValue();
}

bool PickleValue::newobj() const {
  const ObjectRec* o = valid() ? ObjectOf(g_, id_) : nullptr;
  return o != nullptr && o->newobj;
}

PickleValue PickleValue::state() const {
  const ObjectRec* o = valid() ? ObjectOf(g_, id_) : nullptr;
  return o ? Node(o->state) : PickleValue();
}

PickleValue PickleValue::list_items() const {
  const ObjectRec* o = valid() ? ObjectOf(g_, id_) : nullptr;
  return o ? Node(o->list_items) : PickleValue();
}

PickleValue PickleValue::dict_items() const {
  const ObjectRec* o = valid() ? ObjectOf(g_, id_) : nullptr;
  return o ? Node(o->dict_items) : PickleValue();
}

PickleValue PickleValue::persistent_id() const {
  if (!is(PickleKind::kPersistentId)) return {};
  return Node(NodeOf(g_, id_).a);
}

namespace {

// Strings must be strict UTF-8 (IsValidUtf8: no overlong forms, no surrogates, nothing above U+10FFFF). CPython's
// unpickler lets encoded surrogates through; nothing torch writes has them, and names with them could not be stored in
// distckpt's format.

// The length of the valid UTF-8 character at the start of `s`, or 0.
size_t Utf8CharLength(std::string_view s) {
  if (s.empty()) return 0;
  const auto c = static_cast<unsigned char>(s[0]);
  const size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
  return len != 0 && len <= s.size() && IsValidUtf8(s.substr(0, len)) ? len : 0;
}

// Appends `s` quoted for a message: printable ASCII and (unless ascii_only) valid UTF-8 characters as they are,
// everything else as \xNN, and at most about max_chars characters of output (then "..."), never cutting a character.
// So a message is always valid UTF-8, of bounded size, whatever the pickle held.
void AppendQuoted(std::string* out, std::string_view s, char quote, size_t max_chars, bool ascii_only) {
  static const char kHex[] = "0123456789abcdef";
  out->push_back(quote);
  const size_t start = out->size();
  for (size_t i = 0; i < s.size();) {
    if (out->size() - start >= max_chars) {
      out->append("...");
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c >= 0x80 && !ascii_only ? Utf8CharLength(s.substr(i)) : 1;
    if (c == '\\' || c == static_cast<unsigned char>(quote)) {
      out->push_back('\\');
      out->push_back(s[i]);
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && len == 0) || (c >= 0x80 && ascii_only)) {
      out->append("\\x");
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 15]);
    } else {
      out->append(s.data() + i, len);
      i += len;
      continue;
    }
    ++i;
  }
  out->push_back(quote);
}

void Render(const PickleValue& v, int depth, size_t* budget, std::string* out) {
  if (*budget == 0 || depth > 16) {
    out->append("...");
    return;
  }
  --*budget;
  if (!v.valid()) {
    out->append("<absent>");
    return;
  }
  auto seq = [&](const PickleValue& s, const char* open, const char* close) {
    out->append(open);
    for (size_t i = 0; i < s.size(); ++i) {
      if (i) out->append(", ");
      if (*budget == 0) {
        out->append("...");
        break;
      }
      Render(s.item(i), depth + 1, budget, out);
    }
    if (s.is(PickleKind::kTuple) && s.size() == 1) out->append(",");
    out->append(close);
  };
  switch (v.kind()) {
    case PickleKind::kNone:
      out->append("None");
      return;
    case PickleKind::kBool:
      out->append(v.bool_value() ? "True" : "False");
      return;
    case PickleKind::kInt:
      out->append(std::to_string(v.int_value()));
      return;
    case PickleKind::kFloat: {
      char buf[40];
      std::snprintf(buf, sizeof(buf), "%.17g", v.float_value());
      out->append(buf);
      return;
    }
    case PickleKind::kString:
      AppendQuoted(out, v.str(), '\'', 200, /*ascii_only=*/false);
      return;
    case PickleKind::kBytes:
      out->append("b");
      AppendQuoted(out, v.str(), '\'', 200, /*ascii_only=*/true);
      return;
    case PickleKind::kList:
      seq(v, "[", "]");
      return;
    case PickleKind::kTuple:
      seq(v, "(", ")");
      return;
    case PickleKind::kDict:
      out->append("{");
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out->append(", ");
        if (*budget == 0) {
          out->append("...");
          break;
        }
        Render(v.key(i), depth + 1, budget, out);
        out->append(": ");
        Render(v.value(i), depth + 1, budget, out);
      }
      out->append("}");
      return;
    case PickleKind::kGlobal:
      out->append(v.qualified_name());
      return;
    case PickleKind::kObject:
      out->append(v.qualified_name());
      Render(v.args(), depth + 1, budget, out);
      if (v.state().valid()) {
        out->append(".__setstate__(");
        Render(v.state(), depth + 1, budget, out);
        out->append(")");
      }
      if (v.list_items().valid()) {
        out->append(".extend(");
        Render(v.list_items(), depth + 1, budget, out);
        out->append(")");
      }
      if (v.dict_items().valid()) {
        out->append(".update(");
        Render(v.dict_items(), depth + 1, budget, out);
        out->append(")");
      }
      return;
    case PickleKind::kPersistentId:
      out->append("persistent_id(");
      Render(v.persistent_id(), depth + 1, budget, out);
      out->append(")");
      return;
  }
}

}  // namespace

std::string PickleValue::DebugString(size_t max_nodes) const {
  std::string out;
  size_t budget = max_nodes == 0 ? 1 : max_nodes;
  Render(*this, 0, &budget, &out);
  return out;
}

// ---- DecodedPickle --------------------------------------------------------------------------------------------------

DecodedPickle::DecodedPickle() = default;
DecodedPickle::~DecodedPickle() = default;
DecodedPickle::DecodedPickle(DecodedPickle&&) noexcept = default;
DecodedPickle& DecodedPickle::operator=(DecodedPickle&&) noexcept = default;

PickleValue DecodedPickle::root() const {
  return g_ && g_->root != kNoNode ? PickleValue(g_.get(), g_->root) : PickleValue();
}

size_t DecodedPickle::num_nodes() const { return g_ ? g_->nodes.size() : 0; }

// ---- The decoder ----------------------------------------------------------------------------------------------------

namespace {

// Names of every opcode of protocols 0 to 5, for messages (pickletools' names).
const char* OpcodeName(uint8_t op) {
  switch (op) {
    case '(':
      return "MARK";
    case '.':
      return "STOP";
    case '0':
      return "POP";
    case '1':
      return "POP_MARK";
    case '2':
      return "DUP";
    case 'F':
      return "FLOAT";
    case 'I':
      return "INT";
    case 'J':
      return "BININT";
    case 'K':
      return "BININT1";
    case 'L':
      return "LONG";
    case 'M':
      return "BININT2";
    case 'N':
      return "NONE";
    case 'P':
      return "PERSID";
    case 'Q':
      return "BINPERSID";
    case 'R':
      return "REDUCE";
    case 'S':
      return "STRING";
    case 'T':
      return "BINSTRING";
    case 'U':
      return "SHORT_BINSTRING";
    case 'V':
      return "UNICODE";
    case 'X':
      return "BINUNICODE";
    case 'a':
      return "APPEND";
    case 'b':
      return "BUILD";
    case 'c':
      return "GLOBAL";
    case 'd':
      return "DICT";
    case '}':
      return "EMPTY_DICT";
    case 'e':
      return "APPENDS";
    case 'g':
      return "GET";
    case 'h':
      return "BINGET";
    case 'i':
      return "INST";
    case 'j':
      return "LONG_BINGET";
    case 'l':
      return "LIST";
    case ']':
      return "EMPTY_LIST";
    case 'o':
      return "OBJ";
    case 'p':
      return "PUT";
    case 'q':
      return "BINPUT";
    case 'r':
      return "LONG_BINPUT";
    case 's':
      return "SETITEM";
    case 't':
      return "TUPLE";
    case ')':
      return "EMPTY_TUPLE";
    case 'u':
      return "SETITEMS";
    case 'G':
      return "BINFLOAT";
    case 0x80:
      return "PROTO";
    case 0x81:
      return "NEWOBJ";
    case 0x82:
      return "EXT1";
    case 0x83:
      return "EXT2";
    case 0x84:
      return "EXT4";
    case 0x85:
      return "TUPLE1";
    case 0x86:
      return "TUPLE2";
    case 0x87:
      return "TUPLE3";
    case 0x88:
      return "NEWTRUE";
    case 0x89:
      return "NEWFALSE";
    case 0x8a:
      return "LONG1";
    case 0x8b:
      return "LONG4";
    case 'B':
      return "BINBYTES";
    case 'C':
      return "SHORT_BINBYTES";
    case 0x8c:
      return "SHORT_BINUNICODE";
    case 0x8d:
      return "BINUNICODE8";
    case 0x8e:
      return "BINBYTES8";
    case 0x8f:
      return "EMPTY_SET";
    case 0x90:
      return "ADDITEMS";
    case 0x91:
      return "FROZENSET";
    case 0x92:
      return "NEWOBJ_EX";
    case 0x93:
      return "STACK_GLOBAL";
    case 0x94:
      return "MEMOIZE";
    case 0x95:
      return "FRAME";
    case 0x96:
      return "BYTEARRAY8";
    case 0x97:
      return "NEXT_BUFFER";
    case 0x98:
      return "READONLY_BUFFER";
    default:
      return nullptr;
  }
}

}  // namespace

std::string QuoteForMessage(std::string_view s, size_t max_chars) {
  std::string out;
  AppendQuoted(&out, s, '\'', max_chars, /*ascii_only=*/false);
  return out;
}

namespace {

uint64_t LoadLE(const char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

class Decoder {
 public:
  Decoder(std::string_view data, const PickleOptions& options) : data_(data), options_(options) {}

  Result<std::unique_ptr<Graph>> Run() {
    if (data_.size() > options_.max_input_bytes) {
      return Corrupt(Prefix() + "a pickle of " + std::to_string(data_.size()) + " bytes is larger than the limit of " +
                     std::to_string(options_.max_input_bytes) + " bytes");
    }
    if (data_.size() >= kNoNode) return Corrupt(Prefix() + "the pickle is too large to decode");
    g_ = std::make_unique<Graph>();
    g_->nodes.reserve(std::min<size_t>(data_.size() / 3 + 8, size_t{1} << 20));
    // Singletons first (see kNoneNode...).
    g_->nodes.push_back(Node{PickleKind::kNone, 0, 0});
    g_->nodes.push_back(Node{PickleKind::kBool, 0, 1});
    g_->nodes.push_back(Node{PickleKind::kBool, 0, 0});
    g_->nodes.push_back(Node{PickleKind::kTuple, 0, 0});
    while (true) {
      if (pos_ >= data_.size())
        return Corrupt(Prefix() + "the pickle ends at byte " + std::to_string(pos_) +
                       " before its STOP opcode (truncated)");
      op_pos_ = pos_;
      op_ = static_cast<uint8_t>(data_[pos_]);
      if (frame_end_ != 0 && pos_ == frame_end_) frame_end_ = 0;  // left the frame
      limit_ = frame_end_ != 0 ? frame_end_ : data_.size();
      ++pos_;
      bool stop = false;
      Status s = Step(&stop);
      if (!s.ok()) return s;
      if (stop) break;
    }
    return std::move(g_);
  }

 private:
  // ---- Errors
  std::string Prefix() const { return options_.context.empty() ? std::string() : options_.context + ": "; }
  Status Bad(const std::string& what) const {
    const char* name = OpcodeName(op_);
    return Corrupt(Prefix() + "pickle opcode " + (name ? name : "?") + " at byte " + std::to_string(op_pos_) + ": " +
                   what);
  }
  Status Underflow() const { return Bad("the stack (above the last MARK) is empty"); }

  // ---- Reading arguments: never past the input, nor past the end of the current frame.
  Status Need(uint64_t n) const {
    if (n > limit_ - pos_) {
      return Bad(frame_end_ != 0 && limit_ < data_.size()
                     ? "its argument of " + std::to_string(n) + " bytes crosses the end of its frame at byte " +
                           std::to_string(limit_)
                     : "its argument of " + std::to_string(n) + " bytes runs past the end of the pickle at byte " +
                           std::to_string(data_.size()) + " (truncated)");
    }
    return OkStatus();
  }
  Result<uint64_t> ReadLE(size_t n) {
    DCKPT_RETURN_IF_ERROR(Need(n));
    const uint64_t v = LoadLE(data_.data() + pos_, n);
    pos_ += n;
    return v;
  }
  Result<std::string_view> ReadBytes(uint64_t n) {
    DCKPT_RETURN_IF_ERROR(Need(n));
    std::string_view v = data_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  // A protocol-0 text argument: the bytes up to '\n' (not included).
  Result<std::string_view> ReadLine() {
    const size_t nl = data_.substr(0, limit_).find('\n', pos_);
    if (nl == std::string_view::npos) return Bad("its text argument has no end of line (truncated)");
    std::string_view v = data_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    return v;
  }

  // ---- Nodes
  Result<uint32_t> NewNode(PickleKind kind, uint32_t a, uint64_t v) {
    // Each opcode makes at most one node, so this cannot trigger; it backs the documented bound.
    if (g_->nodes.size() > data_.size() + 8) return Bad("too many values for the size of the pickle");
    g_->nodes.push_back(Node{kind, a, v});
    return static_cast<uint32_t>(g_->nodes.size() - 1);
  }
  Result<uint32_t> NewText(PickleKind kind, std::string_view s) {
    const uint32_t off = static_cast<uint32_t>(g_->text.size());
    g_->text.append(s.data(), s.size());
    return NewNode(kind, off, s.size());
  }

  // ---- The stack. The fence is the position of the innermost MARK: nothing below it may be popped except by the
  // opcodes that consume the mark.
  size_t Fence() const { return marks_.empty() ? 0 : marks_.back(); }
  Result<uint32_t> Pop() {
    if (stack_.size() <= Fence()) return Underflow();
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Result<uint32_t> Top() const {
    if (stack_.size() <= Fence()) return Underflow();
    return stack_.back();
  }
  void Push(uint32_t id) { stack_.push_back(id); }
  Result<size_t> PopMark() {
    if (marks_.empty()) return Bad("there is no MARK to match");
    const size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  PickleKind KindOf(uint32_t id) const { return g_->nodes[id].kind; }

  Result<uint32_t> MakeTuple(size_t from) {
    const size_t n = stack_.size() - from;
    if (n == 0) return internal_pickle::kEmptyTupleNode;
    const uint32_t start = static_cast<uint32_t>(g_->tuple_items.size());
    g_->tuple_items.insert(g_->tuple_items.end(), stack_.begin() + from, stack_.end());
    stack_.resize(from);
    return NewNode(PickleKind::kTuple, start, n);
  }

  std::vector<uint32_t>& Container(uint32_t id) {
    Node& n = g_->nodes[id];
    if (n.a == kNoNode) {
      n.a = static_cast<uint32_t>(g_->containers.size());
      g_->containers.emplace_back();
    }
    return g_->containers[n.a];
  }

  // The list APPEND(S) extends: a list, or an object (its list_items).
  Result<uint32_t> ListTarget(uint32_t target) {
    if (KindOf(target) == PickleKind::kList) return target;
    if (KindOf(target) == PickleKind::kObject) {
      ObjectRec& o = g_->objects[g_->nodes[target].a];
      if (o.list_items == kNoNode) {
        DCKPT_ASSIGN_OR_RETURN(uint32_t l, NewNode(PickleKind::kList, kNoNode, 0));
        g_->objects[g_->nodes[target].a].list_items = l;
        return l;
      }
      return o.list_items;
    }
    return Bad(std::string("it appends to ") + PickleKindName(KindOf(target)) + ", not a list");
  }
  Result<uint32_t> DictTarget(uint32_t target) {
    if (KindOf(target) == PickleKind::kDict) return target;
    if (KindOf(target) == PickleKind::kObject) {
      ObjectRec& o = g_->objects[g_->nodes[target].a];
      if (o.dict_items == kNoNode) {
        DCKPT_ASSIGN_OR_RETURN(uint32_t d, NewNode(PickleKind::kDict, kNoNode, 0));
        g_->objects[g_->nodes[target].a].dict_items = d;
        return d;
      }
      return o.dict_items;
    }
    return Bad(std::string("it sets items of ") + PickleKindName(KindOf(target)) + ", not a dict");
  }

  // ---- Memo
  Status MemoPut(uint64_t index) {
    // Real pickles number memo entries 0, 1, 2...; an index beyond the input's size would only make the table huge.
    if (index >= data_.size()) {
      return Bad("memo index " + std::to_string(index) + " is out of range for a pickle of " +
                 std::to_string(data_.size()) + " bytes");
    }
    DCKPT_ASSIGN_OR_RETURN(uint32_t top, Top());
    if (index >= memo_.size()) memo_.resize(index + 1, kNoNode);
    if (memo_[index] == kNoNode) ++memo_count_;
    memo_[index] = top;
    return OkStatus();
  }
  Status MemoGet(uint64_t index) {
    if (index >= memo_.size() || memo_[index] == kNoNode) {
      return Bad("memo index " + std::to_string(index) + " was never stored (PUT)");
    }
    Push(memo_[index]);
    return OkStatus();
  }
  Result<uint64_t> ParseDecimal(std::string_view s) {
    if (s.empty() || s.size() > 18) return Bad("its decimal argument " + QuoteForMessage(s, 20) + " is invalid");
    uint64_t v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return Bad("its decimal argument is not a number");
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    return v;
  }

  // ---- Globals
  Status PushGlobal(std::string_view module, std::string_view name) {
    if (!IsValidUtf8(module) || !IsValidUtf8(name)) return Bad("the module or name of a global is not valid UTF-8");
    // A linear scan: pickles name few globals (the memo repeats them), and lists are short.
    bool allowed = false;
    for (const PickleGlobal& g : options_.allowed_globals) {
      if (g.name == name && g.module == module) {
        allowed = true;
        break;
      }
    }
    if (!allowed) {
      std::string shown(module);
      shown.append(".").append(name);
      return Corrupt(Prefix() + "the pickle refers to " + QuoteForMessage(shown) + " (opcode " + OpcodeName(op_) +
                     " at byte " + std::to_string(op_pos_) +
                     "), which this file never holds; refused without running anything (a pickle can run code, and "
                     "this one may be hostile)");
    }
    internal_pickle::GlobalRec r;
    r.module_off = static_cast<uint32_t>(g_->text.size());
    r.module_len = static_cast<uint32_t>(module.size());
    g_->text.append(module.data(), module.size());
    r.name_off = static_cast<uint32_t>(g_->text.size());
    r.name_len = static_cast<uint32_t>(name.size());
    g_->text.append(name.data(), name.size());
    DCKPT_ASSIGN_OR_RETURN(uint32_t id, NewNode(PickleKind::kGlobal, static_cast<uint32_t>(g_->globals.size()), 0));
    g_->globals.push_back(r);
    Push(id);
    return OkStatus();
  }

  Status MakeObject(uint32_t callable, uint32_t args, bool newobj) {
    if (KindOf(callable) != PickleKind::kGlobal) {
      return Bad(std::string("it calls ") + PickleKindName(KindOf(callable)) +
                 ", not a class or function named by a global");
    }
    if (KindOf(args) != PickleKind::kTuple) {
      return Bad(std::string("its arguments are ") + PickleKindName(KindOf(args)) + ", not a tuple");
    }
    ObjectRec o;
    o.global = callable;
    o.args = args;
    o.newobj = newobj;
    DCKPT_ASSIGN_OR_RETURN(uint32_t id, NewNode(PickleKind::kObject, static_cast<uint32_t>(g_->objects.size()), 0));
    g_->objects.push_back(o);
    Push(id);
    return OkStatus();
  }

  Status PushString(std::string_view s) {
    if (!IsValidUtf8(s)) return Bad("the string is not valid UTF-8");
    DCKPT_ASSIGN_OR_RETURN(uint32_t id, NewText(PickleKind::kString, s));
    Push(id);
    return OkStatus();
  }
  Status PushBytes(std::string_view s) {
    DCKPT_ASSIGN_OR_RETURN(uint32_t id, NewText(PickleKind::kBytes, s));
    Push(id);
    return OkStatus();
  }
  Status PushInt(int64_t v) {
    DCKPT_ASSIGN_OR_RETURN(uint32_t id, NewNode(PickleKind::kInt, 0, static_cast<uint64_t>(v)));
    Push(id);
    return OkStatus();
  }
  // A little-endian two's complement integer of n bytes (LONG1, LONG4).
  Status PushLong(uint64_t n) {
    if (n > 8) {
      DCKPT_RETURN_IF_ERROR(Need(n));  // a truncated pickle says so first
      return Bad("an integer of " + std::to_string(n) + " bytes does not fit 64 bits");
    }
    DCKPT_ASSIGN_OR_RETURN(std::string_view b, ReadBytes(n));
    if (n == 0) return PushInt(0);
    uint64_t v = LoadLE(b.data(), n);
    if (n < 8 && (static_cast<unsigned char>(b[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return PushInt(static_cast<int64_t>(v));
  }

  Status Step(bool* stop);

  std::string_view data_;
  const PickleOptions& options_;
  std::unique_ptr<Graph> g_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::vector<uint32_t> memo_;
  size_t memo_count_ = 0;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t op_ = 0;
  size_t frame_end_ = 0;  // 0: not inside a frame
  size_t limit_ = 0;      // where the current opcode's arguments must end
};

Status Decoder::Step(bool* stop) {
  switch (op_) {
    case 0x80: {  // PROTO
      DCKPT_ASSIGN_OR_RETURN(uint64_t proto, ReadLE(1));
      if (proto > 5) return Unsupported(Prefix() + "pickle protocol " + std::to_string(proto) + " is not supported");
      return OkStatus();
    }
    case 0x95: {  // FRAME
      if (frame_end_ != 0) return Bad("a frame starts inside another frame");
      DCKPT_ASSIGN_OR_RETURN(uint64_t n, ReadLE(8));
      if (n > data_.size() - pos_) {
        return Bad("the frame of " + std::to_string(n) + " bytes runs past the end of the pickle (truncated)");
      }
      if (n > 0) frame_end_ = pos_ + n;
      return OkStatus();
    }
    case '.': {  // STOP
      DCKPT_ASSIGN_OR_RETURN(uint32_t v, Pop());
      if (!stack_.empty() || !marks_.empty()) {
        return Bad("the pickle leaves " + std::to_string(stack_.size()) + " values and " +
                   std::to_string(marks_.size()) + " marks behind");
      }
      if (pos_ != data_.size()) {
        return Bad(std::to_string(data_.size() - pos_) + " bytes follow the STOP opcode");
      }
      g_->root = v;
      *stop = true;
      return OkStatus();
    }
    case '(':  // MARK
      marks_.push_back(stack_.size());
      return OkStatus();
    case '0':  // POP: the top value, or a MARK with nothing above it (as CPython does)
      if (!marks_.empty() && marks_.back() == stack_.size()) {
        marks_.pop_back();
        return OkStatus();
      }
      return Pop().status();
    case '1': {  // POP_MARK
      DCKPT_ASSIGN_OR_RETURN(size_t m, PopMark());
      stack_.resize(m);
      return OkStatus();
    }
    case '2': {  // DUP
      DCKPT_ASSIGN_OR_RETURN(uint32_t v, Top());
      Push(v);
      return OkStatus();
    }
    case 'N':
      Push(internal_pickle::kNoneNode);
      return OkStatus();
    case 0x88:
      Push(internal_pickle::kTrueNode);
      return OkStatus();
    case 0x89:
      Push(internal_pickle::kFalseNode);
      return OkStatus();
    case 'J': {  // BININT: 4-byte signed
      DCKPT_ASSIGN_OR_RETURN(uint64_t v, ReadLE(4));
      return PushInt(static_cast<int32_t>(static_cast<uint32_t>(v)));
    }
    case 'K': {  // BININT1
      DCKPT_ASSIGN_OR_RETURN(uint64_t v, ReadLE(1));
      return PushInt(static_cast<int64_t>(v));
    }
    case 'M': {  // BININT2
      DCKPT_ASSIGN_OR_RETURN(uint64_t v, ReadLE(2));
      return PushInt(static_cast<int64_t>(v));
    }
    case 0x8a: {  // LONG1
      DCKPT_ASSIGN_OR_RETURN(uint64_t n, ReadLE(1));
      return PushLong(n);
    }
    case 0x8b: {  // LONG4: a signed 4-byte count
      DCKPT_ASSIGN_OR_RETURN(uint64_t n, ReadLE(4));
      if (n & 0x80000000u) return Bad("its byte count is negative");
      return PushLong(n);
    }
    case 'G': {  // BINFLOAT: big-endian IEEE 754 double
      DCKPT_ASSIGN_OR_RETURN(std::string_view b, ReadBytes(8));
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(b[i]);
      DCKPT_ASSIGN_OR_RETURN(uint32_t id, NewNode(PickleKind::kFloat, 0, bits));
      Push(id);
      return OkStatus();
    }
    case 0x8c:    // SHORT_BINUNICODE
    case 'X':     // BINUNICODE
    case 0x8d: {  // BINUNICODE8
      DCKPT_ASSIGN_OR_RETURN(uint64_t n, ReadLE(op_ == 0x8c ? 1 : op_ == 'X' ? 4 : 8));
      DCKPT_ASSIGN_OR_RETURN(std::string_view s, ReadBytes(n));
      return PushString(s);
    }
    case 'U':    // SHORT_BINSTRING
    case 'T': {  // BINSTRING: protocol 1 str, decoded as ASCII (the unpickler's default encoding)
      DCKPT_ASSIGN_OR_RETURN(uint64_t n, ReadLE(op_ == 'U' ? 1 : 4));
      if (op_ == 'T' && (n & 0x80000000u)) return Bad("its length is negative");
      DCKPT_ASSIGN_OR_RETURN(std::string_view s, ReadBytes(n));
      for (char c : s) {
        if (static_cast<unsigned char>(c) >= 0x80) return Bad("the 8-bit string is not ASCII");
      }
      return PushString(s);
    }
    case 'C':     // SHORT_BINBYTES
    case 'B':     // BINBYTES
    case 0x8e:    // BINBYTES8
    case 0x96: {  // BYTEARRAY8
      DCKPT_ASSIGN_OR_RETURN(uint64_t n, ReadLE(op_ == 'C' ? 1 : op_ == 'B' ? 4 : 8));
      DCKPT_ASSIGN_OR_RETURN(std::string_view s, ReadBytes(n));
      return PushBytes(s);
    }
    case ')':
      Push(internal_pickle::kEmptyTupleNode);
      return OkStatus();
    case 't': {  // TUPLE
      DCKPT_ASSIGN_OR_RETURN(size_t m, PopMark());
      DCKPT_ASSIGN_OR_RETURN(uint32_t t, MakeTuple(m));
      Push(t);
      return OkStatus();
    }
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
      const size_t n = op_ - 0x84u;
      if (stack_.size() < Fence() + n) return Underflow();
      DCKPT_ASSIGN_OR_RETURN(uint32_t t, MakeTuple(stack_.size() - n));
      Push(t);
      return OkStatus();
    }
    case ']': {  // EMPTY_LIST
      DCKPT_ASSIGN_OR_RETURN(uint32_t id, NewNode(PickleKind::kList, kNoNode, 0));
      Push(id);
      return OkStatus();
    }
    case '}': {  // EMPTY_DICT
      DCKPT_ASSIGN_OR_RETURN(uint32_t id, NewNode(PickleKind::kDict, kNoNode, 0));
      Push(id);
      return OkStatus();
    }
    case 'l':    // LIST
    case 'd': {  // DICT
      DCKPT_ASSIGN_OR_RETURN(size_t m, PopMark());
      const bool dict = op_ == 'd';
      if (dict && (stack_.size() - m) % 2 != 0) return Bad("it has a key without a value");
      DCKPT_ASSIGN_OR_RETURN(uint32_t id, NewNode(dict ? PickleKind::kDict : PickleKind::kList, kNoNode, 0));
      if (stack_.size() > m) Container(id).assign(stack_.begin() + m, stack_.end());
      stack_.resize(m);
      Push(id);
      return OkStatus();
    }
    case 'a': {  // APPEND
      DCKPT_ASSIGN_OR_RETURN(uint32_t v, Pop());
      DCKPT_ASSIGN_OR_RETURN(uint32_t target, Top());
      DCKPT_ASSIGN_OR_RETURN(uint32_t list, ListTarget(target));
      Container(list).push_back(v);
      return OkStatus();
    }
    case 'e': {  // APPENDS
      DCKPT_ASSIGN_OR_RETURN(size_t m, PopMark());
      if (m == 0 || m <= Fence()) return Bad("there is no list below its MARK");
      DCKPT_ASSIGN_OR_RETURN(uint32_t list, ListTarget(stack_[m - 1]));
      if (stack_.size() > m) {
        std::vector<uint32_t>& c = Container(list);
        c.insert(c.end(), stack_.begin() + m, stack_.end());
      }
      stack_.resize(m);
      return OkStatus();
    }
    case 's': {  // SETITEM
      DCKPT_ASSIGN_OR_RETURN(uint32_t v, Pop());
      DCKPT_ASSIGN_OR_RETURN(uint32_t k, Pop());
      DCKPT_ASSIGN_OR_RETURN(uint32_t target, Top());
      DCKPT_ASSIGN_OR_RETURN(uint32_t dict, DictTarget(target));
      std::vector<uint32_t>& c = Container(dict);
      c.push_back(k);
      c.push_back(v);
      return OkStatus();
    }
    case 'u': {  // SETITEMS
      DCKPT_ASSIGN_OR_RETURN(size_t m, PopMark());
      if (m == 0 || m <= Fence()) return Bad("there is no dict below its MARK");
      if ((stack_.size() - m) % 2 != 0) return Bad("it has a key without a value");
      DCKPT_ASSIGN_OR_RETURN(uint32_t dict, DictTarget(stack_[m - 1]));
      if (stack_.size() > m) {
        std::vector<uint32_t>& c = Container(dict);
        c.insert(c.end(), stack_.begin() + m, stack_.end());
      }
      stack_.resize(m);
      return OkStatus();
    }
    case 'g': {  // GET
      DCKPT_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
      DCKPT_ASSIGN_OR_RETURN(uint64_t i, ParseDecimal(line));
      return MemoGet(i);
    }
    case 'h':
    case 'j': {  // BINGET, LONG_BINGET
      DCKPT_ASSIGN_OR_RETURN(uint64_t i, ReadLE(op_ == 'h' ? 1 : 4));
      return MemoGet(i);
    }
    case 'p': {  // PUT
      DCKPT_ASSIGN_OR_RETURN(std::string_view line, ReadLine());
      DCKPT_ASSIGN_OR_RETURN(uint64_t i, ParseDecimal(line));
      return MemoPut(i);
    }
    case 'q':
    case 'r': {  // BINPUT, LONG_BINPUT
      DCKPT_ASSIGN_OR_RETURN(uint64_t i, ReadLE(op_ == 'q' ? 1 : 4));
      return MemoPut(i);
    }
    case 0x94:  // MEMOIZE: the next index is the number of entries so far (CPython's rule)
      return MemoPut(memo_count_);
    case 'c': {  // GLOBAL
      DCKPT_ASSIGN_OR_RETURN(std::string_view module, ReadLine());
      DCKPT_ASSIGN_OR_RETURN(std::string_view name, ReadLine());
      return PushGlobal(module, name);
    }
    case 0x93: {  // STACK_GLOBAL
      DCKPT_ASSIGN_OR_RETURN(uint32_t name, Pop());
      DCKPT_ASSIGN_OR_RETURN(uint32_t module, Pop());
      if (KindOf(name) != PickleKind::kString || KindOf(module) != PickleKind::kString) {
        return Bad("its module and name are not strings");
      }
      const Node& mn = g_->nodes[module];
      const Node& nn = g_->nodes[name];
      const std::string m(g_->Text(mn.a, mn.v)), n(g_->Text(nn.a, nn.v));  // copies: PushGlobal appends to text
      return PushGlobal(m, n);
    }
    case 'R': {  // REDUCE
      DCKPT_ASSIGN_OR_RETURN(uint32_t args, Pop());
      DCKPT_ASSIGN_OR_RETURN(uint32_t callable, Pop());
      return MakeObject(callable, args, false);
    }
    case 0x81: {  // NEWOBJ
      DCKPT_ASSIGN_OR_RETURN(uint32_t args, Pop());
      DCKPT_ASSIGN_OR_RETURN(uint32_t cls, Pop());
      return MakeObject(cls, args, true);
    }
    case 0x92: {  // NEWOBJ_EX
      DCKPT_ASSIGN_OR_RETURN(uint32_t kwargs, Pop());
      DCKPT_ASSIGN_OR_RETURN(uint32_t args, Pop());
      DCKPT_ASSIGN_OR_RETURN(uint32_t cls, Pop());
      if (KindOf(kwargs) != PickleKind::kDict || g_->nodes[kwargs].a != kNoNode) {
        return Bad("keyword arguments to a constructor are not supported");
      }
      return MakeObject(cls, args, true);
    }
    case 'b': {  // BUILD
      DCKPT_ASSIGN_OR_RETURN(uint32_t state, Pop());
      DCKPT_ASSIGN_OR_RETURN(uint32_t target, Top());
      if (KindOf(target) != PickleKind::kObject) {
        return Bad(std::string("it sets the state of ") + PickleKindName(KindOf(target)) + ", not of an object");
      }
      ObjectRec& o = g_->objects[g_->nodes[target].a];
      if (o.state != kNoNode) return Bad("it sets the state of an object a second time");
      o.state = state;
      return OkStatus();
    }
    case 'Q': {  // BINPERSID
      if (!options_.allow_persistent_ids) return Bad("persistent ids are not allowed in this file");
      DCKPT_ASSIGN_OR_RETURN(uint32_t pid, Pop());
      DCKPT_ASSIGN_OR_RETURN(uint32_t id, NewNode(PickleKind::kPersistentId, pid, 0));
      Push(id);
      return OkStatus();
    }
    default: {
      const char* name = OpcodeName(op_);
      if (name != nullptr) return Bad("this opcode is not supported (torch never writes it here)");
      static const char kHex[] = "0123456789abcdef";
      const std::string byte = std::string("0x") + kHex[op_ >> 4] + kHex[op_ & 15];
      return Corrupt(Prefix() + "unknown pickle opcode " + byte + " at byte " + std::to_string(op_pos_));
    }
  }
}

}  // namespace

Result<DecodedPickle> DecodePickle(std::string_view data, const PickleOptions& options) {
  Decoder d(data, options);
  DCKPT_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, d.Run());
  DecodedPickle out;
  out.g_ = std::move(g);
  return out;
}

}  // namespace distckpt
