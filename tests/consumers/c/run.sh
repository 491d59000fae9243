#!/usr/bin/env bash
# Builds tests/consumers/c/main.c the way the README's "Using it from C" section tells a user to, in a directory
# outside the repository, and runs it with LD_LIBRARY_PATH unset (the .pc file's rpath must be enough).
# Ends with "c consumer: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.."
passed=0
failed=0
check() { if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "ok   $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp tests/consumers/c/main.c "$work/"

# The README's steps, verbatim.
export PKG_CONFIG_PATH=$(scripts/build_lib.sh)/lib/pkgconfig
check "scripts/build_lib.sh" $?
(cd "$work" && cc -std=c99 -Wall -Wextra -Werror main.c $(pkg-config --cflags --libs distckpt) -o my_tool)
check "cc main.c \$(pkg-config --cflags --libs distckpt)" $?
(cd "$work" && env -u LD_LIBRARY_PATH ./my_tool "$work/ckpt")
check "the program runs without LD_LIBRARY_PATH and reads back what it saved" $?
echo "c consumer: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
