#!/usr/bin/env bash
# The metadata fuzzer alone: core/format/fuzz/run.sh [seconds=60]. See scripts/fuzz.sh, which builds and runs every
# fuzz target.
exec "$(cd "$(dirname "$0")/../../.." && pwd)/scripts/fuzz.sh" "${1:-60}" metadata
