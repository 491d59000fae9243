#!/usr/bin/env bash
# Runs the Go suite: installs golang-go if it is missing (Debian, quiet when present), builds libdistckpt.so with
# scripts/build_lib.sh, points cgo (pkg-config) and the loader at it, then runs `go vet ./...` and `go test ./...`.
# Exits with go test's status (or vet's, if vet fails). Ends with "go tests: N passed, M failed, K skipped".
set -uo pipefail
cd "$(dirname "$0")"

if ! command -v go >/dev/null 2>&1; then
  echo "run_tests: installing golang-go" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -y -qq --no-install-recommends golang-go pkg-config >/dev/null \
    || { echo "run_tests: could not install golang-go" >&2; exit 1; }
fi

root=$(../scripts/build_lib.sh) || { echo "run_tests: scripts/build_lib.sh failed" >&2; exit 1; }
export PKG_CONFIG_PATH="$root/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GOPROXY=off GOFLAGS=-buildvcs=false GO111MODULE=on

go vet ./... || { echo "go tests: 0 passed, 1 failed, 0 skipped (go vet)"; exit 1; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT
go test -count=1 -v ./... >"$log" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then
  cat "$log"
else
  grep -E "^(ok|FAIL|---|\?)\s" "$log" | grep -vE "^--- (PASS|SKIP)" || true
  grep -E "^\s*--- SKIP" -A1 "$log" || true
fi
passed=$(grep -cE "^\s*--- PASS" "$log")
failed=$(grep -cE "^\s*--- FAIL" "$log")
skipped=$(grep -cE "^\s*--- SKIP" "$log")
if [[ $rc -ne 0 && $failed -eq 0 ]]; then failed=1; fi  # a build failure or a panic outside a test
echo "go tests: $passed passed, $failed failed, $skipped skipped"
exit $rc
