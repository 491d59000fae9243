// Name rules: an ordered list of (pattern, replacement) pairs that rename or drop tensors on their way out of a
// checkpoint (the safetensors exporter, dckpt_export_options.rename_rules). One implementation, in the core, for
// every client: Python, Go and Rust pass the rules through the C ABI and never rewrite names themselves.
//
// The syntax (normative; capi/API.md "Export to the Hugging Face hub" repeats it for users):
//  - A pattern is an ECMAScript regular expression (the grammar of std::regex and JavaScript, which for the usual
//    constructs -- ., \d, [..], (..), (?:..), |, *, +, ?, {m,n} -- is also Python's `re`). It must match the WHOLE
//    name (as Python's re.fullmatch does); a pattern that matches only part of a name does not apply.
//  - Rules are tried in order; the first whose pattern matches decides. A name no rule matches is kept as it is.
//  - A replacement is literal text with group references: \1 ... \9, or \g<N> for any group number N (\g<0> is the
//    whole name), and \\ for one backslash. Any other backslash, and a reference to a group the pattern does not
//    have, is an error when the rules are compiled. (Named groups are not part of ECMAScript regular expressions.)
//  - An EMPTY replacement drops the tensors its pattern matches (e.g. ("optimizer\..*", "") leaves the optimizer
//    state out of an export). A non-empty replacement that yields an empty name is an error naming the tensor.
//  - A rule that maps a tensor to "__metadata__" (the name safetensors reserves) is an error, and so are two tensors
//    mapped to one name (MapAll names both, and the rules that did it).
#ifndef DISTCKPT_CORE_TOOLS_NAME_RULES_H_
#define DISTCKPT_CORE_TOOLS_NAME_RULES_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace distckpt {

/// One rule as the user writes it.
struct NameRule {
  std::string pattern;
  std::string replacement;  ///< empty: drop the matching tensors
};

/// Compiled name rules. Immutable once compiled, so several threads may Map through one at once.
class NameRules {
 public:
  /// The identity (no rules).
  NameRules();
  ~NameRules();
  NameRules(NameRules&&) noexcept;
  NameRules& operator=(NameRules&&) noexcept;

  /// Compiles `rules`; kInvalidArgument naming the rule (its number, from 1, and its text) for a pattern that is not
  /// a valid regular expression or a replacement with a bad escape or a group the pattern lacks.
  static Result<NameRules> Compile(const std::vector<NameRule>& rules);

  bool empty() const;

  /// The name `name` gets: the first matching rule's replacement, `name` itself where no rule matches, or nullopt
  /// where the rule drops it. kInvalidArgument for an empty or reserved result, naming the name and the rule.
  Result<std::optional<std::string>> Map(std::string_view name) const;

  /// Maps every name of `names` and checks that no two of them end up with one name. Returns the new names, by
  /// position (nullopt: dropped). A collision is kInvalidArgument naming both tensors, the name and the rules used.
  Result<std::vector<std::optional<std::string>>> MapAll(const std::vector<std::string>& names) const;

  /// "rule N ('PATTERN' -> 'REPLACEMENT')", for messages; "no rule" when `index` is out of range.
  std::string Describe(size_t index) const;

 private:
  struct Compiled;
  /// The rule that decides `name` (its index), or npos.
  size_t Find(std::string_view name) const;
  std::vector<std::unique_ptr<Compiled>> rules_;
};

}  // namespace distckpt

#endif  // DISTCKPT_CORE_TOOLS_NAME_RULES_H_
