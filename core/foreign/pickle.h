// A restricted decoder of Python pickles (protocols 2 to 5) that executes nothing: it interprets the opcodes into a
// graph of plain values, and a global is a name, never a callable. Used to read the pickles that torch writes
// (torch.distributed.checkpoint's .metadata, the data.pkl inside a torch.save archive) without Python.
//
// What it gives. A pickle is a program for a stack machine whose memo lets an object be referred to many times, and
// mutated after it was referred to (the pickler memoizes a dict before filling it). So the result is a graph, not a
// tree: a node may be reached along several paths, and a hostile pickle can even put a list inside itself. Walk it
// with a depth bound and a work budget (dcp.cc does). Everything the decoder allocates is bounded by the size of the
// input: each node, memo slot, stack slot and container item costs at least one opcode byte.
#ifndef DISTCKPT_CORE_FOREIGN_PICKLE_H_
#define DISTCKPT_CORE_FOREIGN_PICKLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/span.h"
#include "core/base/status.h"

namespace distckpt {

enum class PickleKind : uint8_t {
  kNone,
  kBool,
  kInt,     ///< Fits int64 (bigger integers are an error at decode time).
  kFloat,   ///< A double.
  kString,  ///< UTF-8 (checked).
  kBytes,   ///< bytes or bytearray.
  kList,
  kTuple,
  kDict,    ///< Items in pickle order; a key set twice appears twice (the reader decides what that means).
  kGlobal,  ///< A (module, name) that was allowed, not called: a class, a function, or a constant (torch.float32).
  kObject,  ///< A global called (REDUCE) or instantiated (NEWOBJ), with its args and its BUILD state.
  kPersistentId,  ///< BINPERSID: a reference to data outside the pickle (torch: a storage record).
};

/// The name of a kind for messages: "a dict", "an int"...
const char* PickleKindName(PickleKind kind);

namespace internal_pickle {
struct Graph;
}  // namespace internal_pickle

/// A handle on one node of a DecodedPickle; valid as long as the DecodedPickle is. Accessors that do not apply to the
/// node's kind return an empty value (0, "", size 0, an invalid handle), never fail.
class PickleValue {
 public:
  PickleValue() = default;
  /// False for the handle of something absent (an object's state before BUILD, a missing dict key).
  bool valid() const { return g_ != nullptr; }
  PickleKind kind() const;
  bool is(PickleKind k) const { return valid() && kind() == k; }

  bool bool_value() const;
  int64_t int_value() const;
  double float_value() const;
  /// The text of a string or the bytes of a bytes node.
  std::string_view str() const;

  /// Items of a list or tuple; key/value pairs of a dict; 0 otherwise.
  size_t size() const;
  /// Item i of a list or tuple.
  PickleValue item(size_t i) const;
  /// Key and value of pair i of a dict.
  PickleValue key(size_t i) const;
  PickleValue value(size_t i) const;

  /// A global's or an object's class/function: module and name.
  std::string_view module() const;
  std::string_view name() const;
  /// "module.name", for messages.
  std::string qualified_name() const;
  /// An object's arguments (a tuple). For NEWOBJ_EX, the positional ones (keyword arguments are refused).
  PickleValue args() const;
  /// True if the object was made by NEWOBJ/NEWOBJ_EX (cls.__new__), false for REDUCE (a call).
  bool newobj() const;
  /// An object's BUILD state; invalid where there was no BUILD.
  PickleValue state() const;
  /// What APPEND/APPENDS added to an object (a list node), or invalid; likewise SETITEM(S) (a dict node). The pickle
  /// protocol gives both to objects whose __reduce__ returns list or dict items (an OrderedDict's SETITEMS).
  PickleValue list_items() const;
  PickleValue dict_items() const;
  /// A persistent id's payload.
  PickleValue persistent_id() const;

  /// A short, bounded rendering for messages and tests: "('a', 1, [2.5, None])", torch.Size((3, 4)). At most
  /// `max_nodes` nodes are printed (then "..."), and nesting stops at depth 16, so a shared or cyclic graph prints
  /// in bounded time.
  std::string DebugString(size_t max_nodes = 64) const;

  /// The same node of the same pickle.
  bool SameNode(const PickleValue& other) const { return g_ == other.g_ && id_ == other.id_; }

 private:
  friend class DecodedPickle;
  PickleValue(const internal_pickle::Graph* g, uint32_t id) : g_(g), id_(id) {}
  PickleValue Node(uint32_t id) const;
  const internal_pickle::Graph* g_ = nullptr;  // owned by the DecodedPickle (on the heap: moves keep handles valid)
  uint32_t id_ = 0;
};

/// `s` in single quotes for an error message: printable ASCII and valid UTF-8 characters as they are, anything else
/// as \xNN, cut (with "...") after about `max_chars` characters at a character boundary. The result is valid UTF-8
/// whatever `s` holds.
std::string QuoteForMessage(std::string_view s, size_t max_chars = 200);

/// A global a pickle may name: GLOBAL or STACK_GLOBAL with exactly this module and name.
struct PickleGlobal {
  std::string module;
  std::string name;
};

struct PickleOptions {
  /// Prefixes every message (the file, and where in it): "'/ckpt/.metadata'".
  std::string context;
  /// The globals the pickle may name. Any other is refused (kCorrupt) naming the file and module.name, before anything
  /// is done with it. Borrowed: the list must outlive the DecodePickle call (a static table, usually).
  Span<const PickleGlobal> allowed_globals;
  /// BINPERSID is refused unless this is set (torch.save's data.pkl refers to its storages that way).
  bool allow_persistent_ids = false;
  /// Inputs larger than this are refused before decoding.
  size_t max_input_bytes = size_t{1} << 31;
};

/// The decoded graph. Movable, not copyable.
class DecodedPickle {
 public:
  DecodedPickle();
  ~DecodedPickle();
  DecodedPickle(DecodedPickle&&) noexcept;
  DecodedPickle& operator=(DecodedPickle&&) noexcept;
  DecodedPickle(const DecodedPickle&) = delete;
  DecodedPickle& operator=(const DecodedPickle&) = delete;

  /// The object STOP returned.
  PickleValue root() const;
  /// How many nodes the decoder made (<= the input size).
  size_t num_nodes() const;

 private:
  friend Result<DecodedPickle> DecodePickle(std::string_view data, const PickleOptions& options);
  std::unique_ptr<internal_pickle::Graph> g_;
};

/// Decodes the pickle in `data`, which must end exactly at its STOP opcode. Errors (kCorrupt; kUnsupported for a
/// protocol above 5) name options.context, the opcode and its byte offset: an unknown or unsupported opcode, a
/// truncated argument, a length past the end of the input, a stack underflow, an unknown memo index, a global not
/// in the allow-list, a persistent id where none is allowed, an integer beyond int64, invalid UTF-8.
Result<DecodedPickle> DecodePickle(std::string_view data, const PickleOptions& options);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_FOREIGN_PICKLE_H_
