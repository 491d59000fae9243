#!/usr/bin/env bash
# Runs the whole C++ suite under a sanitizer: every Bazel test target (//...) plus the ones tagged manual (the
# crash-consistency suite), with --config=asan (AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer) or
# --config=tsan (ThreadSanitizer); see .bazelrc. Any report fails its test, in the test or in a rank it spawned.
#   scripts/sanitize.sh [asan|tsan|all]      (default: all)
# BAZEL_OUTPUT_BASE, if set, is passed to bazel as --output_base. The crash suite checks the Go CLI too where
# DCKPT_CLI names one (tests/crash/run.sh builds it); without it those checks are skipped.
# Prints "sanitize <config>: N passed, M failed" for each and exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/bazel_tally.sh

case "${1:-all}" in
  asan | tsan) configs=("$1") ;;
  all) configs=(asan tsan) ;;
  *)
    echo "usage: $0 [asan|tsan|all]" >&2
    exit 64
    ;;
esac

startup=()
[[ -n "${BAZEL_OUTPUT_BASE:-}" ]] && startup=(--output_base="$BAZEL_OUTPUT_BASE")
log=$(mktemp) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -f "$log"' EXIT

# Test targets that //... leaves out.
manual=$(bazel "${startup[@]}" query 'attr(tags, "\bmanual\b", tests(//...))' 2>/dev/null)

status=0
for config in "${configs[@]}"; do
  echo "== bazel test --config=$config //... $(echo $manual)"
  start=$SECONDS
  # shellcheck disable=SC2086  # $manual is a list of labels
  bazel "${startup[@]}" test --config="$config" --test_summary=short --test_env=DCKPT_CLI -- //... $manual >"$log" 2>&1
  rc=$?
  bazel_tally "$log" "$rc"
  p=$BAZEL_PASSED
  f=$BAZEL_FAILED
  echo "sanitize $config: $p passed, $f failed ($((SECONDS - start)) s)"
  [[ $f -eq 0 ]] || status=1
done
exit $status
