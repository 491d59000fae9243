#!/usr/bin/env bash
# The GPU kit end to end on this machine (no GPU): scripts/gpu_kit.sh builds the kit, which is packed, unpacked in a
# fresh directory and checked there by its own gpu_check.sh with the host copy engine standing in for CUDA
# (DCKPT_TEST_CUDA_ON_HOST=1) and no usable Bazel (a `bazel` first on PATH that records any call and fails). What
# does not need a GPU must pass, and what needs one must skip, saying why. The check installs the kit's wheel for
# this Python instead of compiling the binding. Uses the repository's .venv (made by
# python/run_tests.sh; torch, numpy, pybind11) as the machine's Python, or PYTHON. Ends with "gpu kit: N passed,
# M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
py=${PYTHON:-$repo/.venv/bin/python}
passed=0
failed=0
# check STATUS NAME: the status comes first, taken before NAME is expanded (a command substitution in NAME would
# otherwise set $? itself).
check() { if [[ $1 -eq 0 ]]; then passed=$((passed + 1)); echo "ok   $2"; else failed=$((failed + 1)); echo "FAIL $2"; fi; }
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT

if [[ ! -x $py ]]; then
  echo "gpu kit: $py is missing (python/run_tests.sh makes .venv)"
  echo "gpu kit: 0 passed, 1 failed"
  exit 1
fi
"$py" -c "import pybind11" 2>/dev/null || "$py" -m pip install -q --disable-pip-version-check pybind11 >/dev/null 2>&1

t=$(date +%s)
scripts/gpu_kit.sh "$work/kit" > "$work/kit.log" 2>&1
rc=$?
check $rc "scripts/gpu_kit.sh builds the kit ($(tail -1 "$work/kit.log"))"
size_kib=$(du -sk "$work/kit" | cut -f1)
# The device tool carries 64 MiB in all: the kit leaves at least 24 MiB of it for the peers' wheels a GPU session
# brings (it grew past 32 MiB when zstd came into every binary of both architectures: 34.7 MiB).
[[ $size_kib -lt $((40 * 1024)) ]]
rc=$?
check $rc "the kit is under 40 MiB, well under the 64 MiB a device call carries (${size_kib} KiB)"

# The Rust examples are in it, linked statically: nothing of ours (no libdistckpt) needed beside them.
[[ -x $work/kit/bin/gpu_load && -x $work/kit/bin/digest ]] && ! readelf -d "$work/kit/bin/gpu_load" | grep -q distckpt
rc=$?
check $rc "bin/gpu_load and bin/digest (rust/distckpt/examples) are in the kit, linked statically"

# Packed and unpacked elsewhere, as it travels to a GPU machine; the build tree is then out of reach.
tar -C "$work/kit" -czf "$work/kit.tgz" .
mkdir -p "$work/gpu/kit" "$work/bin"
tar -C "$work/gpu/kit" -xzf "$work/kit.tgz"
rm -rf "$work/kit"
printf '#!/bin/sh\necho "bazel $*" >> %s/bazel-calls\nexit 1\n' "$work" > "$work/bin/bazel"
chmod +x "$work/bin/bazel"

(cd "$work/gpu" && env -u LD_LIBRARY_PATH -u PYTHONPATH DCKPT_TEST_CUDA_ON_HOST=1 PATH="$work/bin:$PATH" PYTHON="$py" \
  GPU_BENCH_GIB=0.0625 bash kit/gpu_check.sh "$work/gpu/results" > "$work/check.log" 2>&1)
rc=$?
tail -30 "$work/check.log"
secs=$(($(date +%s) - t))
last=$(tail -1 "$work/check.log")
[[ $rc -eq 0 && $last =~ ^gpu_check:\ [1-9][0-9]*\ passed,\ 0\ failed,\ [0-9]+\ skipped$ ]]
rc=$?
check $rc "gpu_check.sh passes without a GPU and ends with its counts ($last; kit + check ${secs}s)"
[[ ! -e $work/bazel-calls ]]
rc=$?
check $rc "no Bazel was called ($(cat "$work/bazel-calls" 2>/dev/null | head -1))"
res="$work/gpu/results"
[[ -s $res/results.md && -s $res/results.json && -s $res/pytest.xml && -s $res/gpu_cases.xml && -s $res/nccl_test.xml ]]
rc=$?
check $rc "results.md, results.json and each suite's report are written"
"$py" - "$res/results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps = {s["step"]: s for s in r["steps"]}
need = ["library loads", "install wheel", "golden checkpoints verify", "device tests (pytest)", "gpu cases (pytest)",
        "nccl_test", "nccl_gloo_test", "gpu benchmark", "rust gpu_load"]
missing = [n for n in need if n not in steps]
assert not missing, f"steps missing: {missing}"
assert steps["library loads"]["passed"] == 1 and steps["install wheel"]["passed"] == 1, steps
# The kit's wheel for this Python (the repository's .venv: CPython 3.11) is installed, not the binding compiled.
assert "-cp311-cp311-manylinux_2_28_x86_64.whl" in steps["install wheel"]["note"], steps["install wheel"]
# The emulated device path runs (passes) here; the real-GPU cases skip with a reason.
assert steps["device tests (pytest)"]["passed"] >= 5, steps["device tests (pytest)"]
assert "no GPU" in steps["device tests (pytest)"]["note"] or "not installed" in steps["device tests (pytest)"]["note"]
# Every GPU case needs a real GPU: all of them skip here, none fails, and the reason names the missing GPU.
cases = steps["gpu cases (pytest)"]
assert cases["passed"] == 0 and cases["failed"] == 0 and cases["skipped"] >= 30, cases
assert "no GPU" in cases["note"], cases
assert steps["nccl_test"]["passed"] >= 1, steps["nccl_test"]
assert r["benchmark"].get("skipped"), r["benchmark"]
# The Rust load needs a GPU (rust/run_tests.sh runs it against the fake driver): skipped here, saying so.
assert steps["rust gpu_load"]["skipped"] == 1 and "no GPU" in steps["rust gpu_load"]["note"], steps["rust gpu_load"]
assert r["failed"] == 0
PY
rc=$?
check $rc "each step ran: emulated device tests passed, GPU-only cases (and every GPU case) and the benchmark skipped saying why"
grep -q "SKIPPED" "$res/logs/pytest.log" && grep -q "no GPU" "$res/logs/pytest.log" &&
  grep -q "SKIPPED" "$res/logs/gpu_cases.log" && grep -q "no GPU" "$res/logs/gpu_cases.log"
rc=$?
check $rc "pytest's skip reasons name the missing GPU (device tests and GPU cases)"

echo "gpu kit: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
