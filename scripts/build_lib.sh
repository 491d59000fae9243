#!/usr/bin/env bash
# Builds the C ABI with Bazel and lays out a portable install tree for C, Rust, Go and Python users:
#
#   build/dist/include/distckpt/distckpt.h
#   build/dist/lib/libdistckpt.so            needs only the C and C++ runtimes
#   build/dist/lib/libdistckpt_gloo.so       the Gloo plugin, loaded by the library on the first Gloo communicator (from
#                                            beside itself); RUNPATH $ORIGIN/distckpt.libs
#   build/dist/lib/distckpt.libs/            what the plugin needs that Debian ships no static archive of (gloo,
#                                            hiredis, ibverbs, libnl), renamed with a content hash and patched to find
#                                            each other through $ORIGIN, as `auditwheel repair` vendors libraries
#   build/dist/lib/libdistckpt.a             the whole core and its static third-party code (flatbuffers, xxhash) in one
#                                            relocatable object whose only global definitions are dckpt_*
#   build/dist/lib/pkgconfig/distckpt.pc          shared:  -ldistckpt (rpath to lib/)
#   build/dist/lib/pkgconfig/distckpt-static.pc   static:  lib/libdistckpt.a + the system libraries it needs
#   build/dist/share/distckpt/PORTABILITY    the NEEDED lists, the vendored files and the newest glibc symbol versions,
#                                            of the library and of the plugin
#
# CUDA, NCCL, libcurl and Gloo are never linked into the library: it loads them at run time. A program linked with
# libdistckpt.a finds the plugin beside its executable, or through DCKPT_GLOO_PLUGIN=<this tree>/lib/libdistckpt_gloo.so.
# Prints the tree's root:
#   export PKG_CONFIG_PATH=$(scripts/build_lib.sh)/lib/pkgconfig
#   export DISTCKPT_LIB_DIR=$(scripts/build_lib.sh)/lib
# DISTCKPT_DIST=DIR lays the tree out in DIR instead of build/dist.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${DISTCKPT_DIST:-$PWD/build/dist}"
command -v patchelf >/dev/null || { echo "build_lib.sh: patchelf is missing (scripts/install_deps.sh)" >&2; exit 1; }
if ! out=$(bazel build -c opt //capi:libdistckpt.so //capi:libdistckpt_gloo.so 2>&1); then
  echo "$out" | grep -v linux-sandbox | tail -40 >&2
  exit 1
fi
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
execroot=$(bazel info -c opt execution_root 2>/dev/null)
libs="$root/lib/distckpt.libs"
rm -rf "$libs"
mkdir -p "$root/lib/pkgconfig" "$root/include/distckpt" "$libs" "$root/share/distckpt"
install -m 0644 capi/include/distckpt/distckpt.h "$root/include/distckpt/distckpt.h"
version=$(sed -n 's/^#define DCKPT_VERSION_STRING "\(.*\)"/\1/p' capi/include/distckpt/distckpt.h)

# --- the shared library and the Gloo plugin ----------------------------------------------------------------------------
so="$root/lib/libdistckpt.so"
plugin="$root/lib/libdistckpt_gloo.so"
install -m 0755 "$bin/capi/libdistckpt.so" "$so.tmp"
install -m 0755 "$bin/capi/libdistckpt_gloo.so" "$plugin.tmp"

# The C and C++ runtimes every Linux has (the manylinux policy's list). The library needs nothing else (checked); what
# the plugin needs besides them is copied beside it.
runtime_re='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|ld-linux-aarch64|linux-vdso)\.so'
beyond_runtimes() {  # FILE: what FILE loads (ldd) beyond the runtimes, as "soname path" lines
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $runtime_re ]] || echo "$name $path"
  done
}
if extra=$(beyond_runtimes "$so.tmp") && [[ -n $extra ]]; then
  echo "build_lib.sh: libdistckpt.so needs more than the C/C++ runtimes: $(echo $extra)" >&2
  exit 1
fi
declare -A vendored=()  # soname -> new file name
while read -r name path; do
  [[ -f $path ]] || { echo "build_lib.sh: $name is not found (ldd: $path)" >&2; exit 1; }
  hash=$(sha256sum "$path" | cut -c1-8)
  base=${name%%.so*}
  new="$base-$hash.so${name#"$base.so"}"
  install -m 0755 "$path" "$libs/$new"
  vendored[$name]=$new
done < <(beyond_runtimes "$plugin.tmp")

# Each copy gets its new soname, finds its fellows through $ORIGIN, and names them by their new names.
patch_needed() {  # FILE: replace every vendored NEEDED entry of FILE with the vendored copy's name
  local f=$1 n
  for n in $(patchelf --print-needed "$f"); do
    if [[ -n ${vendored[$n]:-} ]]; then patchelf --replace-needed "$n" "${vendored[$n]}" "$f"; fi
  done
}
for name in "${!vendored[@]}"; do
  f="$libs/${vendored[$name]}"
  patchelf --set-soname "${vendored[$name]}" "$f"
  patchelf --set-rpath '$ORIGIN' "$f"
  patch_needed "$f"
done
patch_needed "$plugin.tmp"
patchelf --set-rpath '$ORIGIN/distckpt.libs' "$plugin.tmp"
mv -f "$plugin.tmp" "$plugin"
mv -f "$so.tmp" "$so"

# --- the static archive -----------------------------------------------------------------------------------------------
# The objects of the shared library's link (Bazel's position-independent .pic.o files) and the static third-party
# archives, partially linked into one object; every global it defines except dckpt_* is then made local, so the
# archive can sit in any program beside other copies of flatbuffers, xxhash or the core without a clash.
objs=$(bazel aquery -c opt 'mnemonic("CppLink", //capi:libdistckpt.so)' --output=text 2>/dev/null |
  grep -E '^\s+Inputs:' | tr ',[] ' '\n\n\n\n' | grep -E '\.(o|a|lo)$' | grep -v '/_solib' | sort -u)
[[ -n $objs ]] || { echo "build_lib.sh: bazel aquery found no objects of //capi:libdistckpt.so" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$execroot" && ld -r -o "$work/distckpt.o" --whole-archive $objs --no-whole-archive \
  /usr/lib/x86_64-linux-gnu/libflatbuffers.a /usr/lib/x86_64-linux-gnu/libxxhash.a)
nm --defined-only -g "$work/distckpt.o" | awk '$3 ~ /^dckpt_/ {print $3}' > "$work/keep"
objcopy --keep-global-symbols="$work/keep" "$work/distckpt.o"
rm -f "$root/lib/libdistckpt.a"
ar rcsD "$root/lib/libdistckpt.a" "$work/distckpt.o"
chmod 0644 "$root/lib/libdistckpt.a"

# --- pkg-config -------------------------------------------------------------------------------------------------------
# What a static link needs besides the archive: the C++ runtime, and libdl/pthread for what the library loads at run
# time (the Gloo plugin, CUDA, NCCL, libcurl).
static_libs="-lstdc++ -lm -ldl -pthread"
# The shared library links whatever the order on the command line, `cc $(pkg-config --libs distckpt) tool.c` as well as
# `cc tool.c $(pkg-config --libs distckpt)`: Debian's gcc links --as-needed, which drops a library named before the
# code that uses it, so it is named with --no-as-needed (and --as-needed, the Debian default, restored after it: cgo
# allows these two flags, not --push-state). An archive must still come after the sources.
cat > "$root/lib/pkgconfig/distckpt.pc" <<PC
prefix=$root
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: distckpt
Description: Distributed checkpointing (C ABI), shared library
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -Wl,--no-as-needed -ldistckpt -Wl,--as-needed
Libs.private: $static_libs
Cflags: -I\${includedir}
PC
cat > "$root/lib/pkgconfig/distckpt-static.pc" <<PC
prefix=$root
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: distckpt-static
Description: Distributed checkpointing (C ABI), static archive: the binary needs no libdistckpt.so
Version: $version
Libs: \${libdir}/libdistckpt.a $static_libs
Cflags: -I\${includedir}
PC

# --- what the tree needs, recorded ------------------------------------------------------------------------------------
newest() {  # PREFIX FILE...: the newest PREFIX<version> symbol version the files reference
  objdump -T "${@:2}" 2>/dev/null | grep -oE "$1[0-9]+(\.[0-9]+)+" | sort -u -V | tail -1
}
{
  echo "libdistckpt.so NEEDED: $(patchelf --print-needed "$so" | tr '\n' ' ')"
  echo "libdistckpt.so RUNPATH: $(patchelf --print-rpath "$so")"
  echo "glibc (libdistckpt.so): $(newest GLIBC_ "$so")"
  echo "glibcxx (libdistckpt.so): $(newest GLIBCXX_ "$so")"
  echo "libdistckpt_gloo.so NEEDED: $(patchelf --print-needed "$plugin" | tr '\n' ' ')"
  echo "libdistckpt_gloo.so RUNPATH: $(patchelf --print-rpath "$plugin")"
  for name in $(printf '%s\n' "${!vendored[@]}" | sort); do echo "vendored: $name -> distckpt.libs/${vendored[$name]}"; done
  echo "glibc (libdistckpt_gloo.so with distckpt.libs): $(newest GLIBC_ "$plugin" "$libs"/*)"
  echo "glibcxx (libdistckpt_gloo.so with distckpt.libs): $(newest GLIBCXX_ "$plugin" "$libs"/*)"
} > "$root/share/distckpt/PORTABILITY"
echo "$root"
