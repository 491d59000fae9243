#!/usr/bin/env bash
# Runs the Rust suite from a fresh clone: builds libdistckpt.a and .so (scripts/build_lib.sh, Bazel offline), points
# cargo at them, runs `cargo test --offline --workspace` in the default mode, which links the static archive (bindings
# staleness and C layout checks, the safe crate's unit and integration tests against tests/fixtures and tests/golden,
# the code blocks of README.md and ../README.md as doctests, the serve example compared with its reference, and
# tests/s3.rs against a moto S3 server from ../.venv), then the same tests with the `shared` feature (libdistckpt.so),
# then with the `half` and `serde` features (tests/half.rs, tests/serde.rs and the unit tests behind them on top of
# the rest), then shows the serve example's output, then runs the GPU load example (examples/gpu_load.rs) against the
# core's fake CUDA driver on five fixtures, comparing its digests read back from "device" memory with the digest
# example's (each a counted check). Then a crate of a user's own (tests/consumers/rust, which uses the
# `half` and `serde` features), copied outside the repository and every workspace, built with only the steps README.md
# gives, its binary copied to a fresh directory and run with LD_LIBRARY_PATH unset and the install tree moved away;
# then the same crate with the `shared` feature; then a crate that uses distckpt without features, built with no crate
# registry at all; each of their checks counts as a test. Before all that, `cargo fmt --check` against rustfmt.toml,
# one more test (or SKIPPED, saying so, where rustfmt is not installed), and `cargo clippy` where it is installed
# (warnings shown, not counted). Exits non-zero if anything failed. Last line: "rust: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")"

# The crates behind the optional features (half, serde; serde_json for tests) come from crates.io for users. There is
# no crates.io here: Debian packages them (scripts/install_deps.sh) into a directory that cargo can use as a source,
# so every cargo command of this script, and only these, replaces crates.io with it (debian-registry.toml, which
# cargo reads only when a command names it). The default build needs no crate at all (checked at the end), but cargo
# resolves a workspace's optional dependencies even when their features are off, so the workspace's own commands
# need the source whatever the features.
debian_registry=/usr/share/cargo/registry
debian_crates=(--config "$PWD/debian-registry.toml")
debian_version() {  # debian_version CRATE: the version of CRATE in Debian's registry (the newest, if several)
  compgen -G "$debian_registry/$1-[0-9]*" | sed "s|.*/$1-||" | sort -V | tail -1
}
if [[ -z $(debian_version half) || -z $(debian_version serde) || -z $(debian_version serde_json) ]]; then
  echo "rust/run_tests.sh: Debian's Rust crates are missing from $debian_registry (scripts/install_deps.sh installs them)" >&2
  echo "rust: 0 passed, 1 failed"
  exit 1
fi

if ! root=$(../scripts/build_lib.sh); then
  echo "rust/run_tests.sh: building libdistckpt.so failed (scripts/build_lib.sh)" >&2
  echo "rust: 0 passed, 1 failed"
  exit 1
fi
export DISTCKPT_LIB_DIR="$root/lib"
export PKG_CONFIG_PATH="$root/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# No LD_LIBRARY_PATH: static test binaries need none, and shared ones carry an rpath (build.rs).
# The static test binaries (cargo's target/debug/deps/) have no Gloo plugin beside them: the tests that join a Gloo
# group find it here, as README.md tells users of the static library. The `shared` run below unsets it, so that
# libdistckpt.so finds the plugin beside itself.
export DCKPT_GLOO_PLUGIN="$root/lib/libdistckpt_gloo.so"

log=$(mktemp) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
trap 'rm -f "$log"; rm -rf "$work"' EXIT

# Formatting: rustfmt.toml holds the style; a difference fails the run (fix it with `cargo fmt` in rust/).
fmt_passed=0
fmt_failed=0
if cargo fmt --version >/dev/null 2>&1; then
  echo "== cargo fmt --check ($(cargo fmt --version))"
  if cargo fmt --check; then
    fmt_passed=1; echo "ok   cargo fmt --check"
  else
    fmt_failed=1; echo "FAIL cargo fmt --check: the code differs from rustfmt.toml's style (above); run cargo fmt in rust/"
  fi
else
  echo "SKIPPED: cargo fmt --check (rustfmt is not installed: rustup component add rustfmt); not counted"
fi
if cargo clippy --version >/dev/null 2>&1; then
  echo "== cargo clippy --workspace --all-targets --features distckpt/half,distckpt/serde (shown, not counted)"
  cargo clippy --offline "${debian_crates[@]}" -q --workspace --all-targets --features distckpt/half,distckpt/serde 2>&1 | tail -40
fi
echo "== cargo test --offline --workspace (static: libdistckpt.a from $DISTCKPT_LIB_DIR)"
cargo test --offline "${debian_crates[@]}" --workspace 2>&1 | tee "$log" | grep -E "^(test |running|test result|     Running|error|warning: unused)|SKIPPED|panicked" || true
rc=${PIPESTATUS[0]}
echo "== cargo test --offline --workspace --features distckpt/shared (libdistckpt.so)"
env -u DCKPT_GLOO_PLUGIN cargo test --offline "${debian_crates[@]}" --workspace --features distckpt/shared 2>&1 | tee -a "$log" | grep -E "^(test result|     Running|error)|FAILED|SKIPPED" || true
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
echo "== cargo test --offline --workspace --features distckpt/half,distckpt/serde (Debian's half $(debian_version half), serde $(debian_version serde), serde_json $(debian_version serde_json))"
cargo test --offline "${debian_crates[@]}" --workspace --features distckpt/half,distckpt/serde 2>&1 | tee -a "$log" |
  grep -E "^(test result|     Running|error)|FAILED|SKIPPED|^test (float::tests::bf16|json::serde|dtype::tests::half)" || true
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1

# The checks of this script outside cargo test (examples run against fixtures, the user crates below), each counted.
checks_passed=0
checks_failed=0
record() {  # record LABEL DESCRIPTION STATUS
  if [[ $3 -eq 0 ]]; then
    checks_passed=$((checks_passed + 1)); echo "ok   $1: $2"
  else
    checks_failed=$((checks_failed + 1)); echo "FAIL $1: $2"
  fi
}

echo "== examples/serve.rs on tests/fixtures/mlp (tests/serve.rs compares it with reference.output)"
if ! cargo run --offline "${debian_crates[@]}" -q -p distckpt --example serve; then
  echo "rust/run_tests.sh: the serve example failed" >&2
  [[ $rc -eq 0 ]] && rc=1
fi

# The inference server's GPU load (examples/gpu_load.rs) against the core's fake CUDA driver: its "device memory" is
# host memory, and the core's real CUDA copy engine (pinned staging, copies on a stream) moves the bytes into it.
# Every tensor's digest, read back from the device, must be what the digest example prints from host reads; a
# distckpt checkpoint, a hub directory and a DCP directory. The GPU check runs the same program on a GPU.
echo "== examples/gpu_load.rs against the core's fake CUDA driver (//core/cuda:libfake_cuda.so)"
fixtures="$(cd .. && pwd)/tests/fixtures"
if fake_out=$(cd .. && bazel build -c opt //core/cuda:libfake_cuda.so 2>&1); then
  fake_cuda="$(cd .. && bazel info -c opt bazel-bin 2>/dev/null)/core/cuda/libfake_cuda.so"
  cargo build --offline "${debian_crates[@]}" -q -p distckpt --example gpu_load --example digest
  record gpu_load "cargo build --example gpu_load --example digest" $?
  for f in mlp dtypes sharded safetensors/hub dcp/fsdp2_2ranks; do
    got=$(DCKPT_CUDA_DRIVER_LIBRARY="$fake_cuda" target/debug/examples/gpu_load "$fixtures/$f")
    status=$?
    want=$(target/debug/examples/digest "$fixtures/$f")
    [[ $status -eq 0 && "$(sed '$d' <<<"$got")" == "$want" && "$(tail -1 <<<"$got")" == "gpu_load: "*" GB/s (pinned staging, every byte verified)" ]]
    record gpu_load "tests/fixtures/$f into fake device memory, every tensor read back with the digest example's digest" $?
  done
  out=$(DCKPT_CUDA_DRIVER_LIBRARY=/nonexistent/libcuda.so.1 target/debug/examples/gpu_load "$fixtures/mlp")
  [[ $? -eq 1 && $out == *"cannot load the CUDA driver /nonexistent/libcuda.so.1"* ]]
  record gpu_load "no CUDA driver: exit 1 naming the library it tried" $?
else
  echo "$fake_out" | tail -20
  record gpu_load "bazel build //core/cuda:libfake_cuda.so" 1
fi

# A user's crate, as README.md "Use it from your own crate" sets one up: a copy of tests/consumers/rust in a fresh
# temporary directory (no Cargo.lock, no workspace above it, no build.rs), its path dependency pointed at this
# rust/distckpt. Built with the README's environment only: DISTCKPT_LIB_DIR, and nothing this script exported for the
# workspace's tests (no LD_LIBRARY_PATH, no PKG_CONFIG_PATH); its crates.io dependencies (half, serde, serde_json)
# from Debian's registry, as above, standing in for the crates.io a user reaches. Its own CARGO_TARGET_DIR, inside the
# temporary directory: the workspace's target/ stays untouched and the build starts cold.
# The install tree it builds against is a private one in the temporary directory (tests/consumers/portable.sh says
# why), so that it can be moved away while the binary runs.
consumer_check() { record consumer "$@"; }  # consumer_check DESCRIPTION STATUS
# shellcheck source=../tests/consumers/portable.sh
source ../tests/consumers/portable.sh
dist="$work/dist"
readme_env() {  # runs "$@" with the environment README.md tells a user to set, and no other addition of this script
  env -u LD_LIBRARY_PATH -u PKG_CONFIG_PATH -u DISTCKPT_INCLUDE_DIR -u DCKPT_GLOO_PLUGIN -u RUSTFLAGS \
    -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_RUSTFLAGS DISTCKPT_LIB_DIR="$dist/lib" CARGO_TARGET_DIR="$work/target" "$@"
}
python_values="$PWD/distckpt/tests/data/python_values"
echo "== tests/consumers/rust: a crate outside the repository, built as README.md says (static, no build.rs), run from a copy"
private_tree "$dist"
consumer_check "scripts/build_lib.sh lays out a private install tree ($dist)" $?
cp -R ../tests/consumers/rust "$work/consumer"
rm -rf "$work/consumer/target" "$work/consumer/Cargo.lock"
sed -i "s|^\(distckpt = { path = \)\"[^\"]*\"|\1\"$PWD/distckpt\"|" "$work/consumer/Cargo.toml"
grep -q "^distckpt = { path = \"$PWD/distckpt\", features = \[\"half\", \"serde\"\] }" "$work/consumer/Cargo.toml" &&
  [[ ! -e $work/consumer/build.rs ]]
consumer_check "the crate depends on distckpt with features half and serde, and has no build.rs" $?
(cd "$work/consumer" && readme_env cargo build --offline "${debian_crates[@]}" 2>&1 | tail -20; exit "${PIPESTATUS[0]}")
consumer_check "cargo build --offline (DISTCKPT_LIB_DIR only; half, serde and serde_json from Debian's registry)" $?
bin=$(fresh_copy "$work/target/debug/distckpt-consumer" "$work")
self_contained "$bin"
consumer_check "its binary names no libdistckpt and no rpath (readelf -d)" $?
tree_away "$dist"
(cd "$(dirname "$bin")" && env -u LD_LIBRARY_PATH ./distckpt-consumer --fixture-values "$fixtures/sharded")
consumer_check "a copy in a fresh directory, install tree moved away, no LD_LIBRARY_PATH: views tests/fixtures/sharded (owned whole and chunk views)" $?
(cd "$(dirname "$bin")" && env -u LD_LIBRARY_PATH ./distckpt-consumer "$fixtures/mlp")
consumer_check "the same copy views tests/fixtures/mlp" $?
(cd "$(dirname "$bin")" && env -u LD_LIBRARY_PATH ./distckpt-consumer --fixture-values "$python_values")
consumer_check "the same copy reads the values of a checkpoint saved from Python, into serde_json and Rust types (serde)" $?
(cd "$(dirname "$bin")" && env -u LD_LIBRARY_PATH ./distckpt-consumer --fixture-values "$fixtures/dtypes")
consumer_check "the same copy maps tests/fixtures/dtypes and views its BF16/F16 tensors as half types, values exact (half)" $?
tree_back "$dist"

# The `shared` feature (README.md): libdistckpt.so. `cargo run` works with no build.rs (distckpt-sys links the library
# into its OUT_DIR, which cargo puts on the loader's path), but the binary started directly has no rpath: exit 127.
# With the README's build.rs for the feature, it starts directly.
(cd "$work/consumer" && readme_env cargo run --offline "${debian_crates[@]}" -q --features distckpt/shared -- "$fixtures/mlp" >/dev/null)
consumer_check "--features distckpt/shared, no build.rs: cargo run works" $?
if ldconfig -p 2>/dev/null | grep -q "libdistckpt\.so "; then
  echo "skip consumer: libdistckpt.so is installed where the loader looks by default, so the control below cannot fail"
else
  env -u LD_LIBRARY_PATH "$work/target/debug/distckpt-consumer" "$fixtures/mlp" >/dev/null 2>&1
  status=$?
  [[ $status -eq 127 ]]
  consumer_check "--features distckpt/shared, no build.rs: the binary started directly does not find libdistckpt.so (status $status, want 127)" $?
fi
cp -R "$work/consumer" "$work/shared_build_rs"
sed -i -e 's/^name = "distckpt-consumer"/name = "distckpt-consumer-shared"/' \
  -e 's|^\(distckpt = { path = "[^"]*", features = \[\)|\1"shared", |' "$work/shared_build_rs/Cargo.toml"
# The build.rs is README.md's own, the first code block after the sentence that introduces it, so that the file
# tested here and the one users copy cannot differ.
awk '/So add a `build.rs` beside your `Cargo.toml`:/ { after = 1 } after && /^```rust/ { inside = 1; next }
     inside && /^```$/ { exit } inside { print }' README.md > "$work/shared_build_rs/build.rs"
grep -q "DEP_DISTCKPT_RS_LIB_DIR" "$work/shared_build_rs/build.rs"
consumer_check "README.md's build.rs for the shared feature is found in README.md" $?
grep -q 'features = \["shared", "half", "serde"\]' "$work/shared_build_rs/Cargo.toml"
consumer_check "the crate's copy for the shared feature asks for features shared, half and serde" $?
(cd "$work/shared_build_rs" && readme_env cargo build --offline "${debian_crates[@]}" -q 2>&1 | tail -20; exit "${PIPESTATUS[0]}")
consumer_check "features = [\"shared\"] with README.md's build.rs: cargo build --offline" $?
readelf -d "$work/target/debug/distckpt-consumer-shared" | grep -q "(NEEDED).*\[libdistckpt\.so\]" &&
  env -u LD_LIBRARY_PATH "$work/target/debug/distckpt-consumer-shared" "$fixtures/mlp" >/dev/null
consumer_check "features = [\"shared\"] with README.md's build.rs: the binary needs libdistckpt.so and starts directly without LD_LIBRARY_PATH" $?

# Without features, distckpt needs no crate: a user's crate that asks for none builds with no registry at all (a
# CARGO_HOME of its own, holding no config and no cached crate, and no Debian source), and its lock file names
# nothing but the path packages. Its code is this script's: it reads a tensor and compares a view with it.
plain="$work/no_features"
mkdir -p "$plain/src" "$work/empty_cargo_home"
printf '%s\n' '[package]' 'name = "distckpt-no-features"' 'version = "0.1.0"' 'edition = "2021"' 'publish = false' '' \
  '[dependencies]' "distckpt = { path = \"$PWD/distckpt\" }" > "$plain/Cargo.toml"
printf '%s\n' 'fn main() {' \
  '    let ckpt = distckpt::Checkpoint::open(std::env::args().nth(1).expect("a checkpoint")).expect("open");' \
  '    let (view, read) = (ckpt.view::<f32>("fc1.weight").unwrap(), ckpt.read::<f32>("fc1.weight").unwrap());' \
  '    assert!(view.len() == 64 * 32 && view[..] == read[..], "the view differs from the read");' \
  '}' > "$plain/src/main.rs"
(cd "$plain" && readme_env CARGO_HOME="$work/empty_cargo_home" cargo build --offline -q 2>&1 | tail -20; exit "${PIPESTATUS[0]}")
consumer_check "without features: cargo build --offline with no crate registry and an empty CARGO_HOME" $?
[[ "$(grep '^name = ' "$plain/Cargo.lock" | sort | tr '\n' ' ')" == 'name = "distckpt" name = "distckpt-no-features" name = "distckpt-sys" ' ]]
consumer_check "without features: its Cargo.lock names only distckpt, distckpt-sys and the crate itself" $?
env -u LD_LIBRARY_PATH "$work/target/debug/distckpt-no-features" "$fixtures/mlp"
consumer_check "without features: the binary views tests/fixtures/mlp" $?

passed=$(grep -oE "test result: [a-zA-Z]+\. [0-9]+ passed" "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -oE "[0-9]+ failed;" "$log" | awk '{s += $1} END {print s + 0}')
if [[ $rc -ne 0 ]]; then
  sed -n '/^failures:$/,/^test result/p' "$log" | head -200
fi
if [[ $rc -ne 0 && $failed -eq 0 ]]; then
  failed=1 # cargo failed before running tests (a build error), or the serve example failed: count it
  tail -30 "$log"
fi
passed=$((passed + checks_passed + fmt_passed))
failed=$((failed + checks_failed + fmt_failed))
if [[ $((checks_failed + fmt_failed)) -ne 0 && $rc -eq 0 ]]; then
  rc=1
fi
echo "rust: ${passed} passed, ${failed} failed"
exit "$rc"
