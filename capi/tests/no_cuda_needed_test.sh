#!/bin/bash
# One libdistckpt.so serves machines with and without GPUs: the default build must not need CUDA to load. Fails if
# the library has a DT_NEEDED entry for the CUDA driver, runtime or NCCL (they are dlopen'ed on first use instead).
set -euo pipefail
lib="$1"
needed=$(readelf -d "$lib" | awk '/\(NEEDED\)/ {print $NF}' | tr -d '[]')
echo "DT_NEEDED of $(basename "$lib"): $(echo $needed)"
if echo "$needed" | grep -Ei '^(libcuda|libcudart|libnccl|libnvidia)' >/dev/null; then
  echo "FAIL: $lib links against CUDA at load time; device support must be loaded at run time (core/cuda)" >&2
  exit 1
fi
if nm -D --undefined-only "$lib" | grep -E ' (cu|cuda|nccl)[A-Z]' >/dev/null; then
  echo "FAIL: $lib has undefined CUDA symbols:" >&2
  nm -D --undefined-only "$lib" | grep -E ' (cu|cuda|nccl)[A-Z]' >&2
  exit 1
fi
echo "no CUDA dependency at load time"
