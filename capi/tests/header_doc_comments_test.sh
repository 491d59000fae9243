#!/bin/bash
# Fails if a function the public header declares (a line starting with DCKPT_API) has no doc comment right above it:
# a /* ... */ block that starts at the beginning of a line and ends on the line just before the declaration (no blank
# line between). Keeps "every function has a doc comment" (capi/API.md, "The header") true as functions are added.
set -euo pipefail
header="$1"
awk '
  # in_block: inside a comment block that started at column 0 and has not ended yet.
  /^\/\*/ { in_block = 1 }
  {
    if ($0 ~ /^DCKPT_API/) {
      total++
      if (!(prev_ends_doc)) {
        name = $0
        sub(/\(.*/, "", name)
        n = split(name, parts, /[ *]+/)
        printf "FAIL: %s:%d: %s has no doc comment right above it\n", FILENAME, NR, parts[n] > "/dev/stderr"
        bad++
      }
    }
    # The next line has a doc comment right above it if this line closes a block that started at column 0.
    prev_ends_doc = in_block && $0 ~ /\*\/[ \t]*$/
    if ($0 ~ /\*\/[ \t]*$/ || $0 !~ /^(\/\*| \*)/) in_block = 0
  }
  END {
    if (total == 0) { print "FAIL: no DCKPT_API functions found in " FILENAME > "/dev/stderr"; exit 1 }
    if (bad > 0) { printf "FAIL: %d of %d functions have no doc comment\n", bad, total > "/dev/stderr"; exit 1 }
    printf "all %d DCKPT_API functions have a doc comment\n", total
  }
' "$header"
