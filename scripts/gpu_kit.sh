#!/usr/bin/env bash
# Lays out, in DIR, a self-contained kit for checking distckpt on a GPU machine that has Python, torch and a C++
# compiler but no Bazel and no network (docs/gpu.md):
#
#   DIR/gpu_check.sh           the check: bash DIR/gpu_check.sh RESULTS_DIR
#   DIR/include, DIR/lib       the portable install tree (scripts/build_lib.sh): libdistckpt.so, the Gloo plugin
#                              libdistckpt_gloo.so + its distckpt.libs/
#   DIR/aarch64/{include,lib,bin}  the same for AArch64 hosts (Grace Hopper, Grace Blackwell), and its NCCL tests
#   DIR/dist/                  the wheels the check installs: CPython 3.12 (the GPU machines' Python) and 3.11 for
#                              x86_64, 3.11 for AArch64 (scripts/build_wheel.sh); a Python without one builds the binding
#   DIR/python, DIR/bindings   the Python package and the binding's sources (built there with DISTCKPT_PREBUILT
#                              where no wheel fits that machine's Python)
#   DIR/python/tests           the device tests (test_device.py) and the GPU cases (test_gpu_cases.py, with the C
#                              program it compiles there against DIR/include and DIR/lib, _c_no_context.c)
#   DIR/bin/nccl_test          the NCCL communicator's tests, self-contained (core/comm/nccl/README.md)
#   DIR/bin/nccl_gloo_test     the same with a Gloo bootstrap, linked to the kit's vendored gloo
#   DIR/bin/gpu_load, digest   the Rust inference server's load into CUDA memory (rust/distckpt/examples/gpu_load.rs)
#                              and the host digests it is compared with; x86_64 only, linked statically
#   DIR/bench/gpu_bench.py     the GPU benchmark (bench/gpu/)
#   DIR/golden/                golden checkpoints (tests/golden), verified there with that CPU's checksum code
#   DIR/wheels/                pure-Python test tools the GPU machine may lack (pytest and what it needs)
#   DIR/KIT                    what built the kit: commit, date, sizes
#
# Usage: scripts/gpu_kit.sh DIR   (DIR is emptied first). Prints DIR's size. Keeps well under 64 MiB.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: scripts/gpu_kit.sh DIR" >&2; exit 2; }
cd "$(dirname "$0")/.."
repo=$PWD
kit=$(mkdir -p "$1" && cd "$1" && pwd)
[[ $kit != "$repo" && $kit != / ]] || { echo "gpu_kit.sh: refusing to empty $kit" >&2; exit 2; }
find "$kit" -mindepth 1 -delete

# The portable library, laid out straight into the kit (no static archive: nothing there links one), for x86_64 at
# the top and for AArch64 in aarch64/.
# shellcheck source=../tests/packaging/chroot.sh
source tests/packaging/chroot.sh
aarch64=1
if ! why=$(chroot_possible); then
  echo "gpu_kit.sh: no AArch64 part in this kit (its Gloo plugin needs an arm64 root, and $why)" >&2
  aarch64=0
fi
DISTCKPT_DIST="$kit" scripts/build_lib.sh >/dev/null
((aarch64)) && DISTCKPT_ARCH=aarch64 DISTCKPT_DIST="$kit/aarch64" scripts/build_lib.sh >/dev/null
for tree in "$kit" "$kit/aarch64"; do
  [[ -d $tree ]] || continue
  rm -f "$tree/lib/libdistckpt.a" "$tree/lib/pkgconfig/distckpt-static.pc"
  rm -rf "$tree/lib/.debug"
done

# The NCCL tests: nccl_test is linked statically against everything of ours; nccl_gloo_test links gloo and hiredis,
# which are pointed at the kit's vendored copies. For AArch64 they are built by the cross g++ (--config=gcc_aarch64).
nccl_tests() {  # TREE STRIP CONFIG...: builds the NCCL tests with CONFIG into TREE/bin, linked to TREE's vendored gloo
  local tree=$1 strip=$2 out bin f needed base vendored
  shift 2
  if ! out=$(bazel build -c opt "$@" //core/comm/nccl:nccl_test //core/comm/nccl:nccl_gloo_test 2>&1); then
    echo "$out" | grep -v linux-sandbox | tail -30 >&2
    exit 1
  fi
  bin=$(bazel info -c opt "$@" bazel-bin 2>/dev/null)
  mkdir -p "$tree/bin"
  install -m 0755 "$bin/core/comm/nccl/nccl_test" "$bin/core/comm/nccl/nccl_gloo_test" "$tree/bin/"
  for f in "$tree"/bin/*; do
    "$strip" --strip-debug "$f"  # before patchelf: stripping a file patchelf rewrote can leave unaligned segments
    for needed in $(patchelf --print-needed "$f"); do
      base=${needed%%.so*}
      vendored=$(cd "$tree/lib/distckpt.libs" && ls "$base"-*.so* 2>/dev/null | head -1 || true)
      if [[ -n $vendored ]]; then patchelf --replace-needed "$needed" "$vendored" "$f"; fi
    done
    patchelf --set-rpath '$ORIGIN/../lib/distckpt.libs' "$f"
  done
}
nccl_tests "$kit" strip
if ((aarch64)); then
  nccl_tests "$kit/aarch64" aarch64-linux-gnu-strip --config=gcc_aarch64 "--repo_env=DISTCKPT_AARCH64_SYSROOT=$(chroot_aarch64)"
fi

# The Rust examples, linked statically against the library (nothing of ours needed beside them); x86_64 only: there is
# no Rust cross toolchain for AArch64 here.
static_tree=$(scripts/build_lib.sh)
(cd rust && DISTCKPT_LIB_DIR="$static_tree/lib" CARGO_TARGET_DIR="$repo/build/gpu_kit_rust" cargo build --release \
  --offline --config "$repo/rust/debian-registry.toml" -q -p distckpt --example gpu_load --example digest >&2)
install -m 0755 build/gpu_kit_rust/release/examples/gpu_load build/gpu_kit_rust/release/examples/digest "$kit/bin/"
strip "$kit/bin/gpu_load" "$kit/bin/digest"

# The wheels the check installs instead of compiling the binding there.
mkdir -p "$kit/dist"
for args in "3.11 3.12" "--arch aarch64"; do
  [[ $args != --arch* ]] || ((aarch64)) || continue
  # shellcheck disable=SC2086  # the arguments are meant to be split
  for wheel in $(scripts/build_wheel.sh $args | sed -n 's/^wheel: \([^ ]*\) .*/\1/p'); do
    cp "$wheel" "$kit/dist/"
  done
done

# The Python package and the binding's sources, as setup.py expects them (ROOT/python, ROOT/bindings).
mkdir -p "$kit/python/tests" "$kit/bindings" "$kit/bench"
cp python/setup.py python/pyproject.toml python/README.md "$kit/python/"
tar -C python --exclude=__pycache__ --exclude='*.egg-info' -cf - distckpt | tar -C "$kit/python" -xf -
cp python/tests/conftest.py python/tests/_fake_cuda.py python/tests/test_device.py python/tests/test_gpu_cases.py \
  python/tests/_c_no_context.c python/tests/test_manager.py python/tests/_manager_workers.py python/tests/_workers.py \
  "$kit/python/tests/"
cp bindings/*.cc bindings/*.h bindings/_distckpt.lds "$kit/bindings/"  # every part of the one module
cp bench/gpu/gpu_bench.py "$kit/bench/"
# Golden checkpoints written elsewhere: verifying them there checks that machine's XXH3 SIMD build (e.g. AVX-512).
mkdir -p "$kit/golden"
cp -R tests/golden/v1_all_dtypes tests/golden/v1_1_all_dtypes tests/golden/v1_2_all_dtypes tests/golden/v2_0_all_dtypes \
  tests/golden/v3_0_all_dtypes \
  "$kit/golden/"
install -m 0755 scripts/gpu_check.sh "$kit/gpu_check.sh"

# pytest for a machine without it: pure-Python wheels from PyPI, cached under build/.
cache=build/gpu_kit_wheels
if [[ ! -f $cache/.complete ]]; then
  rm -rf "$cache"
  mkdir -p "$cache"
  python3 -m pip download -q --disable-pip-version-check --only-binary :all: --python-version 3.12 \
    --platform any --implementation py -d "$cache" pytest >&2
  touch "$cache/.complete"
fi
mkdir -p "$kit/wheels"
cp "$cache"/*.whl "$kit/wheels/"

{
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  cat "$kit/share/distckpt/PORTABILITY"
  if ((aarch64)); then sed 's/^/aarch64: /' "$kit/aarch64/share/distckpt/PORTABILITY"; fi
  (cd "$kit/dist" && ls -l -- *.whl | awk '{print "wheel: " $NF " (" $5 " bytes)"}')
} > "$kit/KIT"
du -sh "$kit" | awk '{print "gpu_kit.sh: " $2 " is " $1}'
