# shellcheck shell=bash disable=SC2034  # (runtime_re is for the scripts that source this)
# Sourced by the packaging tests (tests/packaging/*.sh): counting, the closing line, and the ELF facts they read.

passed=0
failed=0

check() {  # NAME STATUS: an "ok" or "FAIL" line, counted
  if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "ok   $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi
}

finish() {  # LABEL: the closing "LABEL: N passed, M failed"; the status says whether anything failed
  echo "$1: $passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}

# The C and C++ runtimes every Linux has (the manylinux policy's list), as sonames and as file names.
runtime_re='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so(\.[0-9]+)*$'

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'; }               # FILE: its DT_NEEDED entries
soname() { readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p'; }               # FILE: its DT_SONAME
search_path() { readelf -d "$1" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]$/\2/p' | tr ':' '\n'; }  # one a line
