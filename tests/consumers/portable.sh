# shellcheck shell=bash
# Sourced by rust/run_tests.sh, go/run_tests.sh and tests/consumers/c/run.sh. Each builds its consumer against the
# static library and checks that the binary is portable: it names no libdistckpt and no rpath, and it runs from a
# copy in a fresh directory with LD_LIBRARY_PATH unset and the install tree it was built against moved away.
#
# That tree is a private one, laid out by scripts/build_lib.sh (DISTCKPT_DIST) inside the runner's temporary
# directory, rather than the repository's build/dist: other suites (tests/crosslang, tests/crash, the Python build)
# read build/dist and may run at the same time in the same checkout, and renaming it under them would fail them.
# A binary built against the private tree knows no other one, so moving it away shows the same thing; and the
# runner's EXIT trap removes its temporary directory, the moved tree with it, whatever happens.

# private_tree DIR: lays the install tree out in DIR (quiet; fails as scripts/build_lib.sh does).
private_tree() {
  DISTCKPT_DIST="$1" "$(dirname "${BASH_SOURCE[0]}")/../../scripts/build_lib.sh" >/dev/null
}

# fresh_copy BIN WORK: copies BIN into a new directory under WORK and prints the copy's path.
fresh_copy() {
  local dir
  dir=$(mktemp -d "$2/fresh.XXXXXX") && cp "$1" "$dir/" && echo "$dir/$(basename "$1")"
}

# self_contained BIN: whether BIN's dynamic section names neither libdistckpt nor an rpath (prints what it finds).
self_contained() {
  local dyn
  dyn=$(readelf -d "$1") || return 1
  ! grep -E "libdistckpt|\((RPATH|RUNPATH)\)" <<<"$dyn"
}

# tree_away TREE / tree_back TREE: renames the install tree to TREE.away and back.
tree_away() { mv "$1" "$1.away"; }
tree_back() { if [[ -d $1.away ]]; then mv "$1.away" "$1"; fi; }

# run_ranks N PROGRAM ARGS...: runs N copies of PROGRAM as the ranks of one Gloo group on loopback (DCKPT_RANK,
# DCKPT_WORLD_SIZE and a fresh file:// DCKPT_RENDEZVOUS in the environment, as a launcher would set them); fails if
# any rank fails. A function, so the caller sets or unsets the rest of the environment in a subshell around it.
run_ranks() {
  local n=$1 rendezvous rank status=0
  shift
  rendezvous=$(mktemp -d) || return 1
  local pids=()
  for ((rank = 0; rank < n; rank++)); do
    DCKPT_RANK=$rank DCKPT_WORLD_SIZE=$n DCKPT_RENDEZVOUS="file://$rendezvous" DCKPT_GLOO_HOSTNAME=127.0.0.1 \
      DCKPT_TIMEOUT_MS=60000 "$@" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  rm -rf "$rendezvous"
  return $status
}
