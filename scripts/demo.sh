#!/usr/bin/env bash
# The main job: save a transformer-like state sharded one way, load it resharded, verify every value, print a summary.
# Extra arguments go to the demo binary (see examples/transformer_demo.cc).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
if ! out=$(bazel build -c opt //examples:transformer_demo 2>&1); then
  echo "$out" | grep -v linux-sandbox | tail -40
  exit 1
fi
"$(bazel info -c opt bazel-bin 2>/dev/null)/examples/transformer_demo" "$@"
