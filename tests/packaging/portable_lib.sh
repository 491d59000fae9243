#!/usr/bin/env bash
# The portable install tree of scripts/build_lib.sh, checked as a machine without this checkout would see it:
#   - lib/libdistckpt.so needs only the C library (libc, libm, libdl, libpthread, ld-linux) and has no RUNPATH, its
#     newest symbol version is GLIBC_2.28 or older and it references no GLIBCXX_ (manylinux_2_28, PyTorch's floor);
#     lib/libdistckpt.a's one object defines only dckpt_* globally and needs no C++ runtime symbol; lib/libdistckpt_gloo.so (the Gloo plugin)
#     and every file in lib/distckpt.libs/ need only the runtimes and each other (readelf), find each other through
#     $ORIGIN only, and each vendored file's soname is its file name; the plugin exports only its entry point;
#   - share/distckpt/PORTABILITY names exactly the vendored files, and its newest GLIBC_ / GLIBCXX_ versions, of the
#     library and of the plugin with distckpt.libs/, are what objdump finds (so nothing needs a newer glibc than it
#     says);
#   - the library exports exactly capi/exported_symbols.txt (capi/tests/exported_symbols_test.sh);
#   - a copy of the tree in a fresh directory (the original removed) works with LD_LIBRARY_PATH unset:
#     tests/consumers/c/main.c, compiled against the copy's header and linked to the copy, saves and loads back
#     resharded, and LD_DEBUG shows that it loaded the copy's libdistckpt.so, runtimes and nothing else (no plugin);
#     tests/consumers/c/gloo.c, built the same way, runs as 2 ranks over Gloo, and LD_DEBUG shows the plugin and
#     every vendored file loaded from the copy; python's ctypes loads the copy, dckpt_version() matches the copy's
#     header, and /proc/self/maps shows nothing of Gloo mapped (the system's libgloo and friends are installed here,
#     and must not be used).
# Ends with "portable_lib: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/packaging/common.sh
# shellcheck source=../consumers/portable.sh
source tests/consumers/portable.sh
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
copy=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work" "$copy"' EXIT

tree=$work/dist
DISTCKPT_DIST=$tree scripts/build_lib.sh >"$work/build.log" 2>&1
check "scripts/build_lib.sh lays out the tree" $? || { tail -20 "$work/build.log"; finish portable_lib; exit 1; }
so=$tree/lib/libdistckpt.so
libs=$tree/lib/distckpt.libs

deps_ok() {  # FILE: every NEEDED entry is a runtime or a file in distckpt.libs/ (else names the others)
  local n ok=0
  for n in $(needed "$1"); do
    if [[ ! $n =~ $runtime_re && ! -f $libs/$n ]]; then echo "  $(basename "$1") needs $n"; ok=1; fi
  done
  return $ok
}
origin_only() {  # FILE: every RUNPATH/RPATH entry starts with $ORIGIN (else names the others)
  local p ok=0
  for p in $(search_path "$1"); do
    if [[ $p != '$ORIGIN' && $p != '$ORIGIN/'* ]]; then echo "  $(basename "$1") searches $p"; ok=1; fi
  done
  return $ok
}

plugin=$tree/lib/libdistckpt_gloo.so
c_library_re='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|ld-linux-aarch64)\.so'
beyond_c=$(needed "$so" | grep -Ev "$c_library_re")
[[ -z $beyond_c ]] || echo "  libdistckpt.so needs $beyond_c"
[[ -z $beyond_c && -z $(search_path "$so") ]]
check "libdistckpt.so needs only the C library ($(needed "$so" | tr '\n' ' ')) and has no RUNPATH" $?
glibc=$(objdump -T "$so" | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sort -u -V | tail -1)
[[ $(printf '%s\n' "$glibc" GLIBC_2.28 | sort -V | tail -1) == GLIBC_2.28 ]]
check "libdistckpt.so's newest glibc symbol version is $glibc (<= GLIBC_2.28)" $?
! objdump -T "$so" | grep -qE 'GLIBCXX_|CXXABI_'
check "libdistckpt.so references no GLIBCXX_ or CXXABI_ version (libc++ is linked in)" $?
archive_globals=$(nm -g --defined-only "$tree/lib/libdistckpt.a" 2>/dev/null | awk 'NF == 3 {print $3}' | grep -v '^dckpt_')
archive_cxx=$(nm -u "$tree/lib/libdistckpt.a" | awk '{print $2}' | grep -E '^(_Z|_Unwind|__gxx)' | head -3)
[[ -z $archive_globals && -z $archive_cxx ]] || echo "  libdistckpt.a defines ${archive_globals:0:200}; needs ${archive_cxx}"
[[ -z $archive_globals && -z $archive_cxx ]]
check "libdistckpt.a defines only dckpt_* globally and needs no C++ runtime symbol" $?
deps_ok "$plugin" && [[ $(search_path "$plugin") == '$ORIGIN/distckpt.libs' ]]
check "libdistckpt_gloo.so needs only the runtimes and distckpt.libs/; its RUNPATH is \$ORIGIN/distckpt.libs" $?
[[ $(nm -D --defined-only "$plugin" | awk '{print $3}') == dckpt_gloo_plugin_entry ]]
check "libdistckpt_gloo.so exports only dckpt_gloo_plugin_entry" $?
vendored=$(ls "$libs")
[[ -n $vendored ]]
check "distckpt.libs/ holds ${vendored//$'\n'/ }" $?
for f in $vendored; do
  deps_ok "$libs/$f" && origin_only "$libs/$f" && [[ $(soname "$libs/$f") == "$f" ]]
  check "distckpt.libs/$f: soname is its name, needs only runtimes and fellows, RUNPATH \$ORIGIN" $?
done

record=$tree/share/distckpt/PORTABILITY
diff <(sed -n 's|^vendored: .* -> distckpt.libs/||p' "$record" | sort) <(echo "$vendored" | sort)
check "PORTABILITY lists exactly the vendored files" $?
newest() {  # PREFIX FILE...: the newest PREFIX<version> symbol version objdump finds in the files
  objdump -T "${@:2}" | grep -oE "$1[0-9]+(\.[0-9]+)+" | sort -u -V | tail -1
}
for what in "glibc (libdistckpt.so)=GLIBC_ $so" "glibcxx (libdistckpt.so)=GLIBCXX_ $so" \
    "glibc (libdistckpt_gloo.so with distckpt.libs)=GLIBC_ $plugin $libs/*" \
    "glibcxx (libdistckpt_gloo.so with distckpt.libs)=GLIBCXX_ $plugin $libs/*"; do
  key=${what%%=*}
  args=${what#*=}
  recorded=$(grep -F "$key: " "$record" | sed 's/.*: //')
  # shellcheck disable=SC2086  # the file list is meant to be split (and globbed)
  found=$(newest $args)
  found=${found:-none}
  [[ -n $recorded && $recorded == "$found" ]]
  check "PORTABILITY's $key is $recorded; objdump finds nothing newer ($found)" $?
done
bash capi/tests/exported_symbols_test.sh "$so" capi/exported_symbols.txt
check "libdistckpt.so exports exactly capi/exported_symbols.txt" $?

# --- the tree elsewhere -------------------------------------------------------------------------------------------
cp -a "$tree/." "$copy/"
rm -rf "$tree"
cc -std=c99 -Wall -Wextra -Werror tests/consumers/c/main.c -I"$copy/include" -L"$copy/lib" -Wl,-rpath,"$copy/lib" \
  -ldistckpt -o "$work/consumer"
check "tests/consumers/c/main.c compiles against the copy's header and library" $?
(cd "$work" && env -u LD_LIBRARY_PATH LD_DEBUG=libs LD_DEBUG_OUTPUT="$work/ld" ./consumer "$work/ckpt")
check "the copy saves and loads back resharded (LD_LIBRARY_PATH unset)" $?
loaded_from() {  # PREFIX: the files the LD_DEBUG logs $PREFIX.* name as initialized, one a line
  cat "$1".* 2>/dev/null | sed -n 's/.*calling init: //p' | sort -u
}
foreign_of() {  # the loaded files on stdin that are neither the copy's nor runtimes
  while read -r p; do [[ -z $p || $p == "$copy/"* || $(basename "$p") =~ $runtime_re ]] || echo "$p"; done
}
loaded=$(loaded_from "$work/ld")
foreign=$(echo "$loaded" | foreign_of)
from_copy=$(echo "$loaded" | grep "^$copy/lib/" | xargs -r -n1 basename | tr '\n' ' ')
[[ -n $foreign ]] && echo "  loaded from outside the copy: $foreign"
[[ -z $foreign && $from_copy == "libdistckpt.so " ]]
check "LD_DEBUG: only libdistckpt.so came from the copy ($from_copy), the rest are runtimes: no plugin, no Gloo" $?

cc -std=c99 -Wall -Wextra -Werror tests/consumers/c/gloo.c -I"$copy/include" -L"$copy/lib" -Wl,-rpath,"$copy/lib" \
  -ldistckpt -o "$work/gloo_consumer"
check "tests/consumers/c/gloo.c compiles against the copy's header and library" $?
(cd "$work" && unset LD_LIBRARY_PATH DCKPT_GLOO_PLUGIN && export LD_DEBUG=libs LD_DEBUG_OUTPUT="$work/ld-gloo" &&
  run_ranks 2 ./gloo_consumer "$work/ckpt-gloo")
check "2 ranks of it over Gloo from the copy (LD_LIBRARY_PATH and DCKPT_GLOO_PLUGIN unset)" $?
loaded=$(loaded_from "$work/ld-gloo")
foreign=$(echo "$loaded" | foreign_of)
from_libs=$(echo "$loaded" | grep -c "^$copy/lib/distckpt.libs/")
[[ -n $foreign ]] && echo "  loaded from outside the copy: $foreign"
[[ -z $foreign ]] && echo "$loaded" | grep -qx "$copy/lib/libdistckpt_gloo.so" &&
  [[ $from_libs -eq $(echo "$vendored" | wc -w) ]]
check "LD_DEBUG: the plugin and all $from_libs vendored files came from the copy, the rest are runtimes" $?

env -u LD_LIBRARY_PATH -u PYTHONPATH python3 -I - "$copy" <<'PY'
import ctypes, os, re, sys

copy = sys.argv[1]
runtime = re.compile(r"^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so(\.[0-9]+)*$")


def mapped():
    with open("/proc/self/maps") as f:
        return {fields[5] for fields in (line.split(None, 5) for line in f) if len(fields) == 6 and ".so" in fields[5]}


before = mapped()
lib = ctypes.CDLL(os.path.join(copy, "lib", "libdistckpt.so"))
lib.dckpt_version.restype = ctypes.c_uint
lib.dckpt_version_string.restype = ctypes.c_char_p
header = open(os.path.join(copy, "include", "distckpt", "distckpt.h")).read()
major, minor, patch = (int(re.search(rf"#define DCKPT_VERSION_{k} (\d+)", header).group(1))
                       for k in ("MAJOR", "MINOR", "PATCH"))
assert lib.dckpt_version() == major * 10000 + minor * 100 + patch, (lib.dckpt_version(), major, minor, patch)
assert lib.dckpt_version_string().decode() == f"{major}.{minor}.{patch}", lib.dckpt_version_string()
new = {p.strip() for p in mapped() - before}
foreign = sorted(p for p in new if not p.startswith(copy + "/") and not runtime.match(os.path.basename(p)))
assert not foreign, f"mapped from outside the copy: {foreign}"
gloo = sorted(p for p in new if "gloo" in os.path.basename(p) or "/distckpt.libs/" in p)
assert not gloo, f"loading the library mapped Gloo: {gloo}"
print(f"dckpt_version() = {lib.dckpt_version()}; mapped from the copy:",
      sorted(os.path.basename(p) for p in new if p.startswith(copy)))
PY
check "ctypes: dckpt_version() of the copy matches its header; /proc/self/maps: the copy's library and no Gloo" $?
finish portable_lib
