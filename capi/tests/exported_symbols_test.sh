#!/bin/bash
# Fails if libdistckpt.so exports anything but the committed list of dckpt_* symbols (capi/exported_symbols.txt).
# Adding a symbol: append it to the list. Removing or renaming one breaks the ABI promise: don't.
set -euo pipefail
lib="$1"
expected="$2"
actual=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sed 's/@.*//' | sort -u)
if ! diff -u <(grep -v '^#' "$expected" | sed '/^$/d' | sort -u) <(echo "$actual"); then
  echo "FAIL: exported symbols of $lib differ from $expected (- expected, + actual)" >&2
  exit 1
fi
echo "exported symbols match ($(echo "$actual" | wc -l) symbols)"
