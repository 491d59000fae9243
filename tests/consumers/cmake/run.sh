#!/usr/bin/env bash
# Builds the CMake consumer (CMakeLists.txt here: find_package(distckpt), distckpt::distckpt and distckpt::static)
# outside the repository against a private install tree with only CMAKE_PREFIX_PATH set, and runs both programs: the
# shared one as built (the imported target's location must be enough to run it), the static one from a fresh
# directory with the install tree moved away and LD_LIBRARY_PATH unset. Ends with "cmake consumer: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.."
passed=0
failed=0
check() { if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "ok   $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi; }
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT
# shellcheck source=SCRIPTDIR/../portable.sh
source tests/consumers/portable.sh
command -v cmake >/dev/null || { echo "FAIL cmake is missing (scripts/install_deps.sh)"; echo "cmake consumer: 0 passed, 1 failed"; exit 1; }

mkdir -p "$work/src"
cp tests/consumers/cmake/CMakeLists.txt "$work/src/"
cp tests/consumers/c/main.c "$work/src/"
dist="$work/dist"
private_tree "$dist"
check "scripts/build_lib.sh lays out a private install tree ($dist)" $?

(cd "$work" && env -u LD_LIBRARY_PATH cmake -S src -B build -DCMAKE_PREFIX_PATH="$dist" -DCMAKE_BUILD_TYPE=Release \
  >"$work/configure.log" 2>&1) || cat "$work/configure.log"
check "cmake -DCMAKE_PREFIX_PATH=<tree>: find_package(distckpt 0.1) finds the tree" $?
(cd "$work" && cmake --build build >"$work/build.log" 2>&1) || cat "$work/build.log"
check "cmake --build: my_tool (distckpt::distckpt) and my_tool_static (distckpt::static) link" $?
env -u LD_LIBRARY_PATH "$work/build/my_tool" "$work/ckpt"
check "my_tool runs without LD_LIBRARY_PATH (the imported target's rpath) and reads back what it saved" $?
self_contained "$work/build/my_tool_static"
check "my_tool_static names no libdistckpt and no rpath (readelf -d)" $?
bin=$(fresh_copy "$work/build/my_tool_static" "$work")
tree_away "$dist"
(cd "$(dirname "$bin")" && env -u LD_LIBRARY_PATH ./my_tool_static "$work/ckpt-static")
check "my_tool_static from a fresh directory, install tree moved away: saves and reads back" $?
tree_back "$dist"
# A version the tree cannot satisfy is refused at configure time, as find_package's version files promise.
sed 's/find_package(distckpt 0.1 REQUIRED)/find_package(distckpt 99 REQUIRED)/' tests/consumers/cmake/CMakeLists.txt \
  > "$work/src/CMakeLists.txt"
out=$(cd "$work" && cmake -S src -B build99 -DCMAKE_PREFIX_PATH="$dist" 2>&1)
rc=$?
[[ $rc -ne 0 ]] && grep -q "version" <<<"$out"
check "find_package(distckpt 99) fails, naming the version it found" $?
echo "cmake consumer: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
