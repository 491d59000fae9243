# Sourced by scripts/test.sh and scripts/sanitize.sh.
# bazel_tally LOG RC: prints the target lines of a `bazel test --test_summary=short` log and sets BAZEL_PASSED and
# BAZEL_FAILED to its counts of passed and failed targets; a run that failed (exit RC) before any target failed, e.g.
# in the build, counts as one failed target and prints the end of the log.
bazel_tally() {
  local log=$1 rc=$2
  grep -E "^//|Executed|ERROR|error:" "$log" | grep -v linux-sandbox
  BAZEL_PASSED=$(grep -cE "^//\S+\s+(\(cached\) )?PASSED" "$log" || true)
  BAZEL_FAILED=$(grep -cE "^//\S+\s+(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)" "$log" || true)
  if [[ $rc -ne 0 && $BAZEL_FAILED -eq 0 ]]; then
    echo "bazel test failed (exit $rc) before running tests:"
    grep -v linux-sandbox "$log" | tail -30
    BAZEL_FAILED=1
  fi
}
