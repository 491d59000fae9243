#!/usr/bin/env bash
# Builds libdistckpt.so with Bazel and lays out an install tree for the Rust, Go and Python clients:
#   build/dist/lib/libdistckpt.so, build/dist/include/distckpt/distckpt.h, build/dist/lib/pkgconfig/distckpt.pc
# Prints the tree's root. Use it as:  export PKG_CONFIG_PATH=$(scripts/build_lib.sh)/lib/pkgconfig
#                                     export DISTCKPT_LIB_DIR=$(scripts/build_lib.sh)/lib
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD/build/dist"
if ! out=$(bazel build -c opt //capi:libdistckpt.so 2>&1); then
  echo "$out" | grep -v linux-sandbox | tail -40 >&2
  exit 1
fi
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
mkdir -p "$root/lib/pkgconfig" "$root/include/distckpt"
install -m 0755 "$bin/capi/libdistckpt.so" "$root/lib/libdistckpt.so"
install -m 0644 capi/include/distckpt/distckpt.h "$root/include/distckpt/distckpt.h"
version=$(sed -n 's/^#define DCKPT_VERSION_STRING "\(.*\)"/\1/p' capi/include/distckpt/distckpt.h)
cat > "$root/lib/pkgconfig/distckpt.pc" <<PC
prefix=$root
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: distckpt
Description: Distributed checkpointing (C ABI)
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -ldistckpt
Cflags: -I\${includedir}
PC
echo "$root"
