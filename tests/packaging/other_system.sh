# shellcheck shell=bash
# What tests/packaging/debian11.sh and tests/packaging/aarch64.sh share: programs built here for another system (zig
# as the C compiler and linker, for a glibc 2.28 target), and the wheel checked inside that system's root. Sourced
# after common.sh (check) and chroot.sh (chroot_run).

# zigcc DIR TARGET: writes DIR/zigcc, `zig cc -target TARGET` with zig's cache outside the checkout; prints its path.
zigcc() {
  local zig
  zig=$(scripts/install_zig.sh) || return 1
  cat > "$1/zigcc" <<WRAPPER
#!/bin/sh
export ZIG_GLOBAL_CACHE_DIR="$HOME/.cache/distckpt/zig-cache" ZIG_LOCAL_CACHE_DIR="$HOME/.cache/distckpt/zig-cache"
exec "$zig" cc -target $2 "\$@"
WRAPPER
  chmod +x "$1/zigcc"
  echo "$1/zigcc"
}

# c_consumers CC TREE BOX: builds tests/consumers/c/main.c linked to TREE's libdistckpt.so (found through the rpath
# $ORIGIN/lib: TREE's lib/ is copied into BOX) and to its libdistckpt.a, and gloo.c linked to libdistckpt.a with the
# Gloo plugin and its libraries beside it, into BOX: c_shared, c_static, gloo_static.
c_consumers() {
  local cc=$1 tree=$2 box=$3
  cp -r "$tree/lib" "$box/lib"
  "$cc" -std=c99 tests/consumers/c/main.c -I"$tree/include" -L"$tree/lib" -ldistckpt -Wl,-rpath,'$ORIGIN/lib' \
    -o "$box/c_shared"
  check "main.c linked to libdistckpt.so (zig cc)" $?
  for program in main gloo; do
    "$cc" -std=c99 "tests/consumers/c/$program.c" -I"$tree/include" "$tree/lib/libdistckpt.a" -lm -ldl -lpthread \
      -o "$box/$([[ $program == main ]] && echo c_static || echo gloo_static)"
    check "$program.c linked with libdistckpt.a" $?
  done
  cp "$tree/lib/libdistckpt_gloo.so" "$box/"
  cp -r "$tree/lib/distckpt.libs" "$box/"
}

# wheel_in_root ROOT BOX WHEEL PYTHON ARCH LABEL [CHECK_ARGS...]: installs WHEEL, with numpy and safetensors for
# PYTHON (X.Y) and ARCH (x86_64, aarch64; manylinux2014 and manylinux_2_28 wheels) downloaded from PyPI here, into a venv of the root's own
# PYTHON, and runs tests/packaging/check_install.py there; one check per line it reports, named "LABEL: ...".
wheel_in_root() {
  local root=$1 box=$2 wheel=$3 py=$4 arch=$5 label=$6
  shift 6
  local wheelhouse out rc line
  wheelhouse=$HOME/.cache/distckpt/wheelhouse/cp${py/./}-$arch
  mkdir -p "$wheelhouse"
  python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --platform "manylinux2014_$arch" \
    --platform "manylinux_2_28_$arch" \
    --python-version "$py" --implementation cp -d "$wheelhouse" numpy safetensors
  check "numpy and safetensors for CPython $py on $arch from PyPI" $? || return 1
  cp "$wheel" "$box/"
  CHROOT_BINDS=("$wheelhouse:/wheelhouse" "$PWD/tests/packaging:/tests")
  out=$(chroot_run "$root" "$box" /bin/bash -c "
    python$py -m venv /tmp/venv && /tmp/venv/bin/python -m pip install -q --disable-pip-version-check --no-index \
      --find-links /wheelhouse numpy safetensors /work/$(basename "$wheel") || exit 1
    cd /tmp && DCKPT_GLOO_HOSTNAME=127.0.0.1 /tmp/venv/bin/python -I /tests/check_install.py /nonexistent /tmp $*
  " 2>&1)
  rc=$?
  echo "$out" | grep -vE '^(ok|FAIL) ' | sed 's/^/    /' | cut -c1-400
  while read -r line; do check "$label: ${line#* }" "$([[ $line == ok* ]] && echo 0 || echo 1)"; done \
    < <(echo "$out" | grep -E '^(ok|FAIL) ' | sed -E 's/^(ok|FAIL) +/\1 /' | cut -c1-300)
  [[ $rc -eq 0 ]] || echo "$out" | grep -qE '^FAIL ' || check "$label: the checks exit 0" "$rc"
}
