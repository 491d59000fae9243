#!/bin/bash
# The core needs nothing but the C and C++ runtimes at load time: Gloo (with hiredis, ibverbs and libnl) is the plugin
# libdistckpt_gloo.so, loaded on the first Gloo communicator; CUDA, NCCL and libcurl are loaded on first use too.
# Fails if a file given (libdistckpt.so, the Python extension) has any other DT_NEEDED entry, or needs a Gloo symbol.
set -euo pipefail
# The sanitizer runtimes count as runtimes in the --config=asan / tsan builds.
runtime_re='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|ld-linux-aarch64|libasan|libubsan|libtsan)\.so'
status=0
for lib in "$@"; do
  needed=$(readelf -d "$lib" | awk '/\(NEEDED\)/ {print $NF}' | tr -d '[]')
  echo "DT_NEEDED of $(basename "$lib"): $(echo $needed)"
  others=$(echo "$needed" | grep -Ev "$runtime_re" || true)
  if [[ -n $others ]]; then
    echo "FAIL: $lib needs more than the C and C++ runtimes at load time: $(echo $others)" >&2
    status=1
  fi
  if nm -D --undefined-only "$lib" | grep -E 'gloo|redis' >/dev/null; then
    echo "FAIL: $lib has undefined Gloo or hiredis symbols (they belong in the plugin):" >&2
    nm -D --undefined-only "$lib" | grep -E 'gloo|redis' | head >&2
    status=1
  fi
done
exit $status
