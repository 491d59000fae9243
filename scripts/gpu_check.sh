#!/usr/bin/env bash
# The GPU check: run from a kit that scripts/gpu_kit.sh laid out (it is the kit's gpu_check.sh), on a machine with a
# GPU, Python 3 with torch (and optionally CuPy and JAX), pip and a C++ compiler; no Bazel, no network:
#
#   bash KIT/gpu_check.sh RESULTS_DIR
#
# In one go, within 10 minutes (step 4's GPU cases have not been timed on a GPU yet; the rest took 2.5 on an H100):
#   1. the machine: GPU, driver, Python, torch, glibc; the kit's library for this machine (KIT for x86_64,
#      KIT/aarch64 for AArch64 hosts such as Grace Hopper) loads with its vendored dependencies only;
#   2. installs the kit's wheel for this machine and Python (KIT/dist: CPython 3.12 on x86_64, 3.11 on AArch64), or,
#      where none fits, builds the binding against this machine's python3 (setup.py with DISTCKPT_PREBUILT, no Bazel);
#   3. the device tests (python/tests/test_device.py): torch CUDA tensors, DTensor on a CUDA mesh, CuPy, JAX on GPU,
#      round trips, resharded loads into device memory, async saves while kernels change the tensors (with and
#      without device_snapshot), DCP's StorageReader loading into CUDA tensors; and the emulated device path;
#   4. the GPU cases (python/tests/test_gpu_cases.py, docs/gpu.md): stream ordering on four kinds of stream, no
#      current context (a fresh thread, a C caller, JAX), memory kinds and wrong declarations, a stuck stream with a
#      timeout, snapshots, a strided load, graph capture beside a save, NCCL at world size 1, two GPUs;
#   5. NCCL: the communicator's tests and conformance suite at the world size the GPUs allow (bin/nccl_test), and
#      NCCL bootstrapped over Gloo (bin/nccl_gloo_test);
#   6. the GPU benchmark (bench/gpu_bench.py; GPU_BENCH_GIB, default 4);
#   7. the Rust inference server's load (bin/gpu_load, rust/distckpt/examples/gpu_load.rs): a 1 GiB float16
#      checkpoint into CUDA memory through DeviceBuffer, every tensor read back and compared with bin/digest's host
#      digests; its GB/s in the step's note (x86_64 kits only).
# Writes RESULTS_DIR/results.md and results.json (plus each step's log and the JUnit/JSON files they made) and ends
# with one line: "gpu_check: N passed, M failed, K skipped". Exits non-zero if anything failed.
#
# Environment: PYTHON (default python3), GPU_BENCH_GIB, GPU_CHECK_STEP_TIMEOUT (seconds per step, default 240),
# GPU_CASES_TIMEOUT (seconds for step 4, default 420).
# Without a GPU (e.g. DCKPT_TEST_CUDA_ON_HOST=1 on a build machine) everything that needs one skips, saying why.
set -uo pipefail
[[ $# -eq 1 ]] || { echo "usage: bash gpu_check.sh RESULTS_DIR" >&2; exit 2; }
kit=$(cd "$(dirname "$0")" && pwd)
# The install tree for this machine: the kit's top for x86_64, KIT/<machine> for the others it carries.
machine=$(uname -m)
tree=$kit
[[ $machine == x86_64 ]] || tree=$kit/$machine
mkdir -p "$1/logs" || exit 2
out=$(cd "$1" && pwd)
py=${PYTHON:-python3}
step_timeout=${GPU_CHECK_STEP_TIMEOUT:-240}
work=$(mktemp -d "${TMPDIR:-/tmp}/distckpt-gpu-check.XXXXXX") || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT
t_start=$(date +%s)

passed=0 failed=0 skipped=0
steps_tsv="$out/steps.tsv"  # name, passed, failed, skipped, seconds, note
: > "$steps_tsv"

# record NAME PASSED FAILED SKIPPED SECONDS NOTE
record() {
  passed=$((passed + $2)) failed=$((failed + $3)) skipped=$((skipped + $4))
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${6//$'\t'/ }" >> "$steps_tsv"
  printf '== %-28s %3s passed %3s failed %3s skipped  %4ss  %s\n' "$1" "$2" "$3" "$4" "$5" "$6"
}

# run NAME LOG CMD...: runs CMD under the step timeout with its output in LOG; sets RC and SECS.
run() {
  local name=$1 log=$2 t
  shift 2
  t=$(date +%s)
  echo "-- $name: $*" > "$log"
  timeout --kill-after=10 "$step_timeout" "$@" >> "$log" 2>&1
  RC=$?
  SECS=$(($(date +%s) - t))
  if [[ $RC -eq 124 || $RC -eq 137 ]]; then echo "-- $name: timed out after ${step_timeout}s" >> "$log"; fi
}

# junit_counts FILE: "passed failed skipped" of a JUnit XML file (pytest's or googletest's)
junit_counts() {
  "$py" - "$1" <<'PY'
import sys, xml.etree.ElementTree as ET
p = f = s = 0
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0"); sys.exit()
for case in root.iter("testcase"):
    kids = {c.tag for c in case}
    if "failure" in kids or "error" in kids:
        f += 1
    elif "skipped" in kids or case.get("result") == "skipped" or case.get("status") == "notrun":
        s += 1
    else:
        p += 1
print(p, f, s)
PY
}

# ---- 1. the machine -----------------------------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -n), $(uname -sr), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); XXH3 build used:" \
    "$(if [[ $machine == aarch64 ]]; then echo neon; elif grep -qw avx512f /proc/cpuinfo; then echo avx512; elif grep -qw avx2 /proc/cpuinfo; then echo avx2; else echo sse2; fi)"
  if command -v nvidia-smi >/dev/null; then
    echo "gpus: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | paste -sd ';')"
  else
    echo "gpus: nvidia-smi not found"
  fi
  echo "python: $("$py" -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>&1)"
  "$py" - <<'PY' 2>&1
import importlib
for name in ("torch", "cupy", "jax", "numpy", "pytest", "pybind11", "safetensors", "ml_dtypes"):
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f" (cuda {m.version.cuda}, available {m.cuda.is_available()}, nccl " + (
                ".".join(map(str, m.cuda.nccl.version())) if m.cuda.is_available() else "-") + ")"
        print(f"{name}: {getattr(m, '__version__', '?')}{extra}")
    except Exception as e:
        print(f"{name}: not available ({type(e).__name__}: {str(e)[:80]})")
PY
  echo "fio: $(command -v fio || echo 'not installed')"
  echo "DCKPT_TEST_CUDA_ON_HOST: ${DCKPT_TEST_CUDA_ON_HOST:-unset}"
  echo "kit:"
  sed 's/^/  /' "$kit/KIT" 2>/dev/null
} > "$out/environment.txt"
cat "$out/environment.txt"
gpu_name=$(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

log="$out/logs/library.log"
t=$(date +%s)
{
  echo "ldd $tree/lib/libdistckpt.so:"
  env -u LD_LIBRARY_PATH ldd "$tree/lib/libdistckpt.so"
  echo "ldd $tree/lib/libdistckpt_gloo.so (the Gloo plugin, loaded on the first Gloo communicator):"
  env -u LD_LIBRARY_PATH ldd "$tree/lib/libdistckpt_gloo.so"
} > "$log" 2>&1
if [[ ! -f $tree/lib/libdistckpt.so ]]; then
  record "library loads" 0 1 0 0 "the kit has no library for this machine ($machine): it carries x86_64 and aarch64"
elif grep -q "not found" "$log"; then
  record "library loads" 0 1 0 $(($(date +%s) - t)) "a dependency is missing: $(grep 'not found' "$log" | head -3 | tr '\n' ' ')"
elif ! env -u LD_LIBRARY_PATH "$py" -c "
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.dckpt_version_string.restype = ctypes.c_char_p
print('dckpt_version', lib.dckpt_version_string().decode(), 'abi', lib.dckpt_abi_version())" "$tree/lib/libdistckpt.so" >> "$log" 2>&1; then
  record "library loads" 0 1 0 $(($(date +%s) - t)) "dlopen failed: $(tail -1 "$log")"
else
  outside=$(awk '/=>/ && $3 ~ /^\// {print $3}' "$log" | grep -v "/distckpt.libs/" |
    grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|ld-linux-aarch64)\.so' || true)
  if [[ -n $outside ]]; then
    record "library loads" 0 1 0 $(($(date +%s) - t)) "resolved outside the kit: $outside"
  else
    record "library loads" 1 0 0 $(($(date +%s) - t)) "$(grep dckpt_version "$log")"
  fi
fi

# ---- 2. the binding: the kit's wheel for this machine and Python, else built here ---------------------------------
site="$work/site"
log="$out/logs/build.log"
pytag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])' 2>/dev/null)
wheel=$(ls "$kit"/dist/distckpt-*-"$pytag"-"$pytag"-*_"$machine".whl 2>/dev/null | head -1)
if [[ -n $wheel ]]; then
  step="install wheel"
  run "$step" "$log" "$py" -m pip install --no-deps --no-index --disable-pip-version-check --target "$site" "$wheel"
else
  step="build binding"
  echo "-- no wheel in the kit for $pytag on $machine: building the binding" >> "$log"
  run "$step" "$log" env DISTCKPT_PREBUILT="$tree" "$py" -m pip install --no-build-isolation --no-deps \
    --no-index --disable-pip-version-check --target "$site" "$kit/python"
fi
if [[ $RC -ne 0 && -z $wheel ]]; then
  # pip or setuptools missing: compile the binding's sources (every bindings/*.cc) directly, as setup.py would.
  echo "-- pip failed (exit $RC); compiling directly" >> "$log"
  mkdir -p "$site"
  cp -R "$kit/python/distckpt" "$site/"
  cp "$tree/lib/libdistckpt.so" "$tree/lib/libdistckpt_gloo.so" "$site/distckpt/" &&
    cp -R "$tree/lib/distckpt.libs" "$site/distckpt/"
  inc=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  suffix=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  pyb=$("$py" -c "import pybind11; print(pybind11.get_include())" 2>/dev/null || echo /usr/include)
  t=$(date +%s)
  ${CXX:-c++} -std=c++17 -O2 -fPIC -shared -fvisibility=hidden -I"$kit" -I"$tree/include" -I"$inc" -I"$pyb" \
    "$kit"/bindings/*.cc -L"$tree/lib" -ldistckpt -Wl,-rpath,'$ORIGIN' \
    -Wl,--version-script="$kit/bindings/_distckpt.lds" -o "$site/distckpt/_distckpt$suffix" >> "$log" 2>&1
  RC=$?
  SECS=$((SECS + $(date +%s) - t))
fi
if [[ $RC -eq 0 ]] && PYTHONPATH="$site" "$py" -c "import distckpt, sys; print('imported', distckpt.__file__)" >> "$log" 2>&1; then
  record "$step" 1 0 0 "$SECS" "${wheel:+$(basename "$wheel"); }$(grep -c . "$log") log lines; $(tail -1 "$log")"
  built=1
else
  record "$step" 0 1 0 "$SECS" "$(grep -iE 'error|Error' "$log" | head -3 | tr '\n' ' ')"
  built=0
fi

# pytest, from the kit's wheels where the machine has none.
tools="$work/tools"
if ! "$py" -c "import pytest" 2>/dev/null; then
  "$py" -m pip install -q --no-index --disable-pip-version-check --target "$tools" "$kit"/wheels/*.whl \
    > "$out/logs/pytest-install.log" 2>&1
fi
export PYTHONPATH="$site:$tools${PYTHONPATH:+:$PYTHONPATH}"

# The golden checkpoints, written on other machines, verify with this CPU's XXH3 build (AVX-512, AVX2 or SSE2).
if [[ $built -eq 1 ]]; then
  log="$out/logs/golden.log"
  run "golden checkpoints verify" "$log" "$py" -c "
import glob, sys, distckpt
paths = sorted(glob.glob(sys.argv[1] + '/*'))
assert paths, 'no golden checkpoints in the kit'
for p in paths:
    with distckpt.open(p) as r:
        r.verify()
    print('verified', p)" "$kit/golden"
  if [[ $RC -eq 0 ]]; then
    record "golden checkpoints verify" 1 0 0 "$SECS" "$(grep -c "^verified" "$log") checkpoints"
  else
    record "golden checkpoints verify" 0 1 0 "$SECS" "$(tail -1 "$log")"
  fi
fi

# ---- 3. the device tests ------------------------------------------------------------------------------------------
if [[ $built -eq 1 ]]; then
  log="$out/logs/pytest.log"
  # From a directory of its own: nothing of a checkout is importable, only the package built above.
  run "device tests (pytest)" "$log" env -C "$work" "$py" -m pytest "$kit/python/tests/test_device.py" -v -rs \
    -p no:cacheprovider --junitxml="$out/pytest.xml" -o junit_family=xunit1
  read -r p f s < <(junit_counts "$out/pytest.xml")
  if [[ $RC -ne 0 && $f -eq 0 ]]; then f=1; fi
  record "device tests (pytest)" "$p" "$f" "$s" "$SECS" "$(grep -E '^(FAILED|SKIPPED|ERROR)' "$log" | head -12 | tr '\n' ';')"
else
  record "device tests (pytest)" 0 1 0 0 "not run: the binding did not build"
fi

# ---- 4. the GPU cases ---------------------------------------------------------------------------------------------
# What only a GPU settles (python/tests/test_gpu_cases.py): stream ordering, no current context (a fresh thread, a C
# program compiled here against the kit's header and library, JAX), memory kinds, a stuck stream with a timeout,
# snapshots of many tensors and on a full GPU, a strided load, graph capture beside a save, NCCL at world size 1,
# the two-GPU cases, and CUDA tensors through the checkpoint manager (python/tests/test_manager.py). Their measurements are properties in gpu_cases.xml. A time limit of their own
# (GPU_CASES_TIMEOUT, default 420 s); a case still running after 120 s has its threads' stacks dumped to the log.
if [[ $built -eq 1 ]]; then
  log="$out/logs/gpu_cases.log"
  step_timeout_all=$step_timeout
  step_timeout=${GPU_CASES_TIMEOUT:-420}
  run "gpu cases (pytest)" "$log" env -C "$work" DISTCKPT_PREBUILT="$tree" "$py" -m pytest "$kit/python/tests/test_gpu_cases.py" \
    "$kit/python/tests/test_manager.py::test_torch_cuda_tensors_on_a_gpu" -v -rsxP \
    -p no:cacheprovider -o faulthandler_timeout=120 --junitxml="$out/gpu_cases.xml" -o junit_family=xunit1
  step_timeout=$step_timeout_all
  read -r p f s < <(junit_counts "$out/gpu_cases.xml")
  if [[ $RC -ne 0 && $f -eq 0 ]]; then f=1; fi
  record "gpu cases (pytest)" "$p" "$f" "$s" "$SECS" \
    "$(grep -E '^(FAILED|ERROR|SKIPPED|XFAIL|XPASS)' "$log" | head -12 | tr '\n' ';')"
else
  record "gpu cases (pytest)" 0 1 0 0 "not run: the binding did not build"
fi

# ---- 5. NCCL ------------------------------------------------------------------------------------------------------
if [[ -z ${DCKPT_NCCL_LIBRARY:-} ]]; then
  # torch's wheels bring NCCL as the nvidia-nccl package; else the loader's path.
  nccl=$("$py" -c "
import os, nvidia.nccl as n
d = os.path.join(list(n.__path__)[0], 'lib')
print(next(os.path.join(d, f) for f in sorted(os.listdir(d)) if f.startswith('libnccl.so')))" 2>/dev/null ||
    ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / {print $NF; exit}')
  if [[ -n $nccl ]]; then export DCKPT_NCCL_LIBRARY=$nccl; fi
fi
echo "NCCL: ${DCKPT_NCCL_LIBRARY:-not found (the conformance suite will skip)}" >> "$out/environment.txt"
for t in nccl_test nccl_gloo_test; do
  log="$out/logs/$t.log"
  run "$t" "$log" env -C "$work" "$tree/bin/$t" --gtest_output="xml:$out/$t.xml"
  read -r p f s < <(junit_counts "$out/$t.xml")
  if [[ $RC -ne 0 && $f -eq 0 ]]; then f=1; fi
  record "$t" "$p" "$f" "$s" "$SECS" "$(grep -E '^\[  (FAILED|SKIPPED) ' "$log" | sort -u | head -8 | tr '\n' ';')"
done

# ---- 6. the benchmark ---------------------------------------------------------------------------------------------
if [[ $built -eq 1 ]]; then
  log="$out/logs/gpu_bench.log"
  run "gpu benchmark" "$log" env -C "$work" "$py" "$kit/bench/gpu_bench.py" --out "$out" --gib "${GPU_BENCH_GIB:-4}"
  read -r p f s < <("$py" -c "
import json, sys
r = json.load(open(sys.argv[1]))
if 'skipped' in r: print(0, 0, 1)
else: print(sum(c['ok'] for c in r['checks']), sum(not c['ok'] for c in r['checks']), 0)" "$out/gpu_bench.json" 2>/dev/null ||
    echo "0 1 0")
  if [[ $RC -ne 0 && $f -eq 0 ]]; then f=1; fi
  record "gpu benchmark" "$p" "$f" "$s" "$SECS" "$(grep -E '^(FAIL|SKIPPED)' "$log" | head -5 | tr '\n' ';')"
else
  record "gpu benchmark" 0 1 0 0 "not run: the binding did not build"
fi

# ---- 7. the Rust inference server's load ----------------------------------------------------------------------------
if [[ $built -eq 1 && -x $tree/bin/gpu_load && -n ${gpu_name:-} ]]; then
  log="$out/logs/rust_gpu_load.log"
  # shellcheck disable=SC2016  # expanded by the inner bash
  run "rust gpu_load" "$log" bash -c '
    "$1" -c "
import sys, numpy as np, distckpt
rng = np.random.default_rng(0)
distckpt.save({f\"layer{i}.w\": rng.standard_normal((2048, 4096), dtype=np.float32).astype(np.float16)
               for i in range(64)}, sys.argv[1])" "$2" &&
    "$3/bin/gpu_load" "$2" > "$4/gpu_load.txt" && "$3/bin/digest" "$2" > "$4/digest.txt" &&
    diff <(sed "\$d" "$4/gpu_load.txt") "$4/digest.txt" && tail -1 "$4/gpu_load.txt"' _ "$py" "$work/rust_model" \
    "$tree" "$work"
  if [[ $RC -eq 0 ]]; then
    record "rust gpu_load" 1 0 0 "$SECS" "$(tail -1 "$log")"
  else
    record "rust gpu_load" 0 1 0 "$SECS" "$(tail -3 "$log" | tr '\n' ' ')"
  fi
else
  why="no GPU (nvidia-smi names none)"
  [[ -x $tree/bin/gpu_load ]] || why="$tree/bin/gpu_load missing (the kit has it for x86_64 only)"
  [[ $built -eq 1 ]] || why="the binding did not build"
  record "rust gpu_load" 0 0 1 0 "not run: $why"
fi

# ---- report -------------------------------------------------------------------------------------------------------
elapsed=$(($(date +%s) - t_start))
"$py" - "$out" "$elapsed" "${gpu_name:-no GPU}" "$passed" "$failed" "$skipped" <<'PY'
import json, os, sys
out, elapsed, gpu, p, f, s = sys.argv[1], int(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:])
steps = []
for line in open(os.path.join(out, "steps.tsv")):
    name, sp, sf, ss, secs, note = line.rstrip("\n").split("\t")
    steps.append({"step": name, "passed": int(sp), "failed": int(sf), "skipped": int(ss), "seconds": int(secs),
                  "note": note})
bench = {}
if os.path.exists(os.path.join(out, "gpu_bench.json")):
    bench = json.load(open(os.path.join(out, "gpu_bench.json")))
env = open(os.path.join(out, "environment.txt")).read()
json.dump({"gpu": gpu, "elapsed_s": elapsed, "passed": p, "failed": f, "skipped": s, "steps": steps,
           "benchmark": bench, "environment": env}, open(os.path.join(out, "results.json"), "w"), indent=2)
md = [f"# distckpt GPU check: {gpu}", "", f"{p} passed, {f} failed, {s} skipped in {elapsed} s.", "",
      "| step | passed | failed | skipped | s | notes |", "|---|---|---|---|---|---|"]
md += [f"| {x['step']} | {x['passed']} | {x['failed']} | {x['skipped']} | {x['seconds']} | "
       f"{x['note'].replace('|', '/')[:400]} |" for x in steps]
md += ["", "## Machine", "", "```", env.rstrip(), "```", ""]
if os.path.exists(os.path.join(out, "gpu_bench.md")):
    md += [open(os.path.join(out, "gpu_bench.md")).read()]
open(os.path.join(out, "results.md"), "w").write("\n".join(md) + "\n")
PY
echo "results: $out/results.md, $out/results.json (${elapsed}s)"
echo "gpu_check: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
