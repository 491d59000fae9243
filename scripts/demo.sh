#!/usr/bin/env bash
# The main job: 4 ranks (processes, Gloo over loopback TCP) save a transformer-like state, half of it replicated;
# then 3 ranks load it with a different sharding, check every value and print a summary.
# Extra arguments go to the demo binary (see examples/transformer_demo.cc), e.g. --hidden 1024 --dir /data/demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
if ! out=$(bazel build -c opt //examples:transformer_demo //tools/launcher:launch 2>&1); then
  echo "$out" | grep -v linux-sandbox | tail -40
  exit 1
fi
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
"$bin/tools/launcher/launch" -n 4 --timeout 600 -- "$bin/examples/transformer_demo" --mode save "$@"
"$bin/tools/launcher/launch" -n 3 --timeout 600 -- "$bin/examples/transformer_demo" --mode load "$@"
