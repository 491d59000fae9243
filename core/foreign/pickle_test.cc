// Tests of the restricted pickle decoder: real CPython pickles of every protocol it reads, each supported opcode,
// memo and nesting, truncation at every byte, and hostile pickles (code execution, huge lengths, deep nesting,
// memo bombs).
#include "core/foreign/pickle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/base/testing/status_matchers.h"

namespace distckpt {
namespace {

// Pickles CPython 3.11 wrote of one dict (protocols 2, 3, 4, 5), made with:
//   x = [7]
//   obj = {"none": None, "t": True, "f": False, "i1": 5, "i2": 300, "i4": -7, "big": 2**40, "min": -2**63,
//          "max": 2**63-1, "fl": 2.5, "s": "h\u00e9llo", "b": b"\x00\x01", "ba": bytearray(b"xy"), "tup": (1, 2, 3),
//          "tup0": (), "tup1": (1,), "tup2": (1, 2), "tup4": (1, 2, 3, 4), "nest": [1, [2, [3]]], "shared": [x, x],
//          "od": collections.OrderedDict([("a", 1)]), "ns": argparse.Namespace(a=1)}
//   pickle.dumps(obj, protocol=p).hex()
const char* const kCPythonPickles[] = {
    // protocol 2
    "80027d71002858040000006e6f6e6571014e5801000000747102885801000000667103895802000000693171044b05580200000069327105"
    "4d2c015802000000693471064af9ffffff580300000062696771078a0600000000000158030000006d696e71088a08000000000000008058"
    "030000006d617871098a08ffffffffffffff7f5802000000666c710a474004000000000000580100000073710b580600000068c3a96c6c6f"
    "710c580100000062710d635f636f646563730a656e636f64650a710e58020000000001710f58060000006c6174696e317110867111527112"
    "580200000062617113635f5f6275696c74696e5f5f0a6279746561727261790a7114680e5802000000787971156810867116527117857118"
    "5271195803000000747570711a4b014b024b0387711b580400000074757030711c29580400000074757031711d4b0185711e580400000074"
    "757032711f4b014b028671205804000000747570347121284b014b024b034b0474712258040000006e65737471235d7124284b015d712528"
    "4b025d71264b03616565580600000073686172656471275d7128285d71294b076168296558020000006f64712a63636f6c6c656374696f6e"
    "730a4f726465726564446963740a712b2952712c580100000061712d4b017358020000006e73712e6361726770617273650a4e616d657370"
    "6163650a712f298171307d7131682d4b017362752e",
    // protocol 3
    "80037d71002858040000006e6f6e6571014e5801000000747102885801000000667103895802000000693171044b05580200000069327105"
    "4d2c015802000000693471064af9ffffff580300000062696771078a0600000000000158030000006d696e71088a08000000000000008058"
    "030000006d617871098a08ffffffffffffff7f5802000000666c710a474004000000000000580100000073710b580600000068c3a96c6c6f"
    "710c580100000062710d43020001710e58020000006261710f636275696c74696e730a6279746561727261790a7110430278797111857112"
    "527113580300000074757071144b014b024b0387711558040000007475703071162958040000007475703171174b01857118580400000074"
    "75703271194b014b0286711a580400000074757034711b284b014b024b034b0474711c58040000006e657374711d5d711e284b015d711f28"
    "4b025d71204b03616565580600000073686172656471215d7122285d71234b076168236558020000006f64712463636f6c6c656374696f6e"
    "730a4f726465726564446963740a71252952712658010000006171274b017358020000006e7371286361726770617273650a4e616d657370"
    "6163650a71292981712a7d712b68274b017362752e",
    // protocol 4
    "8004956b010000000000007d94288c046e6f6e65944e8c017494888c016694898c026931944b058c026932944d2c018c026934944af9ffff"
    "ff8c03626967948a060000000000018c036d696e948a0800000000000000808c036d6178948a08ffffffffffffff7f8c02666c9447400400"
    "00000000008c0173948c0668c3a96c6c6f948c01629443020001948c026261948c086275696c74696e73948c096279746561727261799493"
    "944302787994859452948c03747570944b014b024b0387948c047475703094298c0474757031944b0185948c0474757032944b014b028694"
    "8c047475703494284b014b024b034b0474948c046e657374945d94284b015d94284b025d944b036165658c06736861726564945d94285d94"
    "4b07616825658c026f64948c0b636f6c6c656374696f6e73948c0b4f726465726564446963749493942952948c0161944b01738c026e7394"
    "8c086172677061727365948c094e616d6573706163659493942981947d94682b4b017362752e",
    // protocol 5
    "80059555010000000000007d94288c046e6f6e65944e8c017494888c016694898c026931944b058c026932944d2c018c026934944af9ffff"
    "ff8c03626967948a060000000000018c036d696e948a0800000000000000808c036d6178948a08ffffffffffffff7f8c02666c9447400400"
    "00000000008c0173948c0668c3a96c6c6f948c01629443020001948c026261949602000000000000007879948c03747570944b014b024b03"
    "87948c047475703094298c0474757031944b0185948c0474757032944b014b0286948c047475703494284b014b024b034b0474948c046e65"
    "7374945d94284b015d94284b025d944b036165658c06736861726564945d94285d944b07616820658c026f64948c0b636f6c6c656374696f"
    "6e73948c0b4f726465726564446963749493942952948c0161944b01738c026e73948c086172677061727365948c094e616d657370616365"
    "9493942981947d9468264b017362752e",
};

std::string Unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

const std::vector<PickleGlobal> kTestGlobals = {
    {"collections", "OrderedDict"}, {"argparse", "Namespace"},    {"_codecs", "encode"},
    {"builtins", "bytearray"},      {"__builtin__", "bytearray"}, {"torch", "FloatStorage"},
};

PickleOptions Opts(bool persistent_ids = false) {
  PickleOptions o;
  o.context = "'test.pkl'";
  o.allowed_globals = kTestGlobals;
  o.allow_persistent_ids = persistent_ids;
  return o;
}

// Builds pickles opcode by opcode.
class P {
 public:
  P& op(uint8_t c) { return raw(std::string(1, static_cast<char>(c))); }
  P& raw(const std::string& s) {
    b_ += s;
    return *this;
  }
  P& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  P& str(const std::string& s) { return op(0x8c).le(s.size(), 1).raw(s); }  // SHORT_BINUNICODE
  P& i1(uint8_t v) { return op('K').le(v, 1); }                             // BININT1
  P& stop() { return op('.'); }
  const std::string& bytes() const { return b_; }

 private:
  std::string b_;
};

PickleValue DictGet(const PickleValue& d, const std::string& k) {
  for (size_t i = 0; i < d.size(); ++i) {
    if (d.key(i).is(PickleKind::kString) && d.key(i).str() == k) return d.value(i);
  }
  return {};
}

Result<DecodedPickle> Decode(const std::string& b, const PickleOptions& o = Opts()) { return DecodePickle(b, o); }

TEST(PickleTest, CPythonPicklesOfEveryProtocol) {
  int protocol = 2;
  for (const char* hex : kCPythonPickles) {
    SCOPED_TRACE("protocol " + std::to_string(protocol));
    const std::string data = Unhex(hex);
    DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle p, Decode(data));
    const PickleValue d = p.root();
    ASSERT_TRUE(d.is(PickleKind::kDict));
    EXPECT_EQ(d.size(), 22u);
    EXPECT_TRUE(DictGet(d, "none").is(PickleKind::kNone));
    EXPECT_TRUE(DictGet(d, "t").is(PickleKind::kBool) && DictGet(d, "t").bool_value());
    EXPECT_TRUE(DictGet(d, "f").is(PickleKind::kBool) && !DictGet(d, "f").bool_value());
    EXPECT_EQ(DictGet(d, "i1").int_value(), 5);
    EXPECT_EQ(DictGet(d, "i2").int_value(), 300);
    EXPECT_EQ(DictGet(d, "i4").int_value(), -7);
    EXPECT_EQ(DictGet(d, "big").int_value(), int64_t{1} << 40);
    EXPECT_EQ(DictGet(d, "min").int_value(), INT64_MIN);
    EXPECT_EQ(DictGet(d, "max").int_value(), INT64_MAX);
    EXPECT_TRUE(DictGet(d, "fl").is(PickleKind::kFloat));
    EXPECT_EQ(DictGet(d, "fl").float_value(), 2.5);
    EXPECT_EQ(DictGet(d, "s").str(), "h\xc3\xa9llo");
    const PickleValue b = DictGet(d, "b");
    const PickleValue ba = DictGet(d, "ba");
    if (protocol == 2) {  // bytes in protocol 2: _codecs.encode('\x00\x01', 'latin1')
      EXPECT_EQ(b.qualified_name(), "_codecs.encode");
      EXPECT_EQ(b.args().item(0).str(), std::string("\0\1", 2));
    } else {
      EXPECT_TRUE(b.is(PickleKind::kBytes));
      EXPECT_EQ(b.str(), std::string("\0\1", 2));
    }
    if (protocol < 5) {  // bytearray before protocol 5: builtins.bytearray(...) (__builtin__ in protocol 2)
      EXPECT_EQ(ba.name(), "bytearray");
    } else {
      EXPECT_TRUE(ba.is(PickleKind::kBytes));
      EXPECT_EQ(ba.str(), "xy");
    }
    EXPECT_EQ(DictGet(d, "tup").DebugString(), "(1, 2, 3)");
    EXPECT_EQ(DictGet(d, "tup0").DebugString(), "()");
    EXPECT_EQ(DictGet(d, "tup1").DebugString(), "(1,)");
    EXPECT_EQ(DictGet(d, "tup2").DebugString(), "(1, 2)");
    EXPECT_EQ(DictGet(d, "tup4").DebugString(), "(1, 2, 3, 4)");
    EXPECT_EQ(DictGet(d, "nest").DebugString(), "[1, [2, [3]]]");
    const PickleValue shared = DictGet(d, "shared");
    ASSERT_EQ(shared.size(), 2u);
    EXPECT_TRUE(shared.item(0).SameNode(shared.item(1)));  // the memo gives the same object twice
    EXPECT_EQ(shared.DebugString(), "[[7], [7]]");
    const PickleValue od = DictGet(d, "od");  // REDUCE, then SETITEMS on the object
    EXPECT_EQ(od.qualified_name(), "collections.OrderedDict");
    EXPECT_FALSE(od.newobj());
    EXPECT_EQ(od.args().size(), 0u);
    EXPECT_EQ(od.dict_items().DebugString(), "{'a': 1}");
    const PickleValue ns = DictGet(d, "ns");  // NEWOBJ, then BUILD
    EXPECT_EQ(ns.qualified_name(), "argparse.Namespace");
    EXPECT_TRUE(ns.newobj());
    EXPECT_EQ(ns.state().DebugString(), "{'a': 1}");
    EXPECT_FALSE(ns.list_items().valid());
    ++protocol;
  }
}

TEST(PickleTest, OpcodesCPythonDoesNotWriteForThatDict) {
  // Protocol-0/1 containers, POP, POP_MARK, DUP, text GET/PUT, LONG_BINPUT/GET, and the 8-byte counts.
  P p;
  p.op(0x80).le(2, 1).op('(');                            // PROTO 2, MARK (of the outer LIST)
  p.op('(').i1(1).i1(2).op('l');                          // LIST [1, 2]
  p.op('(').str("k").i1(3).op('d');                       // DICT {'k': 3}
  p.op('(').i1(9).i1(9).op('1');                          // POP_MARK: discards (9, 9)
  p.i1(4).op('2');                                        // DUP: 4, 4
  p.i1(5).op('0');                                        // POP: the 5
  p.op('p').raw("12\n").op('g').raw("12\n");              // PUT 12, GET 12: a third 4
  p.op('r').le(70, 4).op('j').le(70, 4);                  // LONG_BINPUT, LONG_BINGET: a fourth 4
  p.op(0x8b).le(2, 4).le(0xff01, 2);                      // LONG4 of 2 bytes: -255
  p.op(0x8a).le(0, 1);                                    // LONG1 of 0 bytes: 0
  p.op(0x8a).le(3, 1).le(0x800000, 3);                    // LONG1 -8388608 (sign-extended)
  p.op(0x8d).le(3, 8).raw("abc");                         // BINUNICODE8
  p.op(0x8e).le(2, 8).raw("xy");                          // BINBYTES8
  p.op('B').le(1, 4).raw("z");                            // BINBYTES
  p.op('U').le(2, 1).raw("hi");                           // SHORT_BINSTRING
  p.op('T').le(2, 4).raw("ho");                           // BINSTRING
  p.op('X').le(2, 4).raw("\xce\xbb");                     // BINUNICODE (lambda)
  p.op('J').le(0xfffffffe, 4);                            // BININT -2
  p.op('G').raw(std::string("\xc0\x00\0\0\0\0\0\0", 8));  // BINFLOAT -2.0 (big-endian)
  p.op('l').stop();
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle d, Decode(p.bytes()));
  EXPECT_EQ(d.root().DebugString(),
            "[[1, 2], {'k': 3}, 4, 4, 4, 4, -255, 0, -8388608, 'abc', b'xy', b'z', 'hi', 'ho', '\xce\xbb', -2, -2]");
}

TEST(PickleTest, NewobjExFrameAndPersistentIds) {
  P p;
  p.op(0x80).le(4, 1).op(0x95).le(0, 8);                                 // an empty FRAME
  p.str("argparse").str("Namespace").op(0x93).op(')').op('}').op(0x92);  // NEWOBJ_EX(cls, (), {})
  p.op(0x94);                                                            // MEMOIZE as 0
  p.str("storage").op(0x85).op('Q');                                     // BINPERSID ('storage',)
  p.op(0x86).stop();
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle d, Decode(p.bytes(), Opts(/*persistent_ids=*/true)));
  EXPECT_EQ(d.root().DebugString(), "(argparse.Namespace(), persistent_id(('storage',)))");
  EXPECT_TRUE(d.root().item(0).newobj());
  EXPECT_EQ(d.root().item(1).persistent_id().item(0).str(), "storage");
  // Keyword arguments are refused; so is a persistent id where none is allowed.
  P kw;
  kw.op(0x80).le(4, 1).str("argparse").str("Namespace").op(0x93).op(')').op('}').str("a").i1(1).op('s').op(0x92).stop();
  EXPECT_TRUE(StatusIs(Decode(kw.bytes()).status(), StatusCode::kCorrupt, {"NEWOBJ_EX", "keyword"}));
  EXPECT_TRUE(StatusIs(Decode(p.bytes()).status(), StatusCode::kCorrupt, {"'test.pkl'", "BINPERSID", "persistent"}));
}

TEST(PickleTest, FramesAreHonouredStrictly) {
  // A frame that covers the rest: fine.
  P ok;
  ok.op(0x80).le(4, 1).op(0x95).le(4, 8).i1(7).op(0x85).stop();
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle d, Decode(ok.bytes()));
  EXPECT_EQ(d.root().DebugString(), "(7,)");
  // Two frames one after the other.
  P two;
  two.op(0x80).le(4, 1).op(0x95).le(2, 8).i1(7).op(0x95).le(2, 8).op(0x85).stop();
  DCKPT_EXPECT_OK(Decode(two.bytes()).status());
  // A frame inside a frame, and an argument that crosses the frame's end, are refused (CPython refuses both).
  P nested;
  nested.op(0x80).le(4, 1).op(0x95).le(12, 8).op(0x95).le(1, 8).i1(1).stop();
  EXPECT_TRUE(StatusIs(Decode(nested.bytes()).status(), StatusCode::kCorrupt, {"FRAME", "inside another frame"}));
  P straddle;
  straddle.op(0x80).le(4, 1).op(0x95).le(1, 8).i1(7).op(0x85).stop();
  EXPECT_TRUE(StatusIs(Decode(straddle.bytes()).status(), StatusCode::kCorrupt, {"BININT1", "end of its frame"}));
  P past;
  past.op(0x80).le(4, 1).op(0x95).le(1000, 8).stop();
  EXPECT_TRUE(StatusIs(Decode(past.bytes()).status(), StatusCode::kCorrupt, {"FRAME", "past the end"}));
}

TEST(PickleTest, MemoSharesObjectsAndSeesLaterChanges) {
  // The pickler memoizes a dict before filling it: GET must give the filled dict, the same node.
  P p;
  p.op(0x80).le(4, 1).op('}').op(0x94);          // {} memo 0
  p.op('(').str("a").i1(1).op('u');              // SETITEMS {'a': 1}
  p.op('h').le(0, 1).op(0x86);                   // (d, d)
  p.op('q').le(5, 1);                            // BINPUT 5
  p.op(0x94);                                    // MEMOIZE: index 2 (two entries so far), not 6
  p.op('h').le(2, 1).op('h').le(5, 1).op(0x87);  // (t, t, t) -> 3-tuple of the same tuple
  p.stop();
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle d, Decode(p.bytes()));
  const PickleValue t = d.root();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_TRUE(t.item(0).SameNode(t.item(1)) && t.item(1).SameNode(t.item(2)));
  EXPECT_EQ(t.item(0).item(0).DebugString(), "{'a': 1}");
  EXPECT_TRUE(t.item(0).item(0).SameNode(t.item(0).item(1)));
  P unknown;
  unknown.op(0x80).le(4, 1).op('h').le(3, 1).stop();
  EXPECT_TRUE(StatusIs(Decode(unknown.bytes()).status(), StatusCode::kCorrupt, {"BINGET", "memo index 3"}));
}

TEST(PickleTest, DeepNestingNeedsNoRecursion) {
  // 200,000 lists, each inside the previous: N EMPTY_LIST, then N-1 APPEND.
  constexpr int kDepth = 200000;
  P p;
  p.op(0x80).le(2, 1);
  for (int i = 0; i < kDepth; ++i) p.op(']');
  for (int i = 1; i < kDepth; ++i) p.op('a');
  p.stop();
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle d, Decode(p.bytes()));
  PickleValue v = d.root();
  int depth = 1;
  while (v.size() == 1) {
    v = v.item(0);
    ++depth;
  }
  EXPECT_EQ(depth, kDepth);
  const std::string s = d.root().DebugString(1000);  // bounded: nesting stops at depth 16
  EXPECT_LT(s.size(), 200u);
  EXPECT_NE(s.find("..."), std::string::npos);
}

TEST(PickleTest, CyclesDecodeAndPrintBounded) {
  // l = []; l.append(l)
  P p;
  p.op(0x80).le(2, 1).op(']').op('q').le(0, 1).op('h').le(0, 1).op('a').stop();
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle d, Decode(p.bytes()));
  EXPECT_TRUE(d.root().item(0).SameNode(d.root()));
  EXPECT_LT(d.root().DebugString().size(), 200u);
}

TEST(PickleTest, MemoBombStaysSmall) {
  // t0 = (); t(k+1) = (tk, tk): 2^60 leaves as a tree, 61 nodes as decoded.
  P p;
  p.op(0x80).le(2, 1).op(')').op('q').le(0, 1);
  for (int k = 0; k < 60; ++k) p.op('0').op('h').le(k, 1).op('h').le(k, 1).op(0x86).op('q').le(k + 1, 1);
  p.stop();
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle d, Decode(p.bytes()));
  EXPECT_LT(d.num_nodes(), 100u);
  EXPECT_LT(d.root().DebugString(500).size(), 5000u);
  // A memo index far beyond the input would make a huge table: refused.
  P huge;
  huge.op(0x80).le(2, 1).op('N').op('r').le(0xffffffff, 4).stop();
  EXPECT_TRUE(StatusIs(Decode(huge.bytes()).status(), StatusCode::kCorrupt, {"LONG_BINPUT", "out of range"}));
  P text;
  text.op('N').op('p').raw("99999999999999999999\n").stop();
  EXPECT_TRUE(StatusIs(Decode(text.bytes()).status(), StatusCode::kCorrupt, {"PUT"}));
}

TEST(PickleTest, HostileGlobalsAreRefusedByName) {
  // The classic: os.system('echo pwned') as pickle protocol 0 writes it on Linux.
  const std::string classic = "cposix\nsystem\n(S'echo pwned'\ntR.";
  EXPECT_TRUE(StatusIs(Decode(classic).status(), StatusCode::kCorrupt, {"'test.pkl'", "posix.system", "GLOBAL"}));
  P eval;
  eval.op(0x80).le(4, 1).str("builtins").str("eval").op(0x93).str("print(1)").op(0x85).op('R').stop();
  EXPECT_TRUE(StatusIs(Decode(eval.bytes()).status(), StatusCode::kCorrupt, {"builtins.eval", "STACK_GLOBAL"}));
  P os;
  os.op(0x80).le(2, 1).op('c').raw("os\nsystem\n").op('X').le(2, 4).raw("id").op(0x85).op('R').stop();
  EXPECT_TRUE(StatusIs(Decode(os.bytes()).status(), StatusCode::kCorrupt, {"os.system"}));
  // A name in the allow-list under another module is not allowed either.
  P other;
  other.op(0x80).le(2, 1).op('c').raw("evil\nOrderedDict\n").op(')').op('R').stop();
  EXPECT_TRUE(StatusIs(Decode(other.bytes()).status(), StatusCode::kCorrupt, {"evil.OrderedDict"}));
}

TEST(PickleTest, CallsAndBuildsOnlyOnAllowedGlobals) {
  P call_string;  // REDUCE on a string: there is nothing to call
  call_string.op(0x80).le(2, 1).str("x").op(')').op('R').stop();
  EXPECT_TRUE(StatusIs(Decode(call_string.bytes()).status(), StatusCode::kCorrupt, {"REDUCE", "a string"}));
  P args_not_tuple;
  args_not_tuple.op(0x80).le(2, 1).op('c').raw("collections\nOrderedDict\n").op(']').op('R').stop();
  EXPECT_TRUE(StatusIs(Decode(args_not_tuple.bytes()).status(), StatusCode::kCorrupt, {"REDUCE", "not a tuple"}));
  P build_global;  // BUILD on a class would change the class
  build_global.op(0x80).le(2, 1).op('c').raw("collections\nOrderedDict\n").op('}').op('b').stop();
  EXPECT_TRUE(StatusIs(Decode(build_global.bytes()).status(), StatusCode::kCorrupt, {"BUILD", "a global"}));
  P build_twice;
  build_twice.op(0x80).le(2, 1).op('c').raw("argparse\nNamespace\n").op(')').op(0x81).op('}').op('b').op('}').op('b');
  build_twice.stop();
  EXPECT_TRUE(StatusIs(Decode(build_twice.bytes()).status(), StatusCode::kCorrupt, {"BUILD", "second time"}));
  P append_to_int;
  append_to_int.op(0x80).le(2, 1).i1(1).i1(2).op('a').stop();
  EXPECT_TRUE(StatusIs(Decode(append_to_int.bytes()).status(), StatusCode::kCorrupt, {"APPEND", "an int"}));
}

TEST(PickleTest, HugeCountedLengthsFailWithoutAllocating) {
  struct Case {
    const char* name;
    std::string bytes;
  };
  std::vector<Case> cases;
  cases.push_back({"BINUNICODE8", P().op(0x80).le(4, 1).op(0x8d).le(uint64_t{1} << 63, 8).stop().bytes()});
  cases.push_back({"BINBYTES8", P().op(0x80).le(4, 1).op(0x8e).le(~uint64_t{0}, 8).stop().bytes()});
  cases.push_back({"BYTEARRAY8", P().op(0x80).le(5, 1).op(0x96).le(~uint64_t{0} - 3, 8).stop().bytes()});
  cases.push_back({"BINUNICODE", P().op(0x80).le(2, 1).op('X').le(0xffffffff, 4).stop().bytes()});
  cases.push_back({"BINBYTES", P().op(0x80).le(3, 1).op('B').le(0xffffffff, 4).stop().bytes()});
  cases.push_back({"LONG4", P().op(0x80).le(2, 1).op(0x8b).le(0x7fffffff, 4).stop().bytes()});
  cases.push_back({"BINSTRING", P().op(0x80).le(2, 1).op('T').le(0x7fffffff, 4).stop().bytes()});
  cases.push_back({"FRAME", P().op(0x80).le(4, 1).op(0x95).le(~uint64_t{0}, 8).stop().bytes()});
  for (const Case& c : cases) {
    EXPECT_TRUE(StatusIs(Decode(c.bytes).status(), StatusCode::kCorrupt, {c.name, "past the end"})) << c.name;
  }
  EXPECT_TRUE(StatusIs(Decode(P().op(0x8b).le(0x80000000, 4).stop().bytes()).status(), StatusCode::kCorrupt,
                       {"LONG4", "negative"}));
  EXPECT_TRUE(StatusIs(Decode(P().op('T').le(0xffffffff, 4).stop().bytes()).status(), StatusCode::kCorrupt,
                       {"BINSTRING", "negative"}));
  PickleOptions small = Opts();
  small.max_input_bytes = 4;
  EXPECT_TRUE(StatusIs(Decode("N.xxxxx", small).status(), StatusCode::kCorrupt, {"larger than the limit"}));
}

TEST(PickleTest, IntegersBeyondInt64AreErrors) {
  EXPECT_TRUE(StatusIs(Decode(P().op(0x8a).le(9, 1).le(1, 8).le(0, 1).stop().bytes()).status(), StatusCode::kCorrupt,
                       {"LONG1", "does not fit 64 bits"}));
  // 2^64 - 1 needs 9 bytes in two's complement.
  EXPECT_TRUE(StatusIs(Decode(P().op(0x8a).le(9, 1).le(~uint64_t{0}, 8).le(0, 1).stop().bytes()).status(),
                       StatusCode::kCorrupt, {"does not fit"}));
}

TEST(PickleTest, StackAndMarkMisuse) {
  EXPECT_TRUE(StatusIs(Decode(".").status(), StatusCode::kCorrupt, {"STOP", "empty"}));
  EXPECT_TRUE(StatusIs(Decode("a.").status(), StatusCode::kCorrupt, {"APPEND", "empty"}));
  EXPECT_TRUE(StatusIs(Decode("Nt.").status(), StatusCode::kCorrupt, {"TUPLE", "no MARK"}));
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle popped_mark, Decode("N(0\x85."));  // POP takes the MARK (as CPython)
  EXPECT_EQ(popped_mark.root().DebugString(), "(None,)");
  EXPECT_TRUE(StatusIs(Decode("N(\x85.").status(), StatusCode::kCorrupt, {"TUPLE1", "above the last MARK"}));
  EXPECT_TRUE(StatusIs(Decode("}(Nu.").status(), StatusCode::kCorrupt, {"SETITEMS", "key without a value"}));
  EXPECT_TRUE(StatusIs(Decode("(Nd.").status(), StatusCode::kCorrupt, {"DICT", "key without a value"}));
  EXPECT_TRUE(StatusIs(Decode("(Ne.").status(), StatusCode::kCorrupt, {"APPENDS", "no list"}));
  EXPECT_TRUE(StatusIs(Decode("N(.").status(), StatusCode::kCorrupt, {"STOP"}));
  EXPECT_TRUE(StatusIs(Decode("NN.").status(), StatusCode::kCorrupt, {"leaves 1 values"}));
  EXPECT_TRUE(StatusIs(Decode("N.N").status(), StatusCode::kCorrupt, {"1 bytes follow the STOP"}));
  // A million MARKs: bounded by the input, refused at STOP.
  std::string marks(1 << 20, '(');
  EXPECT_TRUE(StatusIs(Decode(marks + "N.").status(), StatusCode::kCorrupt, {"marks behind"}));
}

TEST(PickleTest, UnknownAndUnsupportedOpcodesAreNamed) {
  EXPECT_TRUE(StatusIs(Decode("\x80\x02\xff.").status(), StatusCode::kCorrupt,
                       {"'test.pkl'", "unknown pickle opcode 0xff", "byte 2"}));
  for (const auto& [byte, name] : std::vector<std::pair<std::string, std::string>>{{"I1\n", "INT"},
                                                                                   {"L1L\n", "LONG"},
                                                                                   {"F1.0\n", "FLOAT"},
                                                                                   {"S'a'\n", "STRING"},
                                                                                   {"Va\n", "UNICODE"},
                                                                                   {"i", "INST"},
                                                                                   {"o", "OBJ"},
                                                                                   {"\x82\x01", "EXT1"},
                                                                                   {"\x8f", "EMPTY_SET"},
                                                                                   {"\x90", "ADDITEMS"},
                                                                                   {"\x91", "FROZENSET"},
                                                                                   {"\x97", "NEXT_BUFFER"},
                                                                                   {"\x98", "READONLY_BUFFER"},
                                                                                   {"P1\n", "PERSID"}}) {
    EXPECT_TRUE(StatusIs(Decode("\x80\x02" + byte + ".").status(), StatusCode::kCorrupt, {name, "byte 2"})) << name;
  }
  EXPECT_TRUE(StatusIs(Decode("\x80\x06N.").status(), StatusCode::kUnsupported, {"protocol 6"}));
}

TEST(PickleTest, StringsMustBeValidUtf8) {
  for (const std::string& bad : {std::string("\xc0\x80"), std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80"),
                                 std::string("\xe2\x82"), std::string("\x80")}) {
    EXPECT_TRUE(StatusIs(Decode(P().str(bad).stop().bytes()).status(), StatusCode::kCorrupt, {"UTF-8"}));
  }
  EXPECT_TRUE(
      StatusIs(Decode(P().op('U').le(1, 1).raw("\xe9").stop().bytes()).status(), StatusCode::kCorrupt, {"not ASCII"}));
  DCKPT_EXPECT_OK(Decode(P().str("\xf0\x9f\x98\x80").stop().bytes()).status());
}

TEST(PickleTest, EveryTruncationIsACleanError) {
  for (const char* hex : kCPythonPickles) {
    const std::string data = Unhex(hex);
    for (size_t n = 0; n < data.size(); ++n) {
      Result<DecodedPickle> r = Decode(data.substr(0, n));
      ASSERT_FALSE(r.ok()) << n;
      EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << n << ": " << r.status().ToString();
      EXPECT_NE(r.status().message().find("'test.pkl'"), std::string::npos);
    }
  }
}

TEST(PickleTest, EveryByteFlipDecodesOrFailsCleanly) {
  size_t ok = 0, failed = 0;
  for (const char* hex : kCPythonPickles) {
    const std::string data = Unhex(hex);
    for (size_t i = 0; i < data.size(); ++i) {
      for (uint8_t x : {0x01, 0x80, 0xff}) {
        std::string m = data;
        m[i] = static_cast<char>(m[i] ^ x);
        Result<DecodedPickle> r = Decode(m);
        if (r.ok()) {
          ++ok;
          (void)r->root().DebugString();  // every accessor is safe on what decodes
        } else {
          ++failed;
          EXPECT_TRUE(r.status().code() == StatusCode::kCorrupt || r.status().code() == StatusCode::kUnsupported);
        }
      }
    }
  }
  EXPECT_GT(failed, 0u);
  EXPECT_GT(ok, 0u);  // flips inside strings and numbers still decode
}

TEST(PickleTest, PrintingIsBoundedAndValidUtf8) {
  // A fuzz finding: a list of 300 references to one bytes object of control bytes printed as 85 KB, because each byte
  // became a 4-character escape after the cut at 200 bytes. Now the cut counts characters printed.
  P p;
  p.op(0x80).le(4, 1).op(']').op('(').op('B').le(255, 4).raw(std::string(255, '\x01')).op(0x94);
  for (int i = 0; i < 300; ++i) p.op('h').le(0, 1);
  p.op('e').stop();
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle d, Decode(p.bytes()));
  const std::string s = d.root().DebugString(256);
  EXPECT_LT(s.size(), 256u * 230);
  // Bytes print as Python does (escapes above 0x7f too); strings keep their characters and are never cut inside one.
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle b, Decode(P().op('C')
                                                         .le(3, 1)
                                                         .raw(std::string("\xff\x00"
                                                                          "a",
                                                                          3))
                                                         .stop()
                                                         .bytes()));
  EXPECT_EQ(b.root().DebugString(), "b'\\xff\\x00a'");
  const std::string lambdas(300, 'x');
  EXPECT_EQ(QuoteForMessage("\xce\xbb\xce\xbb\xce\xbb", 3), "'\xce\xbb\xce\xbb...'");  // whole lambdas only
  EXPECT_EQ(QuoteForMessage("a\xff"
                            "b\nc"),
            "'a\\xffb\\x0ac'");
  EXPECT_EQ(QuoteForMessage(lambdas, 10), "'xxxxxxxxxx...'");
  EXPECT_EQ(QuoteForMessage("\xe2\x82"), "'\\xe2\\x82'");  // a truncated character is escaped, not copied
}

TEST(PickleTest, AccessorsOfTheWrongKindAreEmpty) {
  DCKPT_ASSERT_OK_AND_ASSIGN(DecodedPickle d, Decode(P().i1(3).stop().bytes()));
  const PickleValue v = d.root();
  EXPECT_EQ(v.str(), "");
  EXPECT_EQ(v.size(), 0u);
  EXPECT_FALSE(v.item(0).valid());
  EXPECT_FALSE(v.key(0).valid());
  EXPECT_FALSE(v.args().valid());
  EXPECT_FALSE(v.state().valid());
  EXPECT_FALSE(v.persistent_id().valid());
  EXPECT_EQ(v.module(), "");
  EXPECT_FALSE(PickleValue().valid());
  EXPECT_EQ(PickleValue().DebugString(), "<absent>");
  // Handles stay valid when the DecodedPickle moves.
  DecodedPickle moved = std::move(d);
  EXPECT_EQ(v.int_value(), 3);
  EXPECT_TRUE(moved.root().SameNode(v));
}

}  // namespace
}  // namespace distckpt
