#!/usr/bin/env bash
# distckpt for AArch64 (Grace Hopper / Grace Blackwell hosts), built here and run under qemu-user in a Debian 12 arm64
# root (tests/packaging/chroot.sh: debootstrap once, kept outside the checkout; binfmt_misc hands arm64 programs to
# qemu-aarch64-static):
#   - the portable tree (DISTCKPT_ARCH=aarch64 scripts/build_lib.sh): libdistckpt.so needs the C library alone, glibc
#     2.28 or older symbol versions; the plugin built by the cross g++ against the root's gloo;
#   - tests/consumers/c/main.c (zig cc, shared and static) saves, loads back resharded and reads the step; gloo.c
#     (static, the plugin beside it) runs as 2 ranks over Gloo;
#   - C++ tests built by the cross g++ (--config=gcc_aarch64) run under qemu: checksum_test (XXH3's NEON build
#     against the scalar one and the reference values), metadata_test (the codec and validator);
#   - the cp311 wheel (scripts/build_wheel.sh --arch aarch64) in a venv of the root's Python 3.11:
#     tests/packaging/check_install.py (3 ranks save over Gloo, 2 load resharded with every value and checksum
#     checked, an export read back by safetensors).
# Ends with "aarch64: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
source tests/packaging/common.sh
source tests/packaging/chroot.sh
source tests/packaging/other_system.sh
if ! why=$(chroot_possible); then
  echo "SKIPPED: $why"
  finish aarch64
  exit 0
fi
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT
box=$work/box
mkdir -p "$box"

if ! why=$(binfmt_aarch64 2>&1); then
  echo "SKIPPED: arm64 programs cannot run here: $why"
  finish aarch64
  exit 0
fi
root=$(chroot_aarch64)
check "a Debian 12 arm64 root ($root)" $? || { finish aarch64; exit 1; }
tree=$(DISTCKPT_ARCH=aarch64 DISTCKPT_DIST="$work/dist" scripts/build_lib.sh)
check "DISTCKPT_ARCH=aarch64 scripts/build_lib.sh" $? || { finish aarch64; exit 1; }
so=$tree/lib/libdistckpt.so
[[ $(readelf -h "$so" | sed -n 's/.*Machine: *//p') == AArch64 ]]
check "libdistckpt.so is an AArch64 library" $?
beyond_c=$(needed "$so" | grep -Ev '^(libc|libm|libdl|libpthread|ld-linux-aarch64)\.so')
glibc=$(aarch64-linux-gnu-objdump -T "$so" | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sort -u -V | tail -1)
[[ -z $beyond_c && $(printf '%s\n' "$glibc" GLIBC_2.28 | sort -V | tail -1) == GLIBC_2.28 ]] &&
  ! aarch64-linux-gnu-objdump -T "$so" | grep -q GLIBCXX_
check "libdistckpt.so needs the C library alone ($(needed "$so" | tr '\n' ' ')), newest $glibc, no GLIBCXX" $?

zigcc=$(zigcc "$work" aarch64-linux-gnu.2.28)
c_consumers "$zigcc" "$tree" "$box"

in_root() { chroot_run "$root" "$box" "$@"; }
in_root /bin/sh -c '[ "$(uname -m)" = aarch64 ]'
check "the root runs as aarch64 (uname -m under qemu)" $?
in_root /work/c_shared /tmp/ckpt-shared
check "under qemu: main.c with libdistckpt.so saves, loads back resharded, reads the step" $?
in_root /work/c_static /tmp/ckpt-static
check "under qemu: main.c with libdistckpt.a does the same" $?
in_root /bin/bash -c '
  mkdir -p /tmp/rdv
  for rank in 0 1; do
    DCKPT_RANK=$rank DCKPT_WORLD_SIZE=2 DCKPT_RENDEZVOUS=file:///tmp/rdv DCKPT_GLOO_HOSTNAME=127.0.0.1 \
      DCKPT_TIMEOUT_MS=120000 /work/gloo_static /tmp/ckpt-gloo &
  done
  status=0
  for job in $(jobs -p); do wait "$job" || status=1; done
  exit $status'
check "under qemu: gloo.c (static, the plugin beside it) runs as 2 ranks over Gloo" $?

# C++ tests, cross-compiled with the gcc toolchain against the root's libraries, run by qemu with the root as the
# library prefix.
targets=(//core/format:checksum_test //core/format:metadata_test)
if out=$(bazel build --config=gcc_aarch64 "--repo_env=DISTCKPT_AARCH64_SYSROOT=$root" "${targets[@]}" 2>&1); then
  bin=$(bazel info --config=gcc_aarch64 "--repo_env=DISTCKPT_AARCH64_SYSROOT=$root" bazel-bin 2>/dev/null)
  for t in "${targets[@]}"; do
    path=$bin/${t#//}
    path=${path/://}
    out=$(qemu-aarch64-static -L "$root" "$path" 2>&1)
    rc=$?
    grep -E "XXH3 builds|PASSED|FAILED" <<<"$out" | sed 's/^/    /'
    check "under qemu: $t" $rc
  done
else
  echo "$out" | tail -20
  check "bazel build --config=gcc_aarch64 ${targets[*]}" 1
fi

# The wheel, in the root's own Python 3.11.
out=$(scripts/build_wheel.sh --arch aarch64 2>&1)
check "scripts/build_wheel.sh --arch aarch64" $? || echo "$out" | tail -20
wheel=$(sed -n 's/^wheel: \([^ ]*\) .*/\1/p' <<<"$out")
echo "    $(sed -n 's/^wheel: //p' <<<"$out")"
if [[ -f $wheel ]]; then
  wheel_in_root "$root" "$box" "$wheel" 3.11 aarch64 "under qemu, the cp311 wheel"
fi
finish aarch64
