#!/usr/bin/env bash
# Runs every test suite of distckpt from a fresh clone on Debian 12: installs what is missing, then Bazel (C++ core,
# C ABI, multi-process and multi-host tests; then all of them again under ASan + UBSan: a "bazel asan: ..." line;
# then `bazel build --config=cuda //...` where the CUDA toolkit is installed),
# pytest (python/), cargo (rust/) and go (go/). Each language suite has its own runner (<lang>/run_tests.sh) that sets
# up its toolchain and prints a "N passed, M failed" line (rust and go also build a consumer crate/module outside
# the repository, as their READMEs tell a user to); then a C program built the same way (tests/consumers/c), the
# cross-language check (tests/crosslang/run.sh), the portable library, the wheels, the sdist and the prebuilt install,
# the CMake consumer, Debian 11 and AArch64 under qemu (tests/packaging/, tests/consumers/cmake; docs/install.md),
# the GPU kit run without a GPU (tests/gpu_kit/run.sh), and
# the crash-consistency suite with the Go CLI (tests/crash/run.sh), then a short smoke of every fuzz target
# (scripts/fuzz.sh, FUZZ_SMOKE_SECONDS each, default 15): one "fuzz <target>: N passed, M failed" line per target, a
# missing clang-14 or atheris counting as a failure.
# Ends with one line for everything: "tests: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh || exit 1

# What the suites build is kept outside the checkout, under ~/.cache/distckpt (docs/install.md): Bazel's disk cache
# (.bazelrc), zig, the Debian roots, wheelhouses, venvs, ccache. Bazel's disk cache has no size limit of its own: files
# not read for two weeks go, and the oldest-read ones while it holds more than 40 GiB.
disk_cache=${DISTCKPT_CACHE:-$HOME/.cache/distckpt}/bazel-disk
if [[ -d $disk_cache ]]; then
  find "$disk_cache" -type f -atime +14 -delete 2>/dev/null
  if (($(du -sk "$disk_cache" | cut -f1) > 40 * 1024 * 1024)); then
    find "$disk_cache" -type f -printf '%A@ %s %p\n' | sort -n |
      awk -v over=$(($(du -sk "$disk_cache" | cut -f1) * 1024 - 30 * 1024 * 1024 * 1024)) \
        '{ if (freed < over) { print $3; freed += $2 } }' | xargs -r rm -f
  fi
fi

passed=0
failed=0
failures=()  # "SUITE: line" for each failing test a suite's log names, printed again at the end
log=$(mktemp) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -f "$log"' EXIT

count() {  # adds the last "N passed" / "M failed" figures of a log to the totals
  local line p f
  line=$(grep -E "[0-9]+ passed" "$1" | tail -1)
  p=$(echo "$line" | grep -oE "[0-9]+ passed" | grep -oE "[0-9]+" || echo 0)
  f=$(echo "$line" | grep -oE "[0-9]+ failed" | grep -oE "[0-9]+" || echo 0)
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-0}))
}

source scripts/bazel_tally.sh

# note_failures SUITE: keeps the lines of the log that name a failed test (pytest, cargo, go test, gtest, bazel and the
# shell suites' "FAIL" lines), at most 20 a suite, so that the end of the output says what failed.
note_failures() {
  local line
  while IFS= read -r line; do
    failures+=("$1: ${line:0:300}")
  done < <(grep -E "^(FAILED |FAIL |--- FAIL|ERROR |\[  FAILED  \] [A-Za-z])|^test .* FAILED$|^//\S+\s+(FAILED|TIMEOUT|NO STATUS|INCOMPLETE)" \
    "$log" | head -20)
}

# bazel_suite NAME ARGS...: bazel test ARGS; prints the targets and "NAME: N passed, M failed", added to the totals.
bazel_suite() {
  local name=$1 rc
  shift
  echo "== bazel test $*"
  bazel test "$@" --test_summary=short >"$log" 2>&1
  rc=$?
  bazel_tally "$log" "$rc"
  local p=$BAZEL_PASSED f=$BAZEL_FAILED
  echo "$name: $p passed, $f failed"
  ((f == 0)) || note_failures "$name"
  passed=$((passed + p))
  failed=$((failed + f))
}

# The code's formatting, in check mode (nothing is rewritten): C++ here, rustfmt and the Python linter in their
# language runners below.
echo "== scripts/format_check.sh"
if bash scripts/format_check.sh >"$log" 2>&1; then
  tail -1 "$log"
  echo "format check: 1 passed, 0 failed"
  passed=$((passed + 1))
else
  cat "$log"
  echo "format check: 0 passed, 1 failed"
  failures+=("format check: scripts/format_check.sh")
  failed=$((failed + 1))
fi

bazel_suite bazel //...
# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer (.bazelrc; its outputs sit
# beside the normal build's). ThreadSanitizer and the manual crash suite under both: scripts/sanitize.sh.
bazel_suite "bazel asan" --config=asan //...

# The CUDA build (--config=cuda: the NCCL communicator, the CUDA driver table checked against cuda.h) must keep
# compiling where the toolkit is installed. Its GPU tests need a GPU (the device tool), so here it is built, not run.
if [[ -f /usr/local/cuda/include/cuda.h ]]; then
  echo "== bazel build --config=cuda //..."
  if bazel build --config=cuda //... >"$log" 2>&1; then
    echo "bazel cuda build: 1 passed, 0 failed"
    passed=$((passed + 1))
  else
    grep -E "error|ERROR" "$log" | head -30
    echo "bazel cuda build: 0 passed, 1 failed"
    failures+=("bazel cuda build: bazel build --config=cuda //...")
    failed=$((failed + 1))
  fi
else
  echo "bazel cuda build: skipped (no CUDA toolkit at /usr/local/cuda)"
fi

# The cross-language check runs last: it uses the toolchains the language runners set up.
for runner in python/run_tests.sh rust/run_tests.sh go/run_tests.sh tests/consumers/c/run.sh \
  tests/consumers/cmake/run.sh tests/crosslang/run.sh tests/packaging/portable_lib.sh tests/packaging/venvs.sh \
  tests/packaging/debian11.sh tests/packaging/aarch64.sh tests/gpu_kit/run.sh tests/crash/run.sh; do
  [[ -f "$runner" ]] || continue
  echo "== $runner"
  bash "$runner" >"$log" 2>&1
  rc=$?
  tail -25 "$log"
  before=$failed
  count "$log"
  if [[ $rc -ne 0 && $failed -eq $before ]]; then failed=$((failed + 1)); fi
  if ((failed != before)); then
    note_failures "$runner"
    failures+=("$runner: exit $rc, $((failed - before)) failed (its last lines are above)")
  fi
done

echo "== scripts/fuzz.sh ${FUZZ_SMOKE_SECONDS:-15}"
bash scripts/fuzz.sh "${FUZZ_SMOKE_SECONDS:-15}" >"$log" 2>&1
rc=$?
tail -40 "$log"
p=$(grep -E "^fuzz [a-z_]+: [0-9]+ passed" "$log" | grep -oE "[0-9]+ passed" | awk '{s += $1} END {print s + 0}')
f=$(grep -E "^fuzz [a-z_]+: [0-9]+ passed" "$log" | grep -oE "[0-9]+ failed" | awk '{s += $1} END {print s + 0}')
if [[ $rc -ne 0 && $f -eq 0 ]]; then f=1; fi
echo "fuzz: $p passed, $f failed"
((f == 0)) || failures+=("fuzz: $(grep -E "^fuzz [a-z_]+: [0-9]+ passed, [1-9]" "$log" | tr '\n' ' ')")
passed=$((passed + p))
failed=$((failed + f))

if ((${#failures[@]})); then
  echo "== what failed"
  printf '%s\n' "${failures[@]}"
fi
echo "tests: ${passed} passed, ${failed} failed"
[[ $failed -eq 0 ]]
