#!/usr/bin/env bash
# Runs the crash-consistency suite (crash_test.cc) with the Go CLI, so that `distckpt ls` and `distckpt prune` are
# checked on what every killed save leaves behind. From scripts/test.sh; by hand:
#   tests/crash/run.sh                          # CI size (24 trials)
#   DCKPT_CRASH_TRIALS=240 DCKPT_RACE_ROUNDS=10 tests/crash/run.sh   # the long run
# Also the incremental checkpoints' property test (incremental_property_test.cc: DCKPT_INCREMENTAL_SEQUENCES, default
# 200). Ends with "crash: N passed, M failed" (one per test target).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(scripts/build_lib.sh) || { echo "crash: 0 passed, 1 failed (scripts/build_lib.sh)"; exit 1; }
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT
if ! (cd go/cmd/distckpt && PKG_CONFIG_PATH="$root/lib/pkgconfig" GOPROXY=off GOFLAGS=-buildvcs=false \
      go build -o "$work/distckpt" .); then
  echo "crash: 0 passed, 1 failed (building the Go CLI)"
  exit 1
fi
log=$work/bazel.log
bazel test //tests/crash:crash_test //tests/crash:incremental_property_test --test_output=all \
  --test_env=DCKPT_CLI="$work/distckpt" --test_env=DCKPT_CRASH_TRIALS --test_env=DCKPT_CRASH_SEED \
  --test_env=DCKPT_RACE_ROUNDS --test_env=DCKPT_INCREMENTAL_SEQUENCES --test_env=DCKPT_INCREMENTAL_SEED \
  --test_timeout=3600 --test_summary=short >"$log" 2>&1
rc=$?
grep -E "crash suite|crash sweep|listings|incremental property|^  +[0-9]+  |Failure|trial [0-9]+|sequence [0-9]+|^  [a-z]|PASSED|FAILED|ERROR" \
  "$log" | grep -v linux-sandbox
source scripts/bazel_tally.sh
bazel_tally "$log" "$rc" >/dev/null
passed=$BAZEL_PASSED failed=$BAZEL_FAILED
echo "crash: $passed passed, $failed failed"
exit $rc
