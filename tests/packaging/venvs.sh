#!/usr/bin/env bash
# Installs distckpt the ways the README's "Install" section tells a user to, each into a fresh venv, and checks the
# installed package there (tests/packaging/check_install.py: imported from the venv, native libraries mapped from the
# venv, 3 ranks save over Gloo, 2 load resharded with every value checked, an export read back by safetensors), run
# from a directory outside the checkout with PYTHONPATH and LD_LIBRARY_PATH unset:
#   wheels:   scripts/build_wheel.sh (CPython 3.9, 3.10, 3.11, 3.12 and 3.13), then for each, in a venv of that
#             Python, `pip install --no-index dist/distckpt-*-cpXY-*.whl` (numpy and safetensors first); each wheel is
#             tagged manylinux_2_28_x86_64, and its extension needs the C library alone (glibc 2.28 symbol versions at
#             most, no GLIBCXX) and carries no debug info;
#   sdist:    scripts/build_wheel.sh --sdist, then `pip install distckpt-<version>.tar.gz` in a venv of CPython 3.12
#             (pip's isolated build: setuptools, wheel and pybind11 from PyPI; the C++ compiler is the system's g++):
#             the binding compiled against the core the sdist carries;
#   prebuilt: `DISTCKPT_PREBUILT=<copy of scripts/build_lib.sh's tree> pip install --no-build-isolation --no-deps
#             ./python` with bazel not on PATH (setuptools, wheel, numpy, pybind11 and safetensors first), then the
#             tree's copy deleted.
# The two builds with the system's g++ go through ccache (its cache outside the checkout). Packages from PyPI are
# downloaded once into ~/.cache/distckpt/wheelhouse/<python> and installed from there with --no-index afterwards.
# Ends with "packaging: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
source tests/packaging/common.sh
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/distckpt/ccache}
gxx=(CC="ccache gcc" CXX="ccache g++")

new_venv() {  # PYTHON DIR PACKAGE...: a fresh venv of PYTHON with the packages, from a wheelhouse of that Python's
  local py=$1 dir=$2 tag wheelhouse
  shift 2
  "$py" -m venv "$dir" || return 1
  tag=$("$dir/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  wheelhouse=$HOME/.cache/distckpt/wheelhouse/$tag-x86_64
  mkdir -p "$wheelhouse"
  local pip=("$dir/bin/python" -m pip -q --disable-pip-version-check)
  "${pip[@]}" install --no-index --find-links "$wheelhouse" "$@" 2>/dev/null && return 0
  "${pip[@]}" download -d "$wheelhouse" "$@" && "${pip[@]}" install --no-index --find-links "$wheelhouse" "$@"
}

python_of() {  # X.Y: pyenv's newest CPython X.Y, else pythonX.Y on PATH
  local interp=""
  command -v pyenv >/dev/null && interp=$(ls -d "$(pyenv root)"/versions/"$1".*/bin/"python$1" 2>/dev/null | sort -V | tail -1)
  [[ -n $interp ]] || interp=$(command -v "python$1")
  echo "$interp"
}

check_installed() {  # VENV: check_install.py with the venv's python, from a directory outside the checkout
  local run out rc
  run=$(mktemp -d -p "$work" run.XXXX) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
  out=$(cd "$run" && env -u PYTHONPATH -u LD_LIBRARY_PATH "$1/bin/python" -I "$repo/tests/packaging/check_install.py" \
    "$repo" "$run" 2>&1)
  rc=$?
  echo "$out" | grep -vE '^(ok|FAIL) ' | sed 's/^/    /'
  while read -r line; do check "${line#* }" "$([[ $line == ok* ]] && echo 0 || echo 1)"; done \
    < <(echo "$out" | grep -E '^(ok|FAIL) ' | sed -E 's/^(ok|FAIL) +/\1 /')
  [[ $rc -eq 0 ]] || echo "$out" | grep -qE '^FAIL ' || check "check_install.py exits 0" "$rc"
}

# --- a: the wheels --------------------------------------------------------------------------------------------------
echo "== wheels"
out=$(scripts/build_wheel.sh 2>&1)
check "scripts/build_wheel.sh (CPython 3.9-3.13)" $? || echo "$out" | tail -20
echo "$out" | grep '^wheel: ' | sed 's/^/    /'
for v in 3.9 3.10 3.11 3.12 3.13; do
  tag=cp${v/./}
  wheel=$(sed -n "s/^wheel: \([^ ]*-$tag-$tag-[^ ]*\.whl\) .*/\1/p" <<<"$out")
  [[ -f $wheel ]] || { check "a wheel for CPython $v" 1; continue; }
  [[ $wheel == *-manylinux_2_28_x86_64.whl ]]
  check "${wheel##*/}: tagged manylinux_2_28_x86_64 by auditwheel" $?
  rm -rf "$work/unzipped"
  "$(python_of "$v")" -m zipfile -e "$wheel" "$work/unzipped"
  ext=$(echo "$work"/unzipped/distckpt/_distckpt.cpython-*.so)
  beyond_c=$(needed "$ext" | grep -Ev '^(libc|libm|libdl|libpthread|ld-linux-x86-64)\.so')
  glibc=$(objdump -T "$ext" | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sort -u -V | tail -1)
  [[ -z $beyond_c && $(printf '%s\n' "$glibc" GLIBC_2.28 | sort -V | tail -1) == GLIBC_2.28 ]] &&
    ! objdump -T "$ext" | grep -q 'GLIBCXX_' && ! readelf -S "$ext" | grep -q '\.debug_info'
  check "its extension ($(stat -c %s "$ext") bytes) needs the C library alone, newest $glibc, no GLIBCXX, no debug info" $?
  new_venv "$(python_of "$v")" "$work/venv-$tag" numpy safetensors
  check "a fresh venv of CPython $v with numpy and safetensors from PyPI" $?
  "$work/venv-$tag/bin/python" -m pip install -q --disable-pip-version-check --no-index "$wheel"
  check "pip install --no-index ${wheel##*/}" $?
  check_installed "$work/venv-$tag"
done

# --- the sdist ------------------------------------------------------------------------------------------------------
echo "== sdist"
out=$(scripts/build_wheel.sh --sdist 2>&1)
check "scripts/build_wheel.sh --sdist" $? || echo "$out" | tail -20
sdist=$(sed -n 's/^sdist: \([^ ]*\) .*/\1/p' <<<"$out")
echo "    ${out##*sdist: }"
if [[ -f $sdist ]]; then
  new_venv "$(python_of 3.12)" "$work/venv-sdist" numpy safetensors
  check "a fresh venv of CPython 3.12 with numpy and safetensors" $?
  out=$(cd "$work" && env "${gxx[@]}" "$work/venv-sdist/bin/python" -m pip install -q --disable-pip-version-check \
    --no-binary distckpt "$sdist" 2>&1)
  check "pip install ${sdist##*/} (an isolated build: the binding compiled by g++ against the bundled core)" $? ||
    echo "$out" | tail -30
  check_installed "$work/venv-sdist"
fi

# --- b: against an installed core, without Bazel --------------------------------------------------------------------
echo "== DISTCKPT_PREBUILT"
DISTCKPT_DIST=$work/dist scripts/build_lib.sh >"$work/build_lib.log" 2>&1
check "scripts/build_lib.sh" $? || tail -20 "$work/build_lib.log"
tree=$work/tree-copy
cp -a "$work/dist" "$tree" && rm -rf "$work/dist"
new_venv "$(python_of 3.11)" "$work/venv-prebuilt" setuptools wheel numpy pybind11 safetensors
check "a fresh venv with setuptools, wheel, numpy, pybind11 and safetensors from PyPI" $?
# A PATH without bazel: each directory on it that holds bazel is replaced by a directory of links to everything else
# in it (compilers, linker, pkg-config stay reachable).
nobazel=()
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  if [[ -e $d/bazel ]]; then
    mirror=$(mktemp -d -p "$work" path.XXXX) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
    find "$d/" -maxdepth 1 -mindepth 1 ! -name 'bazel*' -exec ln -s {} "$mirror/" \;
    d=$mirror
  fi
  nobazel+=("$d")
done
nobazel_path=$(IFS=:; echo "${nobazel[*]}")
! PATH=$nobazel_path command -v bazel >/dev/null
check "the install's PATH has no bazel" $?
# Private build directories (DIST_EXTRA_CONFIG, an extra setup.cfg), as in a fresh checkout: python/build/ belongs to
# whoever else builds in this checkout.
mkdir -p "$work/egg"
printf '[build]\nbuild_base = %s\n[egg_info]\negg_base = %s\n' "$work/build" "$work/egg" >"$work/setup.cfg"
out=$(PATH=$nobazel_path DIST_EXTRA_CONFIG=$work/setup.cfg DISTCKPT_PREBUILT=$tree env -u DISTCKPT_BAZEL "${gxx[@]}" \
  "$work/venv-prebuilt/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
  ./python 2>&1)
check "DISTCKPT_PREBUILT=<tree> pip install --no-build-isolation --no-deps ./python" $? || echo "$out" | tail -30
rm -rf "$tree"
check_installed "$work/venv-prebuilt"
finish packaging
