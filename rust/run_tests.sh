#!/usr/bin/env bash
# Runs the Rust suite from a fresh clone: builds libdistckpt.so (scripts/build_lib.sh, Bazel offline), points cargo
# at it, runs `cargo test --offline --workspace` (bindings staleness and C layout checks, the safe crate's unit and
# integration tests against tests/fixtures and tests/golden, the serve example compared with its reference), then
# shows the serve example's output. Exits with cargo's status. Last line: "rust: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")"

if ! root=$(../scripts/build_lib.sh); then
  echo "rust/run_tests.sh: building libdistckpt.so failed (scripts/build_lib.sh)" >&2
  echo "rust: 0 passed, 1 failed"
  exit 1
fi
export DISTCKPT_LIB_DIR="$root/lib"
export PKG_CONFIG_PATH="$root/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== cargo test --offline --workspace (libdistckpt.so from $DISTCKPT_LIB_DIR)"
cargo test --offline --workspace 2>&1 | tee "$log" | grep -E "^(test |running|test result|     Running|error|warning: unused)|SKIPPED|panicked" || true
rc=${PIPESTATUS[0]}

echo "== examples/serve.rs on tests/fixtures/mlp (tests/serve.rs compares it with reference.output)"
if ! cargo run --offline -q -p distckpt --example serve; then
  echo "rust/run_tests.sh: the serve example failed" >&2
  [[ $rc -eq 0 ]] && rc=1
fi

passed=$(grep -oE "test result: [a-zA-Z]+\. [0-9]+ passed" "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -oE "[0-9]+ failed;" "$log" | awk '{s += $1} END {print s + 0}')
if [[ $rc -ne 0 ]]; then
  sed -n '/^failures:$/,/^test result/p' "$log" | head -200
fi
if [[ $rc -ne 0 && $failed -eq 0 ]]; then
  failed=1 # cargo failed before running tests (a build error): count it
  tail -30 "$log"
fi
echo "rust: ${passed} passed, ${failed} failed"
exit "$rc"
