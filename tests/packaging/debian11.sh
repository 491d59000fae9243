#!/usr/bin/env bash
# distckpt on an older system than the one it is built on: a Debian 11 root (debootstrap --variant=minbase: glibc
# 2.31, GCC 10's libstdc++, Python 3.9, no gloo, no hiredis, no /etc/hosts; tests/packaging/chroot.sh makes it once
# and keeps it outside the checkout), run in a chroot with nothing of this checkout or machine but the files copied in:
#   - tests/consumers/c/main.c against libdistckpt.so (the portable tree's lib/ copied in, found through the rpath
#     $ORIGIN/lib) and against libdistckpt.a: saves, loads back resharded, reads the step;
#   - tests/consumers/c/gloo.c, static: a Gloo group with the plugin beside it either forms or fails with
#     DCKPT_EUNSUPPORTED naming the plugin and the dynamic loader's reason (its floor is Debian 12's, PORTABILITY);
#   - the Rust consumer (tests/consumers/rust, static, the default) reading a committed checkpoint, and the Go consumer
#     (tests/consumers/go, static) saving checkpoints and verifying them;
#   - the cp39 wheel in a venv of the root's own Python 3.9: tests/packaging/check_install.py --gloo-optional (save,
#     load resharded, export read back by safetensors, Gloo works or says why not).
# The programs are built here and linked by zig for glibc 2.28 (the way to build on a new system for older ones: the
# link against this machine's glibc would ask for its versions), then copied in. Numpy and safetensors for the root's
# Python come from PyPI through this machine (a wheelhouse under ~/.cache/distckpt).
# Ends with "debian11: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
source tests/packaging/common.sh
source tests/packaging/chroot.sh
source tests/packaging/other_system.sh
if ! why=$(chroot_possible); then
  echo "SKIPPED: $why"
  finish debian11
  exit 0
fi
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT
box=$work/box  # what goes into the root, at /work
mkdir -p "$box"

root=$(chroot_debian11)
check "a Debian 11 root ($root)" $? || { finish debian11; exit 1; }
tree=$(DISTCKPT_DIST="$work/dist" scripts/build_lib.sh)
check "scripts/build_lib.sh" $? || { finish debian11; exit 1; }
out=$(scripts/build_wheel.sh 3.9 2>&1)
check "scripts/build_wheel.sh 3.9" $? || echo "$out" | tail -20
wheel=$(sed -n 's/^wheel: \([^ ]*\) .*/\1/p' <<<"$out")

zigcc=$(zigcc "$work" x86_64-linux-gnu.2.28)
c_consumers "$zigcc" "$tree" "$box"

# Rust: the consumer crate as rust/run_tests.sh builds it (static by default), zig as the linker.
cp -R tests/consumers/rust "$work/rust"
rm -rf "$work/rust/target" "$work/rust/Cargo.lock"
sed -i "s|^\(distckpt = { path = \)\"[^\"]*\"|\1\"$repo/rust/distckpt\"|" "$work/rust/Cargo.toml"
(cd "$work/rust" && DISTCKPT_LIB_DIR="$tree/lib" CARGO_TARGET_DIR="$work/rust-target" cargo build -q --offline \
  --config "$repo/rust/debian-registry.toml" --config "target.x86_64-unknown-linux-gnu.linker=\"$zigcc\"" \
  2>&1 | tail -20; exit "${PIPESTATUS[0]}") && cp "$work/rust-target/debug/distckpt-consumer" "$box/"
check "the Rust consumer (static), zig cc as its linker" $?
cp -r tests/fixtures/mlp "$box/mlp"

# Go: the consumer module, static, the link given in the environment (go/README.md), zig cc as cgo's compiler.
cp -R tests/consumers/go "$work/go"
sed -i "s|^replace distckpt.dev/go => .*|replace distckpt.dev/go => $repo/go|" "$work/go/go.mod"
(cd "$work/go" && env -u PKG_CONFIG_PATH CC="$zigcc" CGO_ENABLED=1 CGO_CFLAGS="-I$tree/include" \
  CGO_LDFLAGS="$tree/lib/libdistckpt.a -lm -ldl -lpthread" GOFLAGS=-mod=mod GOCACHE="$work/gocache" \
  go build -tags "distckpt_static distckpt_nopkgconfig" -o "$box/ckpt-operator" . 2>&1 | tail -20
  exit "${PIPESTATUS[0]}")
check "the Go consumer (static), zig cc as cgo's compiler" $?

for bin in c_shared c_static gloo_static distckpt-consumer ckpt-operator; do
  [[ -f $box/$bin ]] || continue
  glibc=$(objdump -T "$box/$bin" | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sort -u -V | tail -1)
  [[ $(printf '%s\n' "$glibc" GLIBC_2.28 | sort -V | tail -1) == GLIBC_2.28 ]]
  check "$bin needs glibc $glibc or newer (<= 2.28)" $?
done

in_root() { chroot_run "$root" "$box" "$@"; }
in_root /bin/sh -c 'ldd --version | head -1; ! ls /usr/lib/x86_64-linux-gnu/ | grep -qE "^lib(gloo|hiredis)"'
check "the root has glibc 2.31 and no gloo or hiredis" $?
in_root /work/c_shared /tmp/ckpt-shared
check "in the root: main.c with libdistckpt.so saves, loads back resharded, reads the step" $?
in_root /work/c_static /tmp/ckpt-static
check "in the root: main.c with libdistckpt.a does the same" $?
# gloo.c with the plugin beside it: it forms its group, or says why not. The root has no /etc/hosts: the address to
# bind is given.
out=$(in_root /usr/bin/env DCKPT_GLOO_HOSTNAME=127.0.0.1 DCKPT_RANK=0 DCKPT_WORLD_SIZE=1 \
  DCKPT_RENDEZVOUS=file:///tmp/rdv /work/gloo_static /tmp/ckpt-gloo 2>&1)
rc=$?
echo "$out" | sed 's/^/    /' | cut -c1-400
if [[ $rc -eq 0 ]]; then
  check "in the root: the static Gloo program forms a group with the plugin beside it" 0
else
  grep -q "libdistckpt_gloo.so" <<<"$out" && grep -qE "GLIBC|GLIBCXX|not found" <<<"$out" &&
    grep -q "external" <<<"$out" && { ! grep -q "version \`GLIBC" <<<"$out" || grep -q "needs a newer C or C++ runtime" <<<"$out"; }
  check "in the root: the static Gloo program is refused, naming the plugin, the loader's reason and the alternatives" $?
fi
in_root /work/distckpt-consumer /work/mlp >/dev/null
check "in the root: the Rust consumer views a committed checkpoint" $?
in_root /bin/sh -c '/work/ckpt-operator make /tmp/store 100 200 && /work/ckpt-operator check --expect-steps 100,200 /tmp/store' \
  >/dev/null
check "in the root: the Go consumer saves two checkpoints, lists and verifies them" $?

# The wheel, in the root's own Python 3.9.
if [[ -f $wheel ]]; then
  wheel_in_root "$root" "$box" "$wheel" 3.9 x86_64 "in the root, the cp39 wheel" --gloo-optional
fi
finish debian11
