#!/usr/bin/env bash
# Runs the crash-consistency suite (crash_test.cc) with the Go CLI, so that `distckpt ls` and `distckpt prune` are
# checked on what every killed save leaves behind. From scripts/test.sh; by hand:
#   tests/crash/run.sh                          # CI size (24 trials)
#   DCKPT_CRASH_TRIALS=240 DCKPT_RACE_ROUNDS=10 tests/crash/run.sh   # the long run
# Ends with "crash: N passed, M failed" (one test target).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(scripts/build_lib.sh) || { echo "crash: 0 passed, 1 failed (scripts/build_lib.sh)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! (cd go/cmd/distckpt && PKG_CONFIG_PATH="$root/lib/pkgconfig" GOPROXY=off GOFLAGS=-buildvcs=false \
      go build -o "$work/distckpt" .); then
  echo "crash: 0 passed, 1 failed (building the Go CLI)"
  exit 1
fi
bazel test //tests/crash:crash_test --test_output=all --test_env=DCKPT_CLI="$work/distckpt" \
  --test_env=DCKPT_CRASH_TRIALS --test_env=DCKPT_CRASH_SEED --test_env=DCKPT_RACE_ROUNDS --test_timeout=3600 2>&1 |
  grep -E "crash suite|crash sweep|listings|^  +[0-9]+  |Failure|trial [0-9]+|^  [a-z]|PASSED|FAILED|ERROR" | grep -v linux-sandbox
rc=${PIPESTATUS[0]}
if [[ $rc -eq 0 ]]; then echo "crash: 1 passed, 0 failed"; else echo "crash: 0 passed, 1 failed"; fi
exit $rc
