#!/usr/bin/env bash
# Runs every test suite of distckpt from a fresh clone on Debian 12: installs what is missing, then Bazel (C++ core,
# C ABI, multi-process tests), and the language suites as they exist (pytest, cargo, go). Ends with a line
# "tests: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh || exit 1

passed=0
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== bazel test //..."
bazel test //... --test_summary=short 2>&1 | tee "$log" | grep -vE "linux-sandbox|^\s*$" | grep -E "PASSED|FAILED|TIMEOUT|NO STATUS|ERROR|error:|Executed|^//" || true
bazel_rc=${PIPESTATUS[0]}
p=$(grep -cE "^//\S+\s+(\(cached\) )?PASSED" "$log" || true)
f=$(grep -cE "^//\S+\s+(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)" "$log" || true)
passed=$((passed + p))
failed=$((failed + f))
if [[ $bazel_rc -ne 0 && $f -eq 0 ]]; then
  echo "bazel test failed (exit $bazel_rc) before running tests:"
  tail -30 "$log"
  failed=$((failed + 1))
fi

echo "tests: ${passed} passed, ${failed} failed"
[[ $failed -eq 0 ]]
