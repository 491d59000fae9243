// Name rules (name_rules.h): the syntax, first match wins, whole-name matches, drops, and every error a user can hit,
// each naming the rule or both tensors.
#include "core/tools/name_rules.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace distckpt {
namespace {

NameRules MustCompile(const std::vector<NameRule>& rules) {
  auto r = NameRules::Compile(rules);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : NameRules();
}

std::optional<std::string> MapOrDie(const NameRules& rules, const std::string& name) {
  auto r = rules.Map(name);
  EXPECT_TRUE(r.ok()) << name << ": " << r.status().ToString();
  return r.ok() ? *r : std::optional<std::string>("<error>");
}

void ExpectInvalid(const Status& st, const std::vector<std::string>& mentions) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  for (const std::string& m : mentions)
    EXPECT_NE(st.message().find(m), std::string::npos) << m << " in " << st.message();
}

TEST(NameRulesTest, NoRulesKeepEveryName) {
  NameRules rules;
  EXPECT_TRUE(rules.empty());
  EXPECT_EQ(MapOrDie(rules, "model.layers.0.weight"), "model.layers.0.weight");
}

TEST(NameRulesTest, FirstWholeMatchWinsAndGroupsAreSubstituted) {
  // A Flax-style tree to Hugging Face names; the second rule would also match the first's names.
  NameRules rules = MustCompile({
      {R"(params\.layers_(\d+)\.attn\.(q|k|v)\.kernel)", R"(model.layers.\1.self_attn.\2_proj.weight)"},
      {R"(params\.(.*))", R"(model.\g<1>)"},
      {R"(opt_state\..*)", ""},
      {R"(x\\y)", R"(a\\b\g<0>)"},
  });
  EXPECT_FALSE(rules.empty());
  EXPECT_EQ(MapOrDie(rules, "params.layers_12.attn.k.kernel"), "model.layers.12.self_attn.k_proj.weight");
  EXPECT_EQ(MapOrDie(rules, "params.embed"), "model.embed");
  EXPECT_EQ(MapOrDie(rules, "opt_state.mu.params.embed"), std::nullopt) << "an empty replacement drops the tensor";
  EXPECT_EQ(MapOrDie(rules, "x\\y"), "a\\bx\\y") << "\\\\ is one backslash, \\g<0> the whole name";
  // Patterns match whole names only: "params.embed.extra" is matched by rule 2 as a whole, "my.params.embed" by none.
  EXPECT_EQ(MapOrDie(rules, "my.params.embed"), "my.params.embed");
  EXPECT_EQ(MapOrDie(rules, "params.layers_1.attn.q.kernel.bias"), "model.layers_1.attn.q.kernel.bias");
}

TEST(NameRulesTest, AnUnmatchedOptionalGroupIsEmpty) {
  NameRules rules = MustCompile({{R"(w(\d+)?\.(.*))", R"(\2.\1)"}});
  EXPECT_EQ(MapOrDie(rules, "w3.kernel"), "kernel.3");
  EXPECT_EQ(MapOrDie(rules, "w.kernel"), "kernel.");
}

TEST(NameRulesTest, BadRulesAreRefusedWhenCompiled) {
  ExpectInvalid(NameRules::Compile({{"ok", "fine"}, {"(unclosed", "x"}}).status(),
                {"rule 2", "'(unclosed'", "not a valid ECMAScript regular expression"});
  ExpectInvalid(NameRules::Compile({{"a(b)", R"(\2)"}}).status(), {"rule 1", "group 2", "has 1 group"});
  ExpectInvalid(NameRules::Compile({{"a(b)", R"(\g<7>)"}}).status(), {"group 7"});
  ExpectInvalid(NameRules::Compile({{"a", R"(\g<name>)"}}).status(), {"\\g<...>", "named"});
  ExpectInvalid(NameRules::Compile({{"a", R"(\n)"}}).status(), {"unknown escape '\\n'"});
  ExpectInvalid(NameRules::Compile({{"a", "x\\"}}).status(), {"lone backslash"});
  ExpectInvalid(NameRules::Compile({{"", "x"}}).status(), {"pattern is empty"});
}

TEST(NameRulesTest, EmptyAndReservedResultsNameTheTensor) {
  NameRules rules = MustCompile({{"(a*)", R"(\1)"}, {"meta", "__metadata__"}});
  ExpectInvalid(rules.Map("").status(), {"to an empty name", "rule 1"});
  ExpectInvalid(rules.Map("meta").status(), {"'meta'", "__metadata__", "rule 2"});
  ExpectInvalid(NameRules().Map("__metadata__").status(), {"'__metadata__'", "reserves"});
}

TEST(NameRulesTest, CollisionsNameBothTensorsAndTheirRules) {
  NameRules rules = MustCompile({{R"(layer\.(\d+)\.w)", R"(w\1)"}, {R"(old\.(.*))", R"(\1)"}});
  auto all = rules.MapAll({"layer.0.w", "layer.1.w", "old.w1", "keep"});
  ExpectInvalid(all.status(), {"'w1'", "'layer.1.w'", "'old.w1'", "rule 1", "rule 2"});
  // A renamed tensor onto a name kept as it is.
  all = rules.MapAll({"old.keep", "keep"});
  ExpectInvalid(all.status(), {"'keep'", "'old.keep'", "kept by no rule"});
  // Dropped tensors collide with nothing.
  NameRules drop = MustCompile({{"a|b", ""}});
  auto ok = drop.MapAll({"a", "b", "c"});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, (std::vector<std::optional<std::string>>{std::nullopt, std::nullopt, std::string("c")}));
}

}  // namespace
}  // namespace distckpt
