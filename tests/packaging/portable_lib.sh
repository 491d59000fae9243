#!/usr/bin/env bash
# The portable install tree of scripts/build_lib.sh, checked as a machine without this checkout would see it:
#   - lib/libdistckpt.so and every file in lib/distckpt.libs/ need only the C/C++ runtimes and each other (readelf),
#     find each other through $ORIGIN only, and each vendored file's soname is its file name;
#   - share/distckpt/PORTABILITY names exactly the vendored files, and its newest GLIBC_ / GLIBCXX_ versions are what
#     objdump finds (so nothing needs a newer glibc than it says);
#   - the library exports exactly capi/exported_symbols.txt (capi/tests/exported_symbols_test.sh);
#   - a copy of the tree in a fresh directory (the original removed) works with LD_LIBRARY_PATH unset:
#     tests/consumers/c/main.c, compiled against the copy's header and linked to the copy, saves and loads back
#     resharded, and LD_DEBUG shows that every library it loaded is a runtime or a file of the copy; python's ctypes
#     loads the copy, dckpt_version() matches the copy's header, and /proc/self/maps shows the vendored files mapped
#     from the copy (the system's libgloo and friends are installed here, and must not be used).
# Ends with "portable_lib: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/packaging/common.sh
work=$(mktemp -d)
copy=$(mktemp -d)
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

deps_ok "$so"
check "libdistckpt.so needs only the runtimes and distckpt.libs/" $?
[[ $(search_path "$so") == '$ORIGIN/distckpt.libs' ]]
check "libdistckpt.so's RUNPATH is \$ORIGIN/distckpt.libs" $?
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
for what in "glibc (libdistckpt.so)=GLIBC_ $so" "glibc (with distckpt.libs)=GLIBC_ $so $libs/*" \
    "glibcxx (with distckpt.libs)=GLIBCXX_ $so $libs/*"; do
  key=${what%%=*}
  args=${what#*=}
  recorded=$(grep -F "$key: " "$record" | sed 's/.*: //')
  # shellcheck disable=SC2086  # the file list is meant to be split (and globbed)
  found=$(newest $args)
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
loaded=$(cat "$work"/ld.* 2>/dev/null | sed -n 's/.*calling init: //p' | sort -u)
foreign=$(echo "$loaded" | while read -r p; do
  [[ -z $p || $p == "$copy/"* || $(basename "$p") =~ $runtime_re ]] || echo "$p"
done)
from_copy=$(echo "$loaded" | grep -c "^$copy/lib/")
[[ -n $foreign ]] && echo "  loaded from outside the copy: $foreign"
[[ -z $foreign && $from_copy -eq $(($(echo "$vendored" | wc -w) + 1)) ]]
check "LD_DEBUG: libdistckpt.so and the vendored files came from the copy ($from_copy), the rest are runtimes" $?

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
vendored = set(os.listdir(os.path.join(copy, "lib", "distckpt.libs")))
assert {os.path.basename(p) for p in new if p.startswith(copy + "/lib/distckpt.libs/")} == vendored, new
print(f"dckpt_version() = {lib.dckpt_version()}; mapped from the copy:",
      sorted(os.path.basename(p) for p in new if p.startswith(copy)))
PY
check "ctypes: dckpt_version() of the copy matches its header; /proc/self/maps: vendored files from the copy" $?
finish portable_lib
