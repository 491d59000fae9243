#!/usr/bin/env bash
# Builds tests/consumers/c/main.c the way the README's "Using it from C" section tells a user to, in a directory
# outside the repository, and runs it with LD_LIBRARY_PATH unset (the .pc file's rpath must be enough); gloo.c the
# same way, run as 2 ranks over Gloo (the plugin found beside libdistckpt.so). Then both programs linked statically
# (pkg-config distckpt-static) against a private install tree, run from copies in a fresh directory with
# LD_LIBRARY_PATH unset and that tree moved away (tests/consumers/portable.sh): main.c as it is; gloo.c refused with
# nothing beside it, then with the plugin and its distckpt.libs/ copied beside it, then (the tree back) with
# DCKPT_GLOO_PLUGIN. Then s3.c, built the same shared way, against a moto S3 server on loopback (with_moto.py;
# skipped, saying so, without the repository's venv, which python/run_tests.sh makes).
# Ends with "c consumer: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../../.."
passed=0
failed=0
check() { if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "ok   $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi; }
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT
cp tests/consumers/c/main.c tests/consumers/c/gloo.c tests/consumers/c/s3.c "$work/"
# shellcheck source=SCRIPTDIR/../portable.sh
source tests/consumers/portable.sh

# The README's steps, verbatim.
export PKG_CONFIG_PATH=$(scripts/build_lib.sh)/lib/pkgconfig
check "scripts/build_lib.sh" $?
(cd "$work" && cc -std=c99 -Wall -Wextra -Werror main.c $(pkg-config --cflags --libs distckpt) -o my_tool)
check "cc main.c \$(pkg-config --cflags --libs distckpt)" $?
(cd "$work" && env -u LD_LIBRARY_PATH ./my_tool "$work/ckpt")
check "the program runs without LD_LIBRARY_PATH and reads back what it saved" $?
# The flags before the sources link too (Debian's gcc links --as-needed).
(cd "$work" && cc -std=c99 $(pkg-config --cflags --libs distckpt) main.c -o my_tool_flags_first &&
  env -u LD_LIBRARY_PATH ./my_tool_flags_first "$work/ckpt-flags-first")
check "cc \$(pkg-config --cflags --libs distckpt) main.c (flags first) links and runs" $?
(cd "$work" && cc -std=c99 -Wall -Wextra -Werror gloo.c $(pkg-config --cflags --libs distckpt) -o my_gloo_tool)
check "cc gloo.c \$(pkg-config --cflags --libs distckpt)" $?
(cd "$work" && unset LD_LIBRARY_PATH DCKPT_GLOO_PLUGIN && run_ranks 2 ./my_gloo_tool "$work/ckpt-gloo")
check "2 ranks of it over Gloo save and read each other's rows back (the plugin found beside libdistckpt.so)" $?

# README.md's "Using it from C" program, as pasted (issue 38: it must compile as it stands), built with the README's
# command; its "/ckpt/" becomes a directory of $work that does not exist yet, which the save makes.
awk '/^## Using it from C/ { section = 1 } section && /^```c$/ { inside = 1; next } inside && /^```$/ { exit }
     inside { print }' README.md | sed "s|\"/ckpt/|\"$work/readme-ckpt/|" >"$work/my_tool.c"
grep -q "int main" "$work/my_tool.c"
check "README.md's C snippet is a whole program (extracted to my_tool.c)" $?
(cd "$work" && cc -std=c99 -Wall -Wextra -Werror -pedantic my_tool.c $(pkg-config --cflags --libs distckpt) -o my_tool_readme &&
  env -u LD_LIBRARY_PATH ./my_tool_readme && [[ -f $work/readme-ckpt/step-100/metadata.dckpt ]])
check "README.md's C program compiles as pasted, runs, and saves where no directory existed" $?

# The static archive: the binary carries the library and needs only the C/C++ runtimes; Gloo is the plugin, looked for
# beside the executable or named by DCKPT_GLOO_PLUGIN.
dist="$work/dist"
private_tree "$dist"
check "scripts/build_lib.sh lays out a private install tree ($dist)" $?
(cd "$work" && cc -std=c99 -Wall -Wextra -Werror main.c \
  $(PKG_CONFIG_PATH="$dist/lib/pkgconfig" pkg-config --cflags --libs distckpt-static) -o my_tool_static)
check "cc main.c \$(pkg-config --cflags --libs distckpt-static)" $?
self_contained "$work/my_tool_static"
check "the static program names no libdistckpt and no rpath (readelf -d)" $?
(cd "$work" && cc -std=c99 -Wall -Wextra -Werror gloo.c \
  $(PKG_CONFIG_PATH="$dist/lib/pkgconfig" pkg-config --cflags --libs distckpt-static) -o my_gloo_tool_static)
check "cc gloo.c \$(pkg-config --cflags --libs distckpt-static)" $?
needs=$(readelf -d "$work/my_gloo_tool_static" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p' | tr '\n' ' ')
! grep -qE "gloo|hiredis" <<<"$needs"
check "the static Gloo program needs no gloo or hiredis at load time (NEEDED: $needs)" $?
bin=$(fresh_copy "$work/my_tool_static" "$work")
gloo_bin=$(fresh_copy "$work/my_gloo_tool_static" "$work")
tree_away "$dist"
(cd "$(dirname "$bin")" && env -u LD_LIBRARY_PATH ./my_tool_static "$work/ckpt-static")
check "a copy in a fresh directory, install tree moved away, no LD_LIBRARY_PATH: saves and reads back" $?
(cd "$(dirname "$gloo_bin")" && env -u LD_LIBRARY_PATH -u DCKPT_GLOO_PLUGIN DCKPT_RANK=0 DCKPT_WORLD_SIZE=1 \
  DCKPT_RENDEZVOUS="file://$work/rdv-none" ./my_gloo_tool_static "$work/ckpt-none" --expect-no-plugin)
check "the static Gloo program with no plugin beside it: DCKPT_EUNSUPPORTED naming DCKPT_GLOO_PLUGIN and the alternatives" $?
cp -R "$dist.away/lib/libdistckpt_gloo.so" "$dist.away/lib/distckpt.libs" "$(dirname "$gloo_bin")/"
(cd "$(dirname "$gloo_bin")" && unset LD_LIBRARY_PATH DCKPT_GLOO_PLUGIN && run_ranks 2 ./my_gloo_tool_static "$work/ckpt-static-gloo")
check "the same copy with libdistckpt_gloo.so and distckpt.libs/ beside it: 2 ranks over Gloo" $?
tree_back "$dist"
rm -rf "$(dirname "$gloo_bin")/libdistckpt_gloo.so" "$(dirname "$gloo_bin")/distckpt.libs"
(cd "$(dirname "$gloo_bin")" && unset LD_LIBRARY_PATH && export DCKPT_GLOO_PLUGIN="$dist/lib/libdistckpt_gloo.so" &&
  run_ranks 2 ./my_gloo_tool_static "$work/ckpt-static-gloo-env")
check "the same copy, nothing beside it, DCKPT_GLOO_PLUGIN=<tree>/lib/libdistckpt_gloo.so: 2 ranks over Gloo" $?

# S3: the same program shape on "s3://bucket/prefix" URLs with no storage handle, the endpoint and credentials in the
# AWS_* environment (with_moto.py starts the server, makes the bucket and sets them).
if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import moto.server" 2>/dev/null; then
  (cd "$work" && cc -std=c99 -Wall -Wextra -Werror s3.c $(pkg-config --cflags --libs distckpt) -o my_s3_tool)
  check "cc s3.c \$(pkg-config --cflags --libs distckpt)" $?
  env -u LD_LIBRARY_PATH .venv/bin/python tests/consumers/c/with_moto.py c-consumer \
    "$work/my_s3_tool" s3://c-consumer/run1/step-100
  check "s3.c on a moto server: saves to s3://c-consumer/run1/step-100, reads every value back, lists, stats, removes; a missing checkpoint is ENOTFOUND naming its URL, gs:// is EUNSUPPORTED" $?
else
  echo "SKIPPED: s3.c: no .venv/bin/python with moto.server (python/run_tests.sh makes it); not counted"
fi
echo "c consumer: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
