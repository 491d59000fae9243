#!/usr/bin/env bash
# Installs distckpt the two ways the README's "Install" section tells a user to, each into a fresh venv, and checks
# the installed package there (tests/packaging/check_install.py: imported from the venv, native libraries mapped from
# the venv, 3 ranks save over Gloo, 2 load resharded with every value checked, an export read back by safetensors),
# run from a directory outside the checkout with PYTHONPATH and LD_LIBRARY_PATH unset:
#   wheel:    scripts/build_wheel.sh, then `pip install --no-index dist/distckpt-*.whl` (numpy and safetensors first);
#   prebuilt: `DISTCKPT_PREBUILT=<copy of scripts/build_lib.sh's tree> pip install --no-build-isolation --no-deps
#             ./python` with bazel not on PATH (setuptools, wheel, numpy, pybind11 and safetensors first), then the
#             tree's copy deleted.
# Packages from PyPI are downloaded once into build/packaging/wheelhouse and installed from there with --no-index
# afterwards. DISTCKPT_PYTHON: the interpreter of the venvs and of the wheel (default python3).
# Ends with "packaging: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
source tests/packaging/common.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheelhouse=$repo/build/packaging/wheelhouse
mkdir -p "$wheelhouse"

new_venv() {  # DIR PACKAGE...: a fresh venv with the packages, from the wheelhouse (downloaded there if missing)
  local dir=$1
  shift
  "${DISTCKPT_PYTHON:-python3}" -m venv "$dir" || return 1  # the interpreter scripts/build_wheel.sh builds for
  local pip=("$dir/bin/python" -m pip -q --disable-pip-version-check)
  "${pip[@]}" install --no-index --find-links "$wheelhouse" "$@" 2>/dev/null && return 0
  "${pip[@]}" download -d "$wheelhouse" "$@" && "${pip[@]}" install --no-index --find-links "$wheelhouse" "$@"
}

check_installed() {  # VENV: check_install.py with the venv's python, from a directory outside the checkout
  local run out rc
  run=$(mktemp -d -p "$work" run.XXXX)
  out=$(cd "$run" && env -u PYTHONPATH -u LD_LIBRARY_PATH "$1/bin/python" -I "$repo/tests/packaging/check_install.py" \
    "$repo" "$run" 2>&1)
  rc=$?
  echo "$out" | grep -vE '^(ok|FAIL) ' | sed 's/^/    /'
  while read -r line; do check "${line#* }" "$([[ $line == ok* ]] && echo 0 || echo 1)"; done \
    < <(echo "$out" | grep -E '^(ok|FAIL) ' | sed -E 's/^(ok|FAIL) +/\1 /')
  [[ $rc -eq 0 ]] || echo "$out" | grep -qE '^FAIL ' || check "check_install.py exits 0" "$rc"
}

# --- a: the wheel ---------------------------------------------------------------------------------------------------
echo "== wheel"
out=$(scripts/build_wheel.sh 2>&1)
check "scripts/build_wheel.sh" $?
echo "$out" | tail -3 | sed 's/^/    /'
wheel=$(echo "$out" | sed -n 's/^wheel: //p')
if [[ -f $wheel ]]; then
  new_venv "$work/venv-wheel" numpy safetensors
  check "a fresh venv with numpy and safetensors from PyPI" $?
  "$work/venv-wheel/bin/python" -m pip install -q --disable-pip-version-check --no-index "$wheel"
  check "pip install --no-index ${wheel##*/}" $?
  check_installed "$work/venv-wheel"
fi

# --- b: against an installed core, without Bazel --------------------------------------------------------------------
echo "== DISTCKPT_PREBUILT"
DISTCKPT_DIST=$work/dist scripts/build_lib.sh >"$work/build_lib.log" 2>&1
check "scripts/build_lib.sh" $? || tail -20 "$work/build_lib.log"
tree=$work/tree-copy
cp -a "$work/dist" "$tree" && rm -rf "$work/dist"
new_venv "$work/venv-prebuilt" setuptools wheel numpy pybind11 safetensors
check "a fresh venv with setuptools, wheel, numpy, pybind11 and safetensors from PyPI" $?
# A PATH without bazel: each directory on it that holds bazel is replaced by a directory of links to everything else
# in it (compilers, linker, pkg-config stay reachable).
nobazel=()
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  if [[ -e $d/bazel ]]; then
    mirror=$(mktemp -d -p "$work" path.XXXX)
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
out=$(PATH=$nobazel_path DIST_EXTRA_CONFIG=$work/setup.cfg DISTCKPT_PREBUILT=$tree env -u DISTCKPT_BAZEL \
  "$work/venv-prebuilt/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
  ./python 2>&1)
check "DISTCKPT_PREBUILT=<tree> pip install --no-build-isolation --no-deps ./python" $? || echo "$out" | tail -30
rm -rf "$tree"
check_installed "$work/venv-prebuilt"
finish packaging
