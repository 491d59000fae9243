#!/usr/bin/env bash
# Builds the C ABI with Bazel and lays out a portable install tree for C, C++, Rust, Go and Python users:
#
#   build/dist/include/distckpt/distckpt.h
#   build/dist/lib/libdistckpt.so            needs only the C library (libc, libm, libdl, libpthread, ld-linux), glibc
#                                            2.28 or newer: built by zig (--config=portable) with libc++ linked in and
#                                            hidden, stripped (its debug info in lib/.debug/, found by gdb)
#   build/dist/lib/libdistckpt_gloo.so       the Gloo plugin, loaded by the library on the first Gloo communicator (from
#                                            beside itself); built by g++ like Debian's libgloo, which it links, so it
#                                            has a higher floor of its own (PORTABILITY); RUNPATH $ORIGIN/distckpt.libs
#   build/dist/lib/distckpt.libs/            what the plugin needs that Debian ships no static archive of (gloo,
#                                            hiredis, ibverbs, libnl), renamed with a content hash and patched to find
#                                            each other through $ORIGIN, as `auditwheel repair` vendors libraries
#   build/dist/lib/libdistckpt.a             the whole core, libc++ included, in one relocatable object whose only
#                                            global definitions are dckpt_*: a program links it with -lm -ldl -pthread
#   build/dist/lib/pkgconfig/distckpt.pc          shared:  -ldistckpt (rpath to lib/)
#   build/dist/lib/pkgconfig/distckpt-static.pc   static:  lib/libdistckpt.a + the system libraries it needs
#   build/dist/lib/cmake/distckpt/           find_package(distckpt): distckpt::distckpt (shared), distckpt::static
#   build/dist/share/distckpt/PORTABILITY    the NEEDED lists, the vendored files and the newest glibc symbol versions,
#                                            of the library and of the plugin
#
# The tree is relocatable: the .pc and CMake files name their paths relative to themselves.
# CUDA, NCCL, libcurl and Gloo are never linked into the library: it loads them at run time. A program linked with
# libdistckpt.a finds the plugin beside its executable, or through DCKPT_GLOO_PLUGIN=<this tree>/lib/libdistckpt_gloo.so.
#
# DISTCKPT_ARCH=aarch64 builds the tree for AArch64 instead (default build/dist-aarch64): the core by zig, the plugin
# by Debian's cross g++ against an arm64 Debian root that tests/packaging/chroot.sh makes once (debootstrap + qemu).
# Prints the tree's root:
#   export PKG_CONFIG_PATH=$(scripts/build_lib.sh)/lib/pkgconfig
#   export DISTCKPT_LIB_DIR=$(scripts/build_lib.sh)/lib
# DISTCKPT_DIST=DIR lays the tree out in DIR instead of build/dist.
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${DISTCKPT_ARCH:-x86_64}
[[ $(uname -m) == x86_64 ]] || { echo "build_lib.sh: builds on x86_64 hosts only (this is $(uname -m))" >&2; exit 1; }
case $arch in
  x86_64)
    root="${DISTCKPT_DIST:-$PWD/build/dist}"
    core_config=(--config=portable)
    plugin_config=()
    tools=""
    zig_target=x86_64-linux-gnu.2.28
    libdirs=(/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib /usr/lib)
    ;;
  aarch64)
    root="${DISTCKPT_DIST:-$PWD/build/dist-aarch64}"
    # shellcheck source=../tests/packaging/chroot.sh
    source tests/packaging/chroot.sh
    sysroot=$(chroot_aarch64) || exit 1
    core_config=(--config=portable_aarch64 "--repo_env=DISTCKPT_AARCH64_SYSROOT=$sysroot")  # its libzstd.a
    plugin_config=(--config=gcc_aarch64 "--repo_env=DISTCKPT_AARCH64_SYSROOT=$sysroot")
    tools=aarch64-linux-gnu-
    zig_target=aarch64-linux-gnu.2.28
    libdirs=("$sysroot/lib/aarch64-linux-gnu" "$sysroot/usr/lib/aarch64-linux-gnu" "$sysroot/lib" "$sysroot/usr/lib")
    ;;
  *) echo "build_lib.sh: DISTCKPT_ARCH=$arch: x86_64 or aarch64" >&2; exit 1 ;;
esac
command -v patchelf >/dev/null || { echo "build_lib.sh: patchelf is missing (scripts/install_deps.sh)" >&2; exit 1; }
zig=$(scripts/install_zig.sh) || exit 1
bazel_build() {  # CONFIG... -- TARGET...: bazel build -c opt, quiet unless it fails
  if ! out=$(bazel build -c opt "$@" 2>&1); then
    echo "$out" | grep -v linux-sandbox | tail -40 >&2
    exit 1
  fi
}
bazel_build "${core_config[@]}" //capi:libdistckpt.so
bazel_build "${plugin_config[@]}" //capi:libdistckpt_gloo.so
core_bin=$(bazel info -c opt "${core_config[@]}" bazel-bin 2>/dev/null)
plugin_bin=$(bazel info -c opt "${plugin_config[@]}" bazel-bin 2>/dev/null)
execroot=$(bazel info -c opt execution_root 2>/dev/null)
libs="$root/lib/distckpt.libs"
rm -rf "$libs" "$root/lib/.debug"
mkdir -p "$root/lib/pkgconfig" "$root/lib/cmake/distckpt" "$root/lib/.debug" "$root/include/distckpt" "$libs" \
  "$root/share/distckpt"
install -m 0644 capi/include/distckpt/distckpt.h "$root/include/distckpt/distckpt.h"
version=$(sed -n 's/^#define DCKPT_VERSION_STRING "\(.*\)"/\1/p' capi/include/distckpt/distckpt.h)
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT

# --- the shared library and the Gloo plugin ----------------------------------------------------------------------------
so="$root/lib/libdistckpt.so"
plugin="$root/lib/libdistckpt_gloo.so"
install -m 0755 "$core_bin/capi/libdistckpt.so" "$so.tmp"
install -m 0755 "$plugin_bin/capi/libdistckpt_gloo.so" "$plugin.tmp"
# Release files carry no debug info; the library's goes to lib/.debug/, where gdb looks for the debuglink.
"${tools}objcopy" --only-keep-debug "$so.tmp" "$root/lib/.debug/libdistckpt.so.debug"
"${tools}strip" --strip-debug --strip-unneeded "$so.tmp"
"${tools}objcopy" --add-gnu-debuglink="$root/lib/.debug/libdistckpt.so.debug" "$so.tmp"
"${tools}strip" --strip-debug "$plugin.tmp"

# The C and C++ runtimes every Linux has (the manylinux policy's list). The library needs nothing but the C library
# (checked); what the plugin needs besides the runtimes is copied beside it.
runtime_re='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|ld-linux-aarch64|linux-vdso)\.so'
c_library_re='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|ld-linux-aarch64)\.so'
for n in $(patchelf --print-needed "$so.tmp"); do
  [[ $n =~ $c_library_re ]] || { echo "build_lib.sh: libdistckpt.so needs $n, more than the C library" >&2; exit 1; }
done
find_lib() {  # SONAME: its file in the target's library directories
  local d
  for d in "${libdirs[@]}"; do
    if [[ -e $d/$1 ]]; then readlink -f "$d/$1"; return 0; fi
  done
  echo "build_lib.sh: $1 is not found in ${libdirs[*]}" >&2
  return 1
}
declare -A vendored=()  # soname -> new file name
vendor() {  # FILE: copies what FILE needs beyond the runtimes into distckpt.libs/, and what those need, once each
  local name path hash base new
  for name in $(patchelf --print-needed "$1"); do
    [[ $name =~ $runtime_re || -n ${vendored[$name]:-} ]] && continue
    path=$(find_lib "$name") || exit 1
    hash=$(sha256sum "$path" | cut -c1-8)
    base=${name%%.so*}
    new="$base-$hash.so${name#"$base.so"}"
    install -m 0755 "$path" "$libs/$new"
    "${tools}strip" --strip-debug "$libs/$new"
    vendored[$name]=$new
    vendor "$libs/$new"
  done
}
vendor "$plugin.tmp"

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
# The objects of the shared library's link (Bazel's position-independent .pic.o files) and the C++ runtime zig links
# into it (libc++, libc++abi, libunwind and compiler-rt's builtins, the members the core uses), partially linked into
# one object. Every global it defines except dckpt_* is then made local, and its COMDAT groups plain sections, so the
# archive can sit in any program beside other copies of libc++ or the core without a clash: a program links it with
# the C library alone, whatever its compiler and C++ runtime.
objs=$(bazel aquery -c opt "${core_config[@]}" 'mnemonic("CppLink", //capi:libdistckpt.so)' --output=text 2>/dev/null |
  grep -E '^\s+Inputs:' | tr ',[] ' '\n\n\n\n' | grep -E '\.(o|a|lo)$' | grep -v '/_solib' | sort -u)
[[ -n $objs ]] || { echo "build_lib.sh: bazel aquery found no objects of //capi:libdistckpt.so" >&2; exit 1; }
# Archives of other repositories (Debian's libzstd.a through @zstd) are named external/<repo>/...: the execroot links
# only the repositories of the last build (the plugin's), so they are taken from the output base. They are searched
# like the runtimes, not taken whole: only the members the core calls come in (Debian's libzstd.a is not built -fPIC,
# and its dictionary builder's references to stderr could not go into a shared object such as a Python extension).
output_base=$(bazel info output_base 2>/dev/null)
third_party=$(for o in $objs; do if [[ $o == external/*.a ]]; then echo "$output_base/$o"; fi; done)
objs=$(for o in $objs; do if [[ $o != external/*.a ]]; then echo "$o"; fi; done)
# The runtime archives: those zig's own link of a shared library names (same target, same -O2 as the toolchain's).
echo 'void distckpt_probe(void) {}' > "$work/probe.c"
runtime=$(cd "$work" && ZIG_GLOBAL_CACHE_DIR="$HOME/.cache/distckpt/zig-cache" \
  ZIG_LOCAL_CACHE_DIR="$HOME/.cache/distckpt/zig-cache" "$zig" c++ -target "$zig_target" -O2 -shared -fPIC \
  -x c probe.c -x none -o probe.so -v 2>&1 | tr ' ' '\n' | grep -E '/lib(c\+\+|c\+\+abi|unwind|compiler_rt)\.a$' | sort -u)
[[ $(wc -l <<<"$runtime") -eq 4 ]] || { echo "build_lib.sh: zig's link named no libc++/libc++abi/libunwind/compiler_rt:
$runtime" >&2; exit 1; }
(cd "$execroot" && "${tools}ld" -r -o "$work/distckpt.o" --whole-archive $objs --no-whole-archive $third_party $runtime)
"${tools}nm" --defined-only -g "$work/distckpt.o" | awk '$3 ~ /^dckpt_/ {print $3}' > "$work/keep"
"${tools}objcopy" --keep-global-symbols="$work/keep" --remove-section=.group --strip-debug "$work/distckpt.o"
# (__cxa_atexit and __cxa_thread_atexit_impl are the C library's.)
if undefined=$("${tools}nm" -u "$work/distckpt.o" | awk '{print $2}' | grep -vE '^(_GLOBAL_OFFSET_TABLE_|__cxa_atexit|__cxa_finalize|__cxa_thread_atexit_impl)$' |
    grep -E '^_Z|^__cxa|^_Unwind|^__gxx' ); then
  echo "build_lib.sh: libdistckpt.a still needs C++ runtime symbols: $(echo $undefined | head -c 400)" >&2
  exit 1
fi
rm -f "$root/lib/libdistckpt.a"
"${tools}ar" rcsD "$root/lib/libdistckpt.a" "$work/distckpt.o"
chmod 0644 "$root/lib/libdistckpt.a"

# --- pkg-config -------------------------------------------------------------------------------------------------------
# What a static link needs besides the archive: the C library's parts, libdl and pthread among them for what the library
# loads at run time (the Gloo plugin, CUDA, NCCL, libcurl). The C++ runtime is inside the archive.
static_libs="-lm -ldl -pthread"
# The shared library links whatever the order on the command line, `cc $(pkg-config --libs distckpt) tool.c` as well as
# `cc tool.c $(pkg-config --libs distckpt)`: Debian's gcc links --as-needed, which drops a library named before the
# code that uses it, so it is named with --no-as-needed (and --as-needed, the Debian default, restored after it: cgo
# allows these two flags, not --push-state). An archive must still come after the sources.
cat > "$root/lib/pkgconfig/distckpt.pc" <<PC
prefix=\${pcfiledir}/../..
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
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: distckpt-static
Description: Distributed checkpointing (C ABI), static archive: the binary needs no libdistckpt.so
Version: $version
Libs: \${libdir}/libdistckpt.a $static_libs
Cflags: -I\${includedir}
PC

# --- CMake -------------------------------------------------------------------------------------------------------------
# find_package(distckpt [version]) with the tree on CMAKE_PREFIX_PATH: distckpt::distckpt (the shared library, its
# directory as the rpath of what links it) and distckpt::static (the archive and the C library parts it needs);
# distckpt_GLOO_PLUGIN names the plugin, for DCKPT_GLOO_PLUGIN in statically linked programs.
cat > "$root/lib/cmake/distckpt/distckptConfig.cmake" <<'CMAKE'
# distckpt's CMake package, written by scripts/build_lib.sh. Relocatable: paths are relative to this file.
include(CMakeFindDependencyMacro)
find_dependency(Threads)
get_filename_component(_distckpt_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET distckpt::distckpt)
  add_library(distckpt::distckpt SHARED IMPORTED)
  set_target_properties(distckpt::distckpt PROPERTIES
    IMPORTED_LOCATION "${_distckpt_prefix}/lib/libdistckpt.so"
    IMPORTED_SONAME "libdistckpt.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_distckpt_prefix}/include")
endif()
if(NOT TARGET distckpt::static)
  add_library(distckpt::static STATIC IMPORTED)
  set_target_properties(distckpt::static PROPERTIES
    IMPORTED_LOCATION "${_distckpt_prefix}/lib/libdistckpt.a"
    IMPORTED_LINK_INTERFACE_LANGUAGES "C"
    INTERFACE_INCLUDE_DIRECTORIES "${_distckpt_prefix}/include"
    INTERFACE_LINK_LIBRARIES "m;${CMAKE_DL_LIBS};Threads::Threads")
endif()
set(distckpt_INCLUDE_DIRS "${_distckpt_prefix}/include")
set(distckpt_GLOO_PLUGIN "${_distckpt_prefix}/lib/libdistckpt_gloo.so")
unset(_distckpt_prefix)
CMAKE
cat > "$root/lib/cmake/distckpt/distckptConfigVersion.cmake" <<CMAKE
# distckpt's version for find_package, written by scripts/build_lib.sh: a request is met by this version or an
# earlier one of the same major version (of the same minor version while the major version is 0).
set(PACKAGE_VERSION "$version")
CMAKE
cat >> "$root/lib/cmake/distckpt/distckptConfigVersion.cmake" <<'CMAKE'
string(REPLACE "." ";" _distckpt_have "${PACKAGE_VERSION}")
list(GET _distckpt_have 0 _distckpt_major)
list(GET _distckpt_have 1 _distckpt_minor)
set(PACKAGE_VERSION_COMPATIBLE FALSE)
if(NOT PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION
   AND PACKAGE_FIND_VERSION_MAJOR EQUAL _distckpt_major
   AND (NOT _distckpt_major EQUAL 0 OR PACKAGE_FIND_VERSION_MINOR EQUAL _distckpt_minor))
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
# A 64-bit package: refuse a 32-bit project.
if(CMAKE_SIZEOF_VOID_P AND NOT CMAKE_SIZEOF_VOID_P EQUAL 8)
  set(PACKAGE_VERSION "${PACKAGE_VERSION} (64-bit)")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
endif()
unset(_distckpt_have)
unset(_distckpt_major)
unset(_distckpt_minor)
CMAKE

# --- what the tree needs, recorded ------------------------------------------------------------------------------------
newest() {  # PREFIX FILE...: the newest PREFIX<version> symbol version the files reference
  objdump -T "${@:2}" 2>/dev/null | grep -oE "$1[0-9]+(\.[0-9]+)+" | sort -u -V | tail -1
}
# The library links libc++ statically: it references no GLIBCXX_ version at all.
[[ -n $(newest GLIBCXX_ "$so") ]] || glibcxx_none=none
{
  echo "architecture: $arch"
  echo "libdistckpt.so NEEDED: $(patchelf --print-needed "$so" | tr '\n' ' ')"
  echo "libdistckpt.so RUNPATH: $(patchelf --print-rpath "$so")"
  echo "glibc (libdistckpt.so): $(newest GLIBC_ "$so")"
  echo "glibcxx (libdistckpt.so): $(newest GLIBCXX_ "$so" || true)${glibcxx_none:-}"
  echo "libdistckpt_gloo.so NEEDED: $(patchelf --print-needed "$plugin" | tr '\n' ' ')"
  echo "libdistckpt_gloo.so RUNPATH: $(patchelf --print-rpath "$plugin")"
  for name in $(printf '%s\n' "${!vendored[@]}" | sort); do echo "vendored: $name -> distckpt.libs/${vendored[$name]}"; done
  echo "glibc (libdistckpt_gloo.so with distckpt.libs): $(newest GLIBC_ "$plugin" "$libs"/*)"
  echo "glibcxx (libdistckpt_gloo.so with distckpt.libs): $(newest GLIBCXX_ "$plugin" "$libs"/*)"
} > "$root/share/distckpt/PORTABILITY"
echo "$root"
