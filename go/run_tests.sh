#!/usr/bin/env bash
# Runs the Go suite: installs golang-go if it is missing (Debian, quiet when present), builds libdistckpt with
# scripts/build_lib.sh, points cgo (pkg-config) and the loader at it, then runs `go vet ./...` and `go test ./...`
# (the default build: libdistckpt.so through distckpt.pc). Then a module of a user's own (tests/consumers/go), copied
# outside the repository and built with only the steps README.md gives (cold build cache) with -tags distckpt_static,
# its binary copied to a fresh directory and run with LD_LIBRARY_PATH unset and the install tree moved away; and the
# CLI built static with both tags and the flags from the environment; each of these checks counts as a test.
# Exits non-zero if vet, a test or a consumer check failed. Ends with "go tests: N passed, M failed, K skipped".
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

log=$(mktemp) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -f "$log"; chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
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

# A user's module, as README.md "Use it from your own module" sets one up: a copy of tests/consumers/go in a fresh
# temporary directory, its replace directive pointed at this go/ directory. Built with the README's environment only
# (PKG_CONFIG_PATH, GOPROXY=off) in an otherwise empty one: a fresh HOME (no go env file, GOPATH and module cache
# inside it) and a cold GOCACHE, so that a warm cache (which skips pkg-config) cannot hide a missing step. The
# install tree it builds against is a private one in the temporary directory (tests/consumers/portable.sh says why),
# so that it can be moved away while the binary runs.
consumer() {  # consumer DESCRIPTION STATUS
  if [[ $2 -eq 0 ]]; then
    passed=$((passed + 1)); echo "ok   consumer: $1"
  else
    failed=$((failed + 1)); echo "FAIL consumer: $1"
  fi
}
# shellcheck source=../tests/consumers/portable.sh
source ../tests/consumers/portable.sh
dist="$work/dist"
readme_env() {
  env -i PATH="$PATH" HOME="$work/home" GOCACHE="$work/gocache" \
    PKG_CONFIG_PATH="$dist/lib/pkgconfig" GOPROXY=off "$@"
}
echo "== tests/consumers/go: a module outside the repository, built as README.md says (-tags distckpt_static), run from a copy"
private_tree "$dist"
consumer "scripts/build_lib.sh lays out a private install tree ($dist)" $?
cp -R ../tests/consumers/go "$work/consumer"
mkdir -p "$work/home"
sed -i "s|^replace distckpt.dev/go => .*|replace distckpt.dev/go => $PWD|" "$work/consumer/go.mod"
(cd "$work/consumer" && readme_env go build -tags distckpt_static -o "$work/ckpt-operator" . 2>&1 | tail -20
 exit "${PIPESTATUS[0]}")
consumer "go build -tags distckpt_static (PKG_CONFIG_PATH and GOPROXY=off only, cold build cache)" $?
(cd "$work/consumer" && readme_env go vet -tags distckpt_static . 2>&1 | tail -20; exit "${PIPESTATUS[0]}")
consumer "go vet -tags distckpt_static" $?
bin=$(fresh_copy "$work/ckpt-operator" "$work")
self_contained "$bin"
consumer "its binary names no libdistckpt and no rpath (readelf -d)" $?
st="$work/store"
tree_away "$dist"
env -u LD_LIBRARY_PATH "$bin" make "$st" 100 200 300 >/dev/null && cp -R ../tests/fixtures/mlp "$st/step-1000"
consumer "a copy in a fresh directory, install tree moved away, no LD_LIBRARY_PATH: saves step-100..300 (distckpt.Save); tests/fixtures/mlp copied as step-1000" $?
expect=(--keep-last 2 --expect-steps 100,200,300,1000 --expect-prune step-100,step-200)
env -u LD_LIBRARY_PATH "$bin" check "${expect[@]}" "$st"
consumer "check: store.List, Reader.Verify with progress, Reader.Value, store.Prune dry run, all as expected" $?
env -u LD_LIBRARY_PATH "$bin" check --keep-last 2 --expect-steps 100,200 --expect-prune step-100,step-200 "$st" \
  >/dev/null
[[ $? -eq 1 ]]
consumer "check exits 1 when the steps are not the expected ones" $?
head -c 4096 /dev/zero | tr '\0' '\252' | dd of="$st/step-200/data-00000.bin" bs=4096 count=1 conv=notrunc 2>/dev/null
env -u LD_LIBRARY_PATH "$bin" check "${expect[@]}" "$st" | grep MISMATCH
[[ ${PIPESTATUS[0]} -eq 1 ]]
consumer "check exits 1 after a data file of step-200 was overwritten (Verify names the bad chunk)" $?
tree_back "$dist"

# Static without pkg-config (link_static.go): both tags, the whole link given in CGO_LDFLAGS, as README.md shows.
echo "== cmd/distckpt built with -tags \"distckpt_static distckpt_nopkgconfig\" and CGO_CFLAGS / CGO_LDFLAGS"
(cd "$work/consumer" && env -u PKG_CONFIG_PATH CGO_CFLAGS="-I$dist/include" \
   CGO_LDFLAGS="$dist/lib/libdistckpt.a -lm -ldl -pthread" \
   go build -tags "distckpt_static distckpt_nopkgconfig" -o "$work/distckpt-env" distckpt.dev/go/cmd/distckpt 2>&1 |
   tail -20; exit "${PIPESTATUS[0]}")
consumer "go build -tags \"distckpt_static distckpt_nopkgconfig\" with the flags in the environment, no pkg-config" $?
bin=$(fresh_copy "$work/distckpt-env" "$work") && self_contained "$bin" && tree_away "$dist" &&
  env -u LD_LIBRARY_PATH "$bin" verify ../tests/fixtures/mlp
consumer "its binary, self-contained, from a copy with the install tree moved away: distckpt verify tests/fixtures/mlp" $?
tree_back "$dist"

echo "go tests: $passed passed, $failed failed, $skipped skipped"
[[ $rc -eq 0 && $failed -eq 0 ]]
