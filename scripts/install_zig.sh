#!/usr/bin/env bash
# Installs the zig toolchain that builds distckpt's portable core (--config=portable: glibc 2.28 floor, libc++ linked
# statically) and the wheels' extensions: PyPI's `ziglang` wheel, pinned, unpacked once into a cache outside the
# checkout, so every clone on this machine shares it (and zig's own cache of the libc++ it builds per target).
# Idempotent and quiet; prints the zig binary's path. DISTCKPT_ZIG=/path/to/zig uses another zig instead.
#
#   ~/.cache/distckpt/zig-<version>/zig          the compiler (zig cc, zig c++, zig ar)
#   ~/.cache/distckpt/zig-cache/                 ZIG_GLOBAL_CACHE_DIR: libc++/libc stubs built per target, kept
set -euo pipefail
version=0.17.1
if [[ -n ${DISTCKPT_ZIG:-} ]]; then
  [[ -x $DISTCKPT_ZIG ]] || { echo "install_zig.sh: DISTCKPT_ZIG=$DISTCKPT_ZIG is not an executable" >&2; exit 1; }
  echo "$DISTCKPT_ZIG"
  exit 0
fi
cache=${DISTCKPT_CACHE:-$HOME/.cache/distckpt}
dir=$cache/zig-$version
if [[ ! -x $dir/zig ]]; then
  case $(uname -m) in
    x86_64) plat=manylinux_2_12_x86_64 ;;
    aarch64) plat=manylinux_2_17_aarch64 ;;
    *) echo "install_zig.sh: no ziglang wheel for $(uname -m)" >&2; exit 1 ;;
  esac
  work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --platform "$plat" \
    "ziglang==$version" -d "$work" >&2
  mkdir -p "$work/unpacked" "$cache"
  python3 -m zipfile -e "$work"/ziglang-*.whl "$work/unpacked"
  chmod +x "$work/unpacked/ziglang/zig"
  rm -rf "$dir.tmp"
  mv "$work/unpacked/ziglang" "$dir.tmp"
  mv -T "$dir.tmp" "$dir"
fi
echo "$dir/zig"
