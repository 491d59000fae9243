#!/usr/bin/env bash
# Builds and runs distckpt's fuzz targets, each for N seconds:
#   scripts/fuzz.sh [seconds-per-target=60] [target ...]
# Targets (default: all):
#   metadata            MetadataView::Parse: trailer, FlatBuffers verifier, validator (core/format/fuzz/)
#   load_plan           ChunkIndex + PlanTensorRead on valid but adversarial metadata (core/plan/fuzz/)
#   safetensors_header  the core's safetensors header parser, core/foreign/safetensors.cc (core/foreign/fuzz/)
#   dcp_metadata        the restricted reader of DCP .metadata pickles (tests/fuzz/, atheris)
#   dcp_pickle          the C++ reader of DCP checkpoints: pickle decoder, .metadata schema + description against
#                       the fixtures' data files, torch.save archives (core/foreign/fuzz/)
# C++ targets are built outside Bazel with clang-14 -fsanitize=fuzzer,address,undefined; Python targets run with
# atheris (a libFuzzer engine for Python) from the repo's .venv, installed there from PyPI when missing.
#
# Work directory $FUZZ_DIR (default /tmp/distckpt-fuzz): build/ (binaries), corpus/<target>/ (kept across runs),
# seeds/<target>/ (made from real files each run, plus tests/fuzz/regressions/<target>/), findings/<target>/ (crashes,
# leaks, timeouts, OOMs). Prints per target the executions, exec/s, corpus size and findings, then a line
# "fuzz <target>: 1 passed, 0 failed" (or 0 passed, 1 failed). Exits non-zero if any target has a finding or fails
# to build. A finding is reproduced with `$FUZZ_DIR/build/<target> <file>` (C++) or
# `.venv/bin/python tests/fuzz/<target>_fuzz.py <file>`; fix it and copy the file to tests/fuzz/regressions/<target>/.
# Extra libFuzzer flags: FUZZ_FLAGS (e.g. FUZZ_FLAGS=-runs=10000000). DCP_PICKLE_MAX_LEN: dcp_pickle's -max_len
# (default 4096, which takes the small fixtures' .metadata and every item whole; 20000 takes the largest .metadata
# whole too, at about a tenth of the speed).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
all=(metadata load_plan safetensors_header dcp_metadata dcp_pickle)
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")
work="${FUZZ_DIR:-/tmp/distckpt-fuzz}"
build="$work/build"
mkdir -p "$build"
read -r -a extra <<<"${FUZZ_FLAGS:-}"

# ---- C++ -------------------------------------------------------------------------------------------------------------
cxx=(clang++-14 -std=c++17 -O1 -g -fno-omit-frame-pointer -I"$root" -I"$build/gen")
san=(-fsanitize=address,undefined -fno-sanitize-recover=undefined)
lib_srcs=(core/format/metadata.cc core/format/checksum.cc core/base/box.cc core/base/dtype.cc core/base/status.cc
          core/base/utf8.cc core/plan/load_planner.cc core/plan/copy_plan.cc core/foreign/json.cc
          core/foreign/safetensors_header.cc)
# Linked into dcp_pickle only (the storage interface's own code: ReadableFile's defaults).
foreign_srcs=(core/foreign/pickle.cc core/foreign/torch_save.cc core/foreign/dcp.cc core/storage/storage.cc
              core/storage/object_commit.cc)
cpp_built=""
build_cpp() {  # compiles the library once per run (objects reused when their source is older), then every C++ target
  [[ -n $cpp_built ]] && return "$cpp_built"
  cpp_built=1
  if ! command -v clang++-14 >/dev/null; then
    echo "fuzz: clang++-14 is missing (apt-get install clang-14 libclang-rt-14-dev)" >&2
    return 1
  fi
  # Objects are reused only for the same sources: the build directory outlives checkouts, and a clone's files may
  # be older than objects another checkout built (modification times cannot tell).
  local stamp
  stamp=$(cd "$root" && find core -type f \( -name '*.h' -o -name '*.cc' -o -name '*.c' -o -name '*.fbs' \) -print0 |
          sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1)
  if [[ $(cat "$build/sources.sha1" 2>/dev/null) != "$stamp" ]]; then
    rm -rf "$build/obj" "$build/gen"
  fi
  mkdir -p "$build/gen/core/format" "$build/obj"
  echo "$stamp" >"$build/sources.sha1"
  # By content, not modification time: the build directory outlives clones (a schema older than the header it
  # generated last is still another schema).
  if [[ ! -f $build/gen/core/format/schema_generated.h ]] ||
     ! cmp -s "$root/core/format/schema.fbs" "$build/gen/core/format/schema.fbs.used"; then
    flatc --cpp --scoped-enums -o "$build/gen/core/format" "$root/core/format/schema.fbs" || return 1
    cp "$root/core/format/schema.fbs" "$build/gen/core/format/schema.fbs.used"
  fi
  local pids=() objs=() src obj
  # XXH3 without SIMD and at each SIMD level: C files, each with its own -m flag (core/format/BUILD.bazel).
  local level flag
  for level in scalar:-msse2 sse2:-msse2 avx2:-mavx2 avx512:-mavx512f; do
    flag=${level#*:}
    level=${level%%:*}
    src=core/format/xxh3/xxh3_$level.c
    obj="$build/obj/${src//\//_}.o"
    if [[ ! -f $obj || $root/$src -nt $obj ]]; then
      clang-14 -O1 -g -fno-omit-frame-pointer "${san[@]}" -fsanitize=fuzzer-no-link "$flag" -c "$root/$src" -o "$obj" ||
        return 1
    fi
  done
  for src in "${lib_srcs[@]}" "${foreign_srcs[@]}" core/format/metadata_test_util.cc core/format/fuzz/make_seeds.cc \
             core/format/fuzz/metadata_fuzz.cc core/plan/fuzz/load_plan_fuzz.cc core/foreign/fuzz/dcp_pickle_fuzz.cc \
             core/foreign/fuzz/make_seeds.cc core/foreign/fuzz/safetensors_fuzz.cc; do
    obj="$build/obj/${src//\//_}.o"
    objs+=("$obj")
    # Rebuild when the source or any header of the tree is newer than the object (headers are few and small).
    if [[ ! -f $obj || -n $(find "$root/core" -name '*.h' -newer "$obj" -print -quit) || $root/$src -nt $obj ]]; then
      # dcp_pickle_fuzz.cc finds the DCP fixtures' data files under the source tree wherever it runs.
      "${cxx[@]}" "${san[@]}" -fsanitize=fuzzer-no-link -DDCKPT_SOURCE_ROOT="\"$root\"" -c "$root/$src" -o "$obj" &
      pids+=($!)
      if ((${#pids[@]} >= 2)); then wait "${pids[0]}" || return 1; pids=("${pids[@]:1}"); fi
    fi
  done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  local libs=() s
  for s in "${lib_srcs[@]}" core/format/xxh3/xxh3_{scalar,sse2,avx2,avx512}.c; do libs+=("$build/obj/${s//\//_}.o"); done
  o() { echo "$build/obj/${1//\//_}.o"; }
  "${cxx[@]}" "${san[@]}" -fsanitize=fuzzer "${libs[@]}" "$(o core/format/fuzz/metadata_fuzz.cc)" \
      -o "$build/metadata" || return 1
  "${cxx[@]}" "${san[@]}" -fsanitize=fuzzer "${libs[@]}" "$(o core/plan/fuzz/load_plan_fuzz.cc)" \
      -o "$build/load_plan" || return 1
  "${cxx[@]}" "${san[@]}" -fsanitize=fuzzer "${libs[@]}" "$(o core/foreign/fuzz/safetensors_fuzz.cc)" \
      -o "$build/safetensors_header" || return 1
  "${cxx[@]}" "${san[@]}" "${libs[@]}" "$(o core/format/metadata_test_util.cc)" "$(o core/format/fuzz/make_seeds.cc)" \
      -o "$build/make_seeds" || return 1
  local foreign=() f
  for f in "${foreign_srcs[@]}"; do foreign+=("$(o "$f")"); done
  "${cxx[@]}" "${san[@]}" -fsanitize=fuzzer "${libs[@]}" "${foreign[@]}" "$(o core/foreign/fuzz/dcp_pickle_fuzz.cc)" \
      -o "$build/dcp_pickle" || return 1
  "${cxx[@]}" "${san[@]}" "${libs[@]}" "${foreign[@]}" "$(o core/foreign/fuzz/make_seeds.cc)" \
      -o "$build/dcp_make_seeds" || return 1
  cpp_built=0
}

# ---- Python ----------------------------------------------------------------------------------------------------------
py="${FUZZ_PYTHON:-$root/.venv/bin/python}"
py_ready=""
setup_python() {
  [[ -n $py_ready ]] && return "$py_ready"
  py_ready=1
  if [[ ! -x $py ]]; then
    "${DISTCKPT_PYTHON:-python3}" -m venv "$root/.venv" || return 1
  fi
  if ! "$py" -c "import atheris" 2>/dev/null; then
    "$py" -m pip install -q --disable-pip-version-check atheris || { echo "fuzz: cannot install atheris" >&2; return 1; }
  fi
  py_ready=0
}

# ---- Run -------------------------------------------------------------------------------------------------------------
declare -A max_len=([metadata]=65536 [load_plan]=4096 [safetensors_header]=16384 [dcp_metadata]=16384
                    [dcp_pickle]=${DCP_PICKLE_MAX_LEN:-4096})
bad=0
for t in "${targets[@]}"; do
  corpus="$work/corpus/$t" seeds="$work/seeds/$t" findings="$work/findings/$t" log="$work/$t.log"
  mkdir -p "$corpus" "$findings"
  rm -rf "$seeds"
  mkdir -p "$seeds"
  regress="$root/tests/fuzz/regressions/$t"
  case $t in
    metadata | load_plan | safetensors_header | dcp_pickle)
      if ! build_cpp; then
        echo "fuzz $t: build failed"; echo "fuzz $t: 0 passed, 1 failed"; bad=1; continue
      fi
      [[ $t == metadata ]] && "$build/make_seeds" "$seeds"
      # safetensors_header: its seeds are the committed inputs (files the safetensors library wrote, and findings).
      if [[ $t == dcp_pickle ]]; then
        "$build/dcp_make_seeds" "$root/tests/fixtures/dcp" "$seeds" >/dev/null
        for f in "$root"/tests/fuzz/regressions/dcp_metadata/*; do  # the Python reader's findings, as pickles and metadata
          { printf '\000'; cat "$f"; } >"$seeds/py-pickle-${f##*/}"
          { printf '\001\000'; cat "$f"; } >"$seeds/py-meta-${f##*/}"
        done
      fi
      [[ $t == load_plan ]] && for i in 1 2 3 4 5 6 7 8; do  # a few fixed byte patterns; the generator does the rest
        head -c $((64 * i)) /dev/zero | tr '\0' "\\$(printf '%03o' $((i * 37 % 256)))" >"$seeds/pattern-$i"
      done
      cmd=("$build/$t")
      ;;
    dcp_metadata)
      if ! setup_python; then
        echo "fuzz $t: no atheris"; echo "fuzz $t: 0 passed, 1 failed"; bad=1; continue
      fi
      "$py" "$root/tests/fuzz/${t}_fuzz.py" --make-seeds "$seeds"
      cmd=("$py" "$root/tests/fuzz/${t}_fuzz.py")
      ;;
    *)
      echo "fuzz: unknown target '$t' (known: ${all[*]})" >&2; bad=1; continue
      ;;
  esac
  before=$(find "$findings" -type f | wc -l)
  start=$(date +%s)
  "${cmd[@]}" -max_total_time="$seconds" -max_len="${max_len[$t]}" -timeout=20 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$findings/" "${extra[@]}" "$corpus" "$seeds" \
      $( [[ -d $regress ]] && echo "$regress" ) >"$log" 2>&1
  rc=$?
  elapsed=$(($(date +%s) - start))
  execs=$(grep -aoE "stat::number_of_executed_units: *[0-9]+" "$log" | grep -oE "[0-9]+$" | tail -1)
  rate=$(grep -aoE "stat::average_exec_per_sec: *[0-9]+" "$log" | grep -oE "[0-9]+$" | tail -1)
  size=$(find "$corpus" -type f | wc -l)
  found=$(($(find "$findings" -type f | wc -l) - before))
  if ((rc != 0 && found == 0)); then found=1; fi  # died without an artifact (e.g. a Python exception at start)
  echo "fuzz $t: ${execs:-0} executions in ${elapsed} s (${rate:-0} exec/s), corpus ${size} files, ${found} findings"
  if ((found)); then
    bad=1
    grep -aE "ERROR|error:|Error|Exception|property violated|SUMMARY|artifact" "$log" | head -20
    echo "fuzz $t: log $log, findings in $findings"
    echo "fuzz $t: 0 passed, 1 failed"
  else
    echo "fuzz $t: 1 passed, 0 failed"
  fi
done
exit "$bad"
