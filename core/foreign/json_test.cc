#include "core/foreign/json.h"

#include <gtest/gtest.h>

#include <string>

#include "core/base/testing/status_matchers.h"

namespace distckpt {
namespace {

TEST(JsonTest, ParsesDocuments) {
  DCKPT_ASSERT_OK_AND_ASSIGN(
      JsonValue v, ParseJson(R"( {"a": [1, 18446744073709551615, -2, 0.5, 1e3], "b": {"c": "x\"\u00e9\ud83d\ude00"},
                                           "d": true, "e": false, "f": null}   )",
                             "doc"));
  ASSERT_TRUE(v.is_object());
  ASSERT_EQ(v.members.size(), 5u);
  const JsonValue* a = v.Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 5u);
  EXPECT_EQ(a->items[0].AsU64(), 1u);
  EXPECT_EQ(a->items[1].AsU64(), UINT64_MAX);  // exact, no double rounding
  EXPECT_FALSE(a->items[2].AsU64());
  EXPECT_FALSE(a->items[3].AsU64());
  EXPECT_FALSE(a->items[4].AsU64());
  EXPECT_EQ(v.Find("b")->Find("c")->text, "x\"\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v.Find("d")->boolean);
  EXPECT_EQ(v.Find("f")->kind, JsonValue::Kind::kNull);
  EXPECT_EQ(v.Find("zz"), nullptr);
}

TEST(JsonTest, RefusesWhatRfc8259Refuses) {
  const char* bad[] = {
      "",
      "{",
      "{\"a\":1,}",
      "[1,]",
      "{'a':1}",
      "{\"a\" 1}",
      "01",
      "1.",
      ".5",
      "-",
      "1e",
      "NaN",
      "[1] [2]",
      "\"\\x\"",
      "\"\x01\"",
      "\"\\ud800\"",
      "\"\\udc00\"",
      "\"\\ud800\\u0041\"",
      "\"\xc0\xaf\"",
      "\"\xed\xa0\x80\"",
      "tru",
      "{\"a\":1 \"b\":2}",
      "\"abc",
  };
  for (const char* s : bad) {
    auto r = ParseJson(s, "doc");
    EXPECT_TRUE(StatusIs(r.status(), StatusCode::kCorrupt, {"doc: invalid JSON at byte"})) << s;
  }
  DCKPT_ASSERT_OK_AND_ASSIGN(JsonValue big, ParseJson("18446744073709551616", "doc"));
  EXPECT_FALSE(big.AsU64());  // one past UINT64_MAX
}

TEST(JsonTest, BoundsNesting) {
  std::string deep(100, '[');
  deep += std::string(100, ']');
  EXPECT_TRUE(StatusIs(ParseJson(deep, "doc", 64).status(), StatusCode::kCorrupt, {"nesting deeper than 64"}));
  EXPECT_TRUE(ParseJson(deep, "doc", 128).ok());
  // Deep input far past any limit: no recursion beyond the limit, a clean error.
  std::string very(1 << 20, '[');
  EXPECT_FALSE(ParseJson(very, "doc").ok());
}

TEST(JsonTest, EveryPrefixOfADocumentFailsCleanly) {
  const std::string doc = R"({"t":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"__metadata__":{"k":"\u00e9"}})";
  ASSERT_TRUE(ParseJson(doc, "doc").ok());
  for (size_t n = 0; n < doc.size(); ++n) EXPECT_FALSE(ParseJson(doc.substr(0, n), "doc").ok()) << n;
}

TEST(JsonTest, QuotesForWriters) {
  EXPECT_EQ(JsonQuote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
  DCKPT_ASSERT_OK_AND_ASSIGN(JsonValue v, ParseJson(JsonQuote("x\ty\"z\x1f"), "doc"));
  EXPECT_EQ(v.text, "x\ty\"z\x1f");
}

}  // namespace
}  // namespace distckpt
