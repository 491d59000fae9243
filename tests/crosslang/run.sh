#!/usr/bin/env bash
# Cross-language check. 3 ranks (C++ through the C ABI, Gloo on loopback) write a sharded checkpoint with replicated
# parts; the Python, Rust and Go readers must read identical values (same per-tensor digests) and Go `verify` must
# pass. Then one data byte is flipped: Python, Rust and Go must all report corruption naming the same tensor. Last,
# a Python save's non-array values (step, lr, a tuple, 2**70, ...) must read back exactly in Rust and Go, and Go's
# `ls` must show its step. Then S3, through a moto server on loopback (python/tests/_s3_server.py) that every language
# reaches through the core's S3 backend (s3:// URLs, AWS_* environment): Python saves to s3://, C (cdigest.c), Rust and
# Go read it with the same digests; C saves to s3:// through the C ABI, Python, Rust and Go read it. Before S3, the
# safetensors fixtures (tests/fixtures/safetensors), read in place by every language with the values safetensors loads.
# Needs the language toolchains set up by python/, rust/ and go/run_tests.sh (scripts/test.sh runs those first).
# Ends with "crosslang: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
passed=0
failed=0
check() {  # check NAME CONDITION-EXIT-CODE
  if [[ $2 -eq 0 ]]; then passed=$((passed + 1)); echo "ok   $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi
}
finish() {
  echo "crosslang: $passed passed, $failed failed"
  [[ $failed -eq 0 ]]
  exit
}

root=$(scripts/build_lib.sh) || { failed=1; finish; }
export PKG_CONFIG_PATH="$root/lib/pkgconfig" LD_LIBRARY_PATH="$root/lib" DISTCKPT_LIB_DIR="$root/lib"
export GOPROXY=off GOFLAGS=-buildvcs=false
bazel build -c opt //tests/multiprocess:reshard_worker //tools/launcher:launch >/dev/null 2>&1 || { failed=1; finish; }
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
work=$(mktemp -d) || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
s3_pid=
trap '[[ -n $s3_pid ]] && kill "$s3_pid" 2>/dev/null; rm -rf "$work"' EXIT

"$bin/tools/launcher/launch" -n 3 --timeout 120 -- "$bin/tests/multiprocess/reshard_worker" --mode save \
  --path "$work/ckpt" >"$work/save.log" 2>&1
check "3 ranks save a sharded checkpoint with replicated parts" $?

python=$repo/.venv/bin/python
[[ -x $python ]] || python=python3
(cd go/cmd/distckpt && go build -o "$work/distckpt" .) && (cd tests/crosslang/godigest && go build -o "$work/godigest" .)
check "build the Go CLI and reader" $?
# The workspace resolves the crates of distckpt's optional features even with them off: from Debian's packages here
# (rust/debian-registry.toml, as rust/run_tests.sh does), there being no crates.io.
(cd rust && cargo build -q --offline --config debian-registry.toml --example digest) &&
  rust_digest=$(ls -t rust/target/debug/examples/digest | head -1)
check "build the Rust reader" $?

digests() {  # digests LANG CKPT -> "name digest" lines
  case $1 in
    python) "$python" tests/crosslang/pydigest.py "$2" ;;
    rust) "$rust_digest" "$2" ;;
    go) "$work/godigest" "$2" ;;
    c) "$work/cdigest" "$2" ;;
  esac | awk '$1 == "ERROR" {print; next} {print $1, $NF}'
}
for lang in python rust go; do digests $lang "$work/ckpt" >"$work/$lang.txt"; done
[[ -s "$work/python.txt" ]] && ! grep -q ERROR "$work/python.txt"
check "Python reads every tensor" $?
cmp -s "$work/python.txt" "$work/rust.txt"
check "Rust reads the same values as Python" $?
cmp -s "$work/python.txt" "$work/go.txt"
check "Go reads the same values as Python" $?
"$work/distckpt" verify "$work/ckpt" >"$work/verify.log" 2>&1
check "Go verify passes" $?

# Flip one byte inside the first chunk of tensor "row2col".
"$work/distckpt" inspect --json --layout row2col "$work/ckpt" >"$work/layout.json"
read -r file offset < <("$python" -c '
import json, sys
d = json.load(open(sys.argv[1]))
c = d["layout"]["chunks"][0] if "layout" in d else d["chunks"][0]
print(c["file"], c["file_offset"])' "$work/layout.json")
"$python" -c '
import sys
path, off = sys.argv[1], int(sys.argv[2]) + 5
with open(path, "r+b") as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x5A]))' "$work/ckpt/$file" "$offset"
for lang in python rust go; do digests $lang "$work/ckpt" >"$work/$lang.bad.txt" 2>&1; done
"$work/distckpt" verify "$work/ckpt" >"$work/verify.bad.log" 2>&1
verify_rc=$?
for lang in python rust go; do
  grep -q "^ERROR row2col:.*corrupt" -i "$work/$lang.bad.txt"
  check "$lang reports corruption in row2col" $?
done
[[ $verify_rc -ne 0 ]] && grep -q "row2col" "$work/verify.bad.log"
check "Go verify fails naming row2col" $?

# Python's non-array values: a save of {"step": 100, ...} must show the step in Go's `ls` and every value, exact, in
# Rust (Checkpoint::value, user) and Go (Reader.Value, UserMetadata).
mkdir -p "$work/runs"
"$python" - "$work/runs/step-100" <<'PY'
import sys, numpy as np, distckpt
distckpt.save({"model": {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, "step": 100, "lr": 3e-4,
               "sched": {"warmup": 10, "betas": (0.9, 0.95), "name": "cosine", "big": 2**70, "keys": [{1: "one"}]}},
              sys.argv[1])
PY
check "Python saves a state with non-array values" $?
"$work/distckpt" ls --json "$work/runs" >"$work/ls.json" 2>&1 && "$python" -c '
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["checkpoints"] if isinstance(d, dict) else d
assert [r["step"] for r in rows] == [100], rows' "$work/ls.json"
check "Go ls shows step 100 for a Python save of {\"step\": 100}" $?
"$rust_digest" --values "$work/runs/step-100" >"$work/rust.values" 2>&1
"$work/godigest" --values "$work/runs/step-100" >"$work/go.values" 2>&1
"$python" - "$work/rust.values" "$work/go.values" <<'PY'
import json, sys
want_user = {"lr": "0.0003", "step": "100"}
want = {"step": 100, "lr": 3e-4, "sched.warmup": 10, "sched.betas": [0.9, 0.95], "sched.name": "cosine",
        "sched.big": 2**70}
ok = True
for path, lang in zip(sys.argv[1:], ("rust", "go")):
    user, values = {}, {}
    for line in open(path):
        kind, name, rest = line.rstrip("\n").split(" ", 2)
        if kind == "user":
            user[name] = rest
        elif kind == "value":
            text = rest.split(" ", 1)[1] if lang == "go" else rest  # go: "GOTYPE JSON"
            values[name] = json.loads(text)
        else:
            print(f"{lang}: {line.strip()}"); ok = False
    if lang == "rust":  # Rust shows Python's tagged forms as they are stored
        values["sched.betas"] = values["sched.betas"].get("$tuple")
        keys = values.pop("sched.keys", None)
        ok &= keys == [{"$dict": [[1, "one"]]}] or print("rust sched.keys", keys) or False
    else:  # Go decodes them: a Tuple and a Dict marshal as lists
        keys = values.pop("sched.keys", None)
        ok &= keys == [[{"Key": 1, "Value": "one"}]] or print("go sched.keys", keys) or False
    for k, v in want.items():
        if values.get(k) != v or type(values.get(k)) is not type(v):
            print(f"{lang}: value {k} = {values.get(k)!r}, saved {v!r}"); ok = False
    if user != want_user:
        print(f"{lang}: user metadata {user}, want {want_user}"); ok = False
sys.exit(0 if ok else 1)
PY
check "Rust and Go read Python's values exactly (step, lr, tuple, str, 2**70, int-keyed dict) and the step in user metadata" $?

# ---- Checkpoints other libraries wrote ---------------------------------------------------------------------------
# The safetensors fixtures (tests/fixtures/safetensors, written by the real safetensors package), read in place by
# the core from each language: the hub directory, its index file and the single file must give, in Python, Rust and
# Go, the digests of what safetensors itself loads (torch). Then a Python import of the hub: Rust and Go read the same
# values from it, and Go's diff finds it the same as the hub. Go's verify says the format has no checksums (exit 3).
st=tests/fixtures/safetensors
"$python" - "$st" >"$work/st.reference" 2>&1 <<'PY'
import json, os, sys
import torch
from safetensors.torch import load_file

def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h

root = sys.argv[1]
index = json.load(open(os.path.join(root, "hub", "model.safetensors.index.json")))
forms = {"hub": [os.path.join(root, "hub", f) for f in sorted(set(index["weight_map"].values()))],
         "single": [os.path.join(root, "single.safetensors")]}
for form, files in forms.items():
    tensors = {}
    for f in files:
        tensors.update(load_file(f))
    for name in sorted(tensors):
        raw = tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        print(form, name, f"{fnv1a64(raw):016x}")
PY
check "safetensors (the library) loads the fixtures" $?
for form in hub hub/model.safetensors.index.json single.safetensors; do
  ref=${form%%/*}; ref=${ref%.safetensors}
  awk -v f="$ref" '$1 == f {print $2, $3}' "$work/st.reference" >"$work/st.$ref.want"
  for lang in python rust go; do
    digests $lang "$st/$form" >"$work/st.$lang.txt" 2>&1
    [[ -s "$work/st.$ref.want" ]] && cmp -s "$work/st.$ref.want" "$work/st.$lang.txt"
    check "$lang reads $form in place as safetensors loads it (every tensor's digest)" $?
  done
done
"$work/distckpt" verify --json "$st/hub" >"$work/st.verify.json" 2>"$work/st.verify.log"
verify_rc=$?
[[ $verify_rc -eq 3 ]] && "$python" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["format"] == "safetensors" and d["checksummed"] is False and d["error"]["code"] == "unsupported", d' \
  "$work/st.verify.json"
check "Go verify of the hub: no checksums, exit 3" $?
"$python" -c '
import sys, distckpt
with distckpt.open(sys.argv[1]) as r:
    assert r.metadata.format == "safetensors" and not r.metadata.checksummed
    try:
        r.verify()
    except distckpt.UnsupportedError as e:
        assert "no checksums" in str(e), e
    else:
        sys.exit("verify passed")' "$st/hub"
check "Python verify of the hub: UnsupportedError, no checksums" $?
"$work/distckpt" inspect --json --layout rope.bias "$st/hub" >"$work/st.inspect.go.json" 2>&1 &&
  "$python" -m distckpt inspect --json --layout rope.bias "$st/hub" >"$work/st.inspect.py.json" 2>&1 &&
  "$python" -c '
import json, sys
go, py = (json.load(open(p)) for p in sys.argv[1:])
assert go == py and go["writer"] == "safetensors", (go, py)' "$work/st.inspect.go.json" "$work/st.inspect.py.json"
check "Go and Python inspect --json print the same document for the hub (docs/cli.md)" $?
"$python" -m distckpt -q import-safetensors "$st/hub" "$work/st.imported" >/dev/null 2>&1
check "Python imports the hub (python -m distckpt import-safetensors)" $?
digests python "$st/hub" >"$work/st.hub.py.txt" 2>&1
for lang in rust go; do
  digests $lang "$work/st.imported" >"$work/st.imported.$lang.txt" 2>&1
  cmp -s "$work/st.hub.py.txt" "$work/st.imported.$lang.txt"
  check "$lang reads Python's import of the hub with the hub's digests" $?
done
"$work/distckpt" diff "$work/st.imported" "$st/hub" >"$work/st.diff.log" 2>&1
check "Go diff: Python's import and the hub are the same" $?

# ---- S3 ----------------------------------------------------------------------------------------------------------
cc -std=c99 -Wall -Wextra -Werror tests/crosslang/cdigest.c $(pkg-config --cflags --libs distckpt) -o "$work/cdigest"
check "build the C reader (cdigest.c)" $?
"$python" python/tests/_s3_server.py --bucket crosslang >"$work/s3.env" 2>"$work/s3.log" &
s3_pid=$!
for _ in $(seq 600); do grep -q AWS_ENDPOINT_URL "$work/s3.env" 2>/dev/null && break; sleep 0.1; done
# shellcheck disable=SC1091
source "$work/s3.env" # AWS_ENDPOINT_URL and the keys, for every program below
[[ -n ${AWS_ENDPOINT_URL:-} ]]
check "start a moto S3 server" $?

"$python" - s3://crosslang/py <<'PY'
import sys, numpy as np, distckpt
rng = np.random.default_rng(7)
big = np.arange(3 << 20, dtype=np.float32).reshape(3, 1 << 20)  # 12 MiB: a multipart upload, ranged reads
state = {"model": {"w": rng.standard_normal((300, 500)).astype(np.float32),
                   "emb": rng.integers(-999, 999, (64, 33)).astype(np.int64),
                   "half": rng.standard_normal(1000).astype(np.float16)},
         "big": [distckpt.Shard(big[i:i + 1], big.shape, (i, 0)) for i in range(3)],  # 3 chunks
         "step": 7}
distckpt.save(state, sys.argv[1])
PY
check "Python saves to s3://" $?
for lang in python c rust go; do digests $lang s3://crosslang/py >"$work/s3py.$lang.txt" 2>&1; done
[[ $(wc -l <"$work/s3py.python.txt") -eq 4 ]] && ! grep -q ERROR "$work/s3py.python.txt"
check "Python reads its s3:// save" $?
for lang in c rust go; do
  cmp -s "$work/s3py.python.txt" "$work/s3py.$lang.txt"
  check "$lang reads Python's s3:// save with the same digests" $?
done
"$work/distckpt" verify s3://crosslang/py >"$work/s3verify.log" 2>&1
check "Go verify passes on Python's s3:// save" $?

"$work/cdigest" --save s3://crosslang/c >"$work/s3c.c.txt" 2>&1 &&
  [[ $(wc -l <"$work/s3c.c.txt") -eq 4 ]] && ! grep -q ERROR "$work/s3c.c.txt"
check "C saves to s3:// through the C ABI and reads it back" $?
awk '{print $1, $NF}' "$work/s3c.c.txt" >"$work/s3c.c.digests"
for lang in python rust go; do
  digests $lang s3://crosslang/c >"$work/s3c.$lang.txt" 2>&1
  cmp -s "$work/s3c.c.digests" "$work/s3c.$lang.txt"
  check "$lang reads C's s3:// save with the same digests" $?
done

if [[ $failed -ne 0 ]]; then
  for f in "$work"/*.txt "$work"/*.log "$work"/*.values "$work"/ls.json "$work"/*.digests; do echo "--- $f"; head -20 "$f"; done
fi
finish
