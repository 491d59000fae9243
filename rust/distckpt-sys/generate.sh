#!/usr/bin/env bash
# Regenerates src/bindings.rs from capi/include/distckpt/distckpt.h with the Debian bindgen CLI (0.60) and rustfmt.
#   rust/distckpt-sys/generate.sh            writes src/bindings.rs (commit it)
#   rust/distckpt-sys/generate.sh OUT.rs     writes OUT.rs instead (the staleness test, tests/stale.rs, does this)
# The flags are part of the committed output: change them here only, and regenerate. rustfmt formats the output with
# its defaults (bindings.rustfmt.toml), not rust/rustfmt.toml.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
header="$here/../../capi/include/distckpt/distckpt.h"
out="${1:-$here/src/bindings.rs}"
bindgen "$header" \
  --allowlist-function 'dckpt_.*' \
  --allowlist-type 'dckpt_.*' \
  --allowlist-var 'DCKPT_.*' \
  --size_t-is-usize \
  --no-prepend-enum-name \
  --rustfmt-configuration-file "$here/bindings.rustfmt.toml" \
  --output "$out" \
  -- -std=c99
