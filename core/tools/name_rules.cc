#include "core/tools/name_rules.h"

#include <map>
#include <regex>

namespace distckpt {

// A replacement is kept as pieces: literal text, or a group number (literal empty).
struct NameRules::Compiled {
  NameRule rule;
  std::regex re;
  struct Piece {
    std::string literal;
    size_t group = 0;
    bool is_group = false;
  };
  std::vector<Piece> pieces;
};

namespace {

std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

std::string RuleText(size_t index, const NameRule& r) {
  return "rule " + std::to_string(index + 1) + " (" + Quote(r.pattern) + " -> " + Quote(r.replacement) + ")";
}

}  // namespace

NameRules::NameRules() = default;
NameRules::~NameRules() = default;
NameRules::NameRules(NameRules&&) noexcept = default;
NameRules& NameRules::operator=(NameRules&&) noexcept = default;

bool NameRules::empty() const { return rules_.empty(); }

std::string NameRules::Describe(size_t index) const {
  return index < rules_.size() ? RuleText(index, rules_[index]->rule) : "no rule";
}

Result<NameRules> NameRules::Compile(const std::vector<NameRule>& rules) {
  NameRules out;
  for (size_t i = 0; i < rules.size(); ++i) {
    auto c = std::make_unique<Compiled>();
    c->rule = rules[i];
    const std::string where = "rename " + RuleText(i, rules[i]);
    if (rules[i].pattern.empty()) return InvalidArgument(where + ": the pattern is empty");
    try {
      c->re = std::regex(rules[i].pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return InvalidArgument(where + ": the pattern is not a valid ECMAScript regular expression (" + e.what() + ")");
    }
    const size_t groups = c->re.mark_count();
    const std::string& r = rules[i].replacement;
    std::string literal;
    auto add_group = [&](size_t g) -> Status {
      if (g > groups) {
        return InvalidArgument(where + ": the replacement refers to group " + std::to_string(g) +
                               ", but the pattern has " + std::to_string(groups) +
                               (groups == 1 ? " group" : " groups"));
      }
      if (!literal.empty()) c->pieces.push_back({std::move(literal), 0, false});
      literal.clear();
      c->pieces.push_back({"", g, true});
      return OkStatus();
    };
    for (size_t k = 0; k < r.size(); ++k) {
      if (r[k] != '\\') {
        literal.push_back(r[k]);
        continue;
      }
      if (k + 1 >= r.size()) return InvalidArgument(where + ": the replacement ends with a lone backslash");
      const char n = r[k + 1];
      if (n == '\\') {
        literal.push_back('\\');
        ++k;
      } else if (n >= '1' && n <= '9') {
        DCKPT_RETURN_IF_ERROR(add_group(static_cast<size_t>(n - '0')));
        ++k;
      } else if (n == 'g' && k + 2 < r.size() && r[k + 2] == '<') {
        const size_t close = r.find('>', k + 3);
        const std::string digits = close == std::string::npos ? "" : r.substr(k + 3, close - (k + 3));
        if (digits.empty() || digits.size() > 4 || digits.find_first_not_of("0123456789") != std::string::npos) {
          return InvalidArgument(where + ": \\g<...> in the replacement needs a group number, e.g. \\g<1> (named " +
                                 "groups are not part of ECMAScript regular expressions)");
        }
        DCKPT_RETURN_IF_ERROR(add_group(static_cast<size_t>(std::stoul(digits))));
        k = close;
      } else {
        return InvalidArgument(where + ": unknown escape '\\" + std::string(1, n) +
                               "' in the replacement (use \\1..\\9 or \\g<N> for groups, \\\\ for a backslash)");
      }
    }
    if (!literal.empty()) c->pieces.push_back({std::move(literal), 0, false});
    out.rules_.push_back(std::move(c));
  }
  return out;
}

size_t NameRules::Find(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (std::regex_match(name.begin(), name.end(), rules_[i]->re)) return i;
  }
  return std::string::npos;
}

Result<std::optional<std::string>> NameRules::Map(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    const Compiled& c = *rules_[i];
    std::match_results<std::string_view::const_iterator> m;
    if (!std::regex_match(name.begin(), name.end(), m, c.re)) continue;
    if (c.rule.replacement.empty()) return std::optional<std::string>();  // dropped
    std::string out;
    for (const Compiled::Piece& p : c.pieces) {
      if (!p.is_group) {
        out += p.literal;
      } else if (m[p.group].matched) {
        out.append(m[p.group].first, m[p.group].second);
      }
    }
    if (out.empty()) {
      return InvalidArgument("rename " + RuleText(i, c.rule) + " maps tensor " + Quote(name) +
                             " to an empty name; to leave tensors out, give a rule whose replacement is empty");
    }
    if (out == "__metadata__") {
      return InvalidArgument("rename " + RuleText(i, c.rule) + " maps tensor " + Quote(name) +
                             " to '__metadata__', the name safetensors reserves for the file's metadata");
    }
    return std::optional<std::string>(std::move(out));
  }
  if (name == "__metadata__") {
    return InvalidArgument(
        "tensor '__metadata__' has the name safetensors reserves for the file's metadata; rename it "
        "with a rule");
  }
  return std::optional<std::string>(std::string(name));
}

Result<std::vector<std::optional<std::string>>> NameRules::MapAll(const std::vector<std::string>& names) const {
  std::vector<std::optional<std::string>> out;
  out.reserve(names.size());
  std::map<std::string_view, size_t> owner;  // new name -> position in `names`
  for (size_t i = 0; i < names.size(); ++i) {
    DCKPT_ASSIGN_OR_RETURN(std::optional<std::string> mapped, Map(names[i]));
    out.push_back(std::move(mapped));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (!out[i]) continue;
    auto [it, inserted] = owner.emplace(*out[i], i);
    if (inserted) continue;
    const size_t j = it->second;
    auto how = [&](size_t k) {
      const size_t rule = Find(names[k]);
      return rule == std::string::npos ? std::string("kept by no rule") : "by " + Describe(rule);
    };
    return InvalidArgument("rename rules map two tensors to the name " + Quote(*out[i]) + ": " + Quote(names[j]) +
                           " (" + how(j) + ") and " + Quote(names[i]) + " (" + how(i) +
                           "); change the rules so that every exported name is unique");
  }
  return out;
}

}  // namespace distckpt
