#!/usr/bin/env bash
# Builds the metadata fuzzer with clang-14 (libFuzzer + ASan + UBSan) outside Bazel and runs it.
#   core/format/fuzz/run.sh [seconds=60] [extra libFuzzer flags...]
# Needs clang-14, libclang-rt-14-dev, flatbuffers-compiler, libflatbuffers-dev, libxxhash-dev.
# The corpus lives in $FUZZ_DIR (default /tmp/distckpt-metadata-fuzz); crashes are written there too.
set -euo pipefail
seconds="${1:-60}"
shift || true
root="$(cd "$(dirname "$0")/../../.." && pwd)"
work="${FUZZ_DIR:-/tmp/distckpt-metadata-fuzz}"
mkdir -p "$work/gen/core/format" "$work/corpus"
flatc --cpp --scoped-enums -o "$work/gen/core/format" "$root/core/format/schema.fbs"

cxx=(clang++-14 -std=c++17 -O1 -g -fno-omit-frame-pointer -I"$root" -I"$work/gen")
lib_srcs=("$root"/core/format/metadata.cc "$root"/core/format/checksum.cc
          "$root"/core/base/box.cc "$root"/core/base/dtype.cc "$root"/core/base/status.cc)
san=(-fsanitize=address,undefined -fno-sanitize-recover=undefined)

"${cxx[@]}" "${san[@]}" -fsanitize=fuzzer "${lib_srcs[@]}" "$root/core/format/fuzz/metadata_fuzz.cc" \
    -lxxhash -o "$work/metadata_fuzz"
"${cxx[@]}" "${lib_srcs[@]}" "$root/core/format/metadata_test_util.cc" "$root/core/format/fuzz/make_seeds.cc" \
    -lxxhash -o "$work/make_seeds"
"$work/make_seeds" "$work/corpus"

cd "$work"
exec ./metadata_fuzz -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    "$@" corpus
