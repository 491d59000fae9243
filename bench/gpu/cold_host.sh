#!/usr/bin/env bash
# The cold device load's read side, on a machine without a GPU: the Rust inference server's load
# (rust/distckpt/examples/gpu_load.rs) of a 1 GiB float16 checkpoint into the core's fake CUDA driver (host memory
# standing in for device memory; the real copy engine, pinned staging, verification of every byte), from a file
# evicted from the page cache before each run (posix_fadvise DONTNEED after fdatasync), with direct reads (O_DIRECT,
# the default) and without (DCKPT_DIRECT_IO=0), against fio's O_DIRECT sequential read of the same file (16 MiB
# blocks, 4 in flight: the disk's limit), each the median of --runs in rotating order. No GPU figure: on a GPU the
# copies go over PCIe (bench/gpu/gpu_bench.py, scripts/gpu_check.sh step 7).
#
#   bench/gpu/cold_host.sh [--dir DIR (default /var/tmp)] [--runs 3]
# Prints a Markdown table and the ratios.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=/var/tmp
runs=3
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "usage: bench/gpu/cold_host.sh [--dir DIR] [--runs N]" >&2; exit 2 ;;
  esac
done
py=.venv/bin/python
command -v fio >/dev/null || { echo "cold_host.sh: fio is not installed (apt-get install fio)" >&2; exit 1; }
root=$(scripts/build_lib.sh)
bazel build -c opt //core/cuda:libfake_cuda.so >/dev/null 2>&1
fake="$(bazel info -c opt bazel-bin 2>/dev/null)/core/cuda/libfake_cuda.so"
(cd rust && DISTCKPT_LIB_DIR="$root/lib" cargo build --release --offline --config debian-registry.toml -q -p distckpt \
  --example gpu_load)
load=rust/target/release/examples/gpu_load
ck=$(mktemp -d "$dir/distckpt-cold.XXXXXX") || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -rf "$ck"' EXIT
"$py" -c "
import sys, numpy as np, distckpt
rng = np.random.default_rng(0)
distckpt.save({f'layer{i}.w': rng.standard_normal((2048, 4096), dtype=np.float32).astype(np.float16)
               for i in range(64)}, sys.argv[1] + '/ckpt')" "$ck"
evict() {
  "$py" -c "
import os, sys
for d, _, fs in os.walk(sys.argv[1]):
    for f in fs:
        fd = os.open(os.path.join(d, f), os.O_RDONLY); os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)" "$ck/ckpt"
}
seconds_of_load() { grep -o 'in [0-9.]* s' | awk '{print $2}'; }
declare -a direct buffered fio_s
for ((r = 0; r < runs; r++)); do
  for what in direct buffered fio; do
    evict
    case $what in
      direct) direct+=("$(DCKPT_CUDA_DRIVER_LIBRARY=$fake $load "$ck/ckpt" | tail -1 | seconds_of_load)") ;;
      buffered) buffered+=("$(DCKPT_DIRECT_IO=0 DCKPT_CUDA_DRIVER_LIBRARY=$fake $load "$ck/ckpt" | tail -1 | seconds_of_load)") ;;
      fio) fio_s+=("$(fio --name=cold --filename="$ck/ckpt/data-00000.bin" --rw=read --bs=16M --direct=1 \
        --ioengine=libaio --iodepth=4 --readonly --output-format=json | "$py" -c "
import json, sys
j = json.load(sys.stdin)['jobs'][0]['read']
print(j['io_bytes'] / (j['bw_bytes'] or 1))")") ;;
    esac
  done
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
d=$(median "${direct[@]}") b=$(median "${buffered[@]}") f=$(median "${fio_s[@]}")
gib=1.0
echo "| 1 GiB, cold (evicted), into the fake driver | seconds | GB/s | vs fio O_DIRECT |"
echo "|---|---|---|---|"
awk -v d="$d" -v b="$b" -v f="$f" 'BEGIN {
  printf "| fio, O_DIRECT sequential read, 16 MiB x 4 in flight (the limit) | %.3f | %.2f | 1.00x |\n", f, 1.073741824 / f
  printf "| distckpt gpu_load, direct reads (default) | %.3f | %.2f | %.2fx the time |\n", d, 1.073741824 / d, d / f
  printf "| distckpt gpu_load, DCKPT_DIRECT_IO=0 (buffered) | %.3f | %.2f | %.2fx the time |\n", b, 1.073741824 / b, b / f
}'
echo "runs: direct ${direct[*]}; buffered ${buffered[*]}; fio ${fio_s[*]} (s)"
