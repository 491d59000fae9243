#!/usr/bin/env bash
# Checks the C and C++ files under core/, capi/ and bindings/ against the repository's .clang-format (Google style,
# 120 columns) with clang-format in check mode; lists every file that would change and exits 1 if any would.
#
# Not the whole tree yet: the code written before .clang-format existed does not all follow it, and reformatting it
# at once would touch 68 files. Those are listed in scripts/format_exclude.txt and skipped; every other file,
# and so every new one, is checked. Format a listed file (clang-format -i FILE) when you next change it, and take it
# off the list. capi/include/distckpt/distckpt.h stays listed: the public C header is changed only on purpose.
#
#   scripts/format_check.sh            check
#   scripts/format_check.sh --fix      reformat the checked files that differ instead (same file list)
# CLANG_FORMAT=clang-format-14 picks the binary (default: clang-format; the .clang-format was written for 14).
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format="${CLANG_FORMAT:-clang-format}"
command -v "$clang_format" >/dev/null || { echo "format_check.sh: $clang_format not found (apt-get install clang-format)" >&2; exit 2; }
fix=0
[[ ${1:-} == --fix ]] && fix=1

excluded=$(grep -v '^\s*\(#\|$\)' scripts/format_exclude.txt || true)
mapfile -t files < <(git ls-files -- 'core/*.c' 'core/*.cc' 'core/*.h' 'capi/*.c' 'capi/*.cc' 'capi/*.h' \
  'bindings/*.c' 'bindings/*.cc' 'bindings/*.h' | grep -vxF -f <(printf '%s\n' "$excluded") || true)

bad=()
for f in "${files[@]}"; do
  if ! "$clang_format" --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]} == 0)); then
  echo "format_check.sh: ${#files[@]} files follow .clang-format"
  exit 0
fi
if ((fix)); then
  "$clang_format" -i "${bad[@]}"
  printf 'reformatted %s\n' "${bad[@]}"
  exit 0
fi
echo "format_check.sh: ${#bad[@]} of ${#files[@]} files differ from .clang-format (fix: $clang_format -i FILE):" >&2
printf '  %s\n' "${bad[@]}" >&2
exit 1
