#!/usr/bin/env bash
# Installs what distckpt needs on Debian 12, from Debian's packages only. Idempotent and quiet: when everything is
# already installed it does nothing (no apt-get update).
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-platforms bazel-skylib      # Bazel 4.2.3 (offline) + its local repositories
  g++ pkg-config
  libflatbuffers-dev flatbuffers-compiler            # FlatBuffers 2.0.8 (metadata)
  libgloo-dev libhiredis-dev                          # Gloo (TCP collectives, FileStore/RedisStore rendezvous)
  libgtest-dev libgmock-dev libbenchmark-dev          # tests and micro-benchmarks
  libxxhash-dev                                       # xxHash3-64 checksums
  libzstd-dev                                         # zstd for compressed chunks (its static archive, in the core)
  redis-server iproute2                               # Redis rendezvous tests, network-namespace tests
  libcurl4                                            # S3 storage (libcurl, loaded at run time)
  fio                                                 # measuring the disk in benchmarks
  pybind11-dev python3-dev python3-venv               # the Python extension (bindings/) and python/run_tests.sh
  bindgen libclang-dev                                # distckpt-sys: regenerating bindings, and the staleness test
  librust-half-dev librust-serde-dev                  # the distckpt crate's optional features half and serde, and
  librust-serde-derive-dev librust-serde-json-dev     #   its tests: /usr/share/cargo/registry (rust/run_tests.sh)
  patchelf                                            # the portable install tree (scripts/build_lib.sh) and the wheel
  clang-14 libclang-rt-14-dev                         # scripts/fuzz.sh: libFuzzer, ASan and UBSan
  clang-format                                        # scripts/format_check.sh (.clang-format), in scripts/test.sh
  golang-go                                           # the Go package and CLI (go/), before pytest: its CLI tests
  cmake                                               # tests/consumers/cmake (find_package(distckpt))
  ccache                                              # tests/packaging/venvs.sh: the binding built by g++, cached
  debootstrap                                         # tests/packaging: Debian 11 and arm64 roots (chroot.sh)
  qemu-user-static                                    # tests/packaging/aarch64.sh: arm64 programs under qemu-user
  g++-aarch64-linux-gnu binutils-aarch64-linux-gnu    # --config=gcc_aarch64 (the AArch64 Gloo plugin, tests)
)

missing=()
for p in "${PACKAGES[@]}"; do
  [[ "$p" == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
