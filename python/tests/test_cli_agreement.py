"""The two CLIs agree (issue 27, docs/cli.md): ``python -m distckpt`` and the Go ``distckpt``, run on the same
checkpoints, give the same exit statuses and the same ``--json`` documents for the commands they share (inspect/info,
export-safetensors, consolidate). The Go CLI is built from go/cmd/distckpt into a temporary directory, against the
libdistckpt.so this Python package loads when it ships one (so both sides run the same library), else through
pkg-config. Skips only where ``go`` is not installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import distckpt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The exit statuses of docs/cli.md.
OK, BAD_DATA, USAGE, FAILURE, NOT_FOUND, CORRUPT = 0, 1, 2, 3, 4, 5


@pytest.fixture(scope="module")
def go_cli(tmp_path_factory):
    go = shutil.which("go")
    if go is None:
        pytest.skip("the Go toolchain (go) is not installed: the Go CLI cannot be built to compare with")
    out = str(tmp_path_factory.mktemp("go-cli") / "distckpt")
    env = {**os.environ, "GOFLAGS": "-buildvcs=false", "GOPROXY": "off", "GO111MODULE": "on"}
    cmd = [go, "build", "-o", out]
    pkg_dir = os.path.dirname(os.path.abspath(distckpt.__file__))
    if os.path.exists(os.path.join(pkg_dir, "libdistckpt.so")):
        # The library this package ships: both CLIs then run the same core.
        env["CGO_CFLAGS"] = f"-I{os.path.join(ROOT, 'capi', 'include')}"
        env["CGO_LDFLAGS"] = f"-L{pkg_dir} -Wl,-rpath,{pkg_dir}"
        cmd += ["-tags", "distckpt_nopkgconfig"]
    elif subprocess.run(["pkg-config", "--exists", "distckpt"], env=env).returncode != 0:
        # An extension that carries the C ABI inside it (the Bazel build): the Go CLI links the library the tree
        # builds (scripts/build_lib.sh, as go/run_tests.sh does).
        built = subprocess.run([os.path.join(ROOT, "scripts", "build_lib.sh")], cwd=ROOT, capture_output=True,
                               text=True, timeout=1800)  # fmt: skip
        assert built.returncode == 0, f"scripts/build_lib.sh failed:\n{built.stderr[-2000:]}"
        prefix = built.stdout.strip().splitlines()[-1]
        env["PKG_CONFIG_PATH"] = os.pathsep.join(filter(None, [os.path.join(prefix, "lib", "pkgconfig"),
                                                               env.get("PKG_CONFIG_PATH")]))  # fmt: skip
    p = subprocess.run([*cmd, "./cmd/distckpt"], cwd=os.path.join(ROOT, "go"), env=env, capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert p.returncode == 0, f"go build of the Go CLI failed:\n{p.stdout}{p.stderr}"
    return out


def run_go(go_cli, *args):
    return subprocess.run([go_cli, *map(str, args)], capture_output=True, text=True, timeout=120)


def run_py(*args):
    return subprocess.run([sys.executable, "-m", "distckpt", *map(str, args)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """A checkpoint with every kind of entry the JSON describes, a damaged copy of its metadata, and a plain file."""
    d = tmp_path_factory.mktemp("ckpts")
    rng = np.random.default_rng(0)
    state = {
        "model": {
            "w": rng.standard_normal((16, 8)).astype(np.float32),
            "b": np.arange(8, dtype=np.int64),
            "h": np.ones((2, 3), np.float16),
            "bf": np.ones(4, ml_dtypes.bfloat16),
            "mask": np.array([True, False]),
            "scalar": np.float64(2.5),
        },
        "step": 7,
        "note": "caf\u00e9",
    }
    distckpt.save(state, d / "good", user_metadata={"framework": "numpy", "run": "r\u00e9sum\u00e9"})
    shutil.copytree(d / "good", d / "corrupt")
    (d / "corrupt" / "metadata.dckpt").write_bytes(b"not a distckpt metadata file")
    (d / "a-file").write_text("x")
    return d


def test_inspect_json_is_the_same_document_in_both(go_cli, ckpts):
    good = ckpts / "good"
    docs = {}
    for name, p in {"go inspect": run_go(go_cli, "inspect", "--json", good),
                    "go info": run_go(go_cli, "info", "--json", good),
                    "python inspect": run_py("inspect", "--json", good),
                    "python info": run_py("info", good, "--json")}.items():  # fmt: skip
        assert p.returncode == OK, f"{name}: exit {p.returncode}\n{p.stderr}"
        assert p.stdout.startswith('{\n  "schema_version": 1,'), f"{name}: {p.stdout[:200]}"
        docs[name] = json.loads(p.stdout)
    want = docs["go inspect"]
    for name, doc in docs.items():
        assert doc == want, f"{name} differs from the Go CLI's inspect --json"
    # What the schema (docs/cli.md) promises, checked on the shared document.
    assert set(want) == {"schema_version", "path", "format", "format_version", "format_major", "format_minor",
                         "writer", "num_entries", "num_files", "total_bytes", "metadata_bytes", "checksum_block_size",
                         "bases", "chain_length", "bytes_in_bases", "stored_bytes", "compressed_chunks", "user",
                         "entries", "layout"}  # fmt: skip
    assert (want["format"], want["format_version"], want["format_major"], want["format_minor"]) == ("distckpt", "1.2",
                                                                                                    1, 2)  # fmt: skip
    assert want["user"]["framework"] == "numpy" and want["layout"] is None
    by_name = {e["name"]: e for e in want["entries"]}
    assert by_name["model.w"] == {"name": "model.w", "kind": "tensor", "dtype": "F32", "shape": [16, 8],
                                  "bytes": 512, "chunks": 1}  # fmt: skip
    assert by_name["model.scalar"]["shape"] == [] and by_name["model.bf"]["dtype"] == "BF16"
    assert by_name["step"]["kind"] == "bytes" and by_name["step"]["dtype"] is None and by_name["step"]["shape"] is None
    assert want["num_entries"] == len(want["entries"]) == 8

    for entry in ("model.w", "step"):
        go = run_go(go_cli, "inspect", "--json", "--layout", entry, good)
        py = run_py("inspect", "--json", "--layout", entry, good)
        assert go.returncode == py.returncode == OK, go.stderr + py.stderr
        go_doc, py_doc = json.loads(go.stdout), json.loads(py.stdout)
        assert go_doc == py_doc and go_doc["layout"]["name"] == entry
        chunk = go_doc["layout"]["chunks"][0]
        assert set(chunk) == {"index", "offsets", "lengths", "file", "file_offset", "length", "checksum", "base",
                              "codec", "stored_length"}  # fmt: skip
        assert len(chunk["checksum"]) == 16

    # An incremental checkpoint: its bases and the chunks that lie there, the same in both.
    incr = os.path.join(os.path.dirname(good), "incremental")
    distckpt.save({"model": {"w": np.ones((16, 8), np.float32)}, "head": np.arange(4.0)}, incr + "-base")
    distckpt.save({"model": {"w": np.ones((16, 8), np.float32)}, "head": np.arange(4.0) + 1}, incr,
                  base=incr + "-base")  # fmt: skip
    go = run_go(go_cli, "inspect", "--json", "--layout", "model.w", incr)
    py = run_py("inspect", "--json", "--layout", "model.w", incr)
    assert go.returncode == py.returncode == OK, go.stderr + py.stderr
    go_doc, py_doc = json.loads(go.stdout), json.loads(py.stdout)
    assert go_doc == py_doc
    assert go_doc["bases"] == ["incremental-base"] and go_doc["chain_length"] == 1
    assert go_doc["bytes_in_bases"] == 16 * 8 * 4 and go_doc["format_version"] == "2.0"
    assert go_doc["layout"]["chunks"][0]["base"] == "incremental-base"

    # A compressed checkpoint: stored sizes and codecs, the same in both.
    packed = os.path.join(os.path.dirname(good), "packed")
    w = np.repeat(np.arange(64, dtype=np.float32), 256).reshape(128, 128)
    distckpt.save({"w": w, "noise": np.random.default_rng(0).integers(0, 255, 5000, np.uint8)}, packed,
                  compression="zstd")  # fmt: skip
    go = run_go(go_cli, "inspect", "--json", "--layout", "w", packed)
    py = run_py("inspect", "--json", "--layout", "w", packed)
    assert go.returncode == py.returncode == OK, go.stderr + py.stderr
    go_doc, py_doc = json.loads(go.stdout), json.loads(py.stdout)
    assert go_doc == py_doc
    assert go_doc["format_version"] == "3.0" and go_doc["compressed_chunks"] == 1
    assert go_doc["stored_bytes"] < go_doc["total_bytes"]
    first = go_doc["layout"]["chunks"][0]
    assert first["codec"] == "zstd" and first["stored_length"] < w.nbytes


FIXTURES = os.path.join(ROOT, "tests", "fixtures")


@pytest.mark.parametrize(
    "which, fmt, version",
    [
        ("dcp/fsdp2_2ranks", "torch-dcp", "1.0.0"),
        ("dcp/torch24_dtensor_2ranks", "torch-dcp", None),  # torch 2.4 wrote no version into .metadata
        ("safetensors/hub", "safetensors", None),
        ("safetensors/single.safetensors", "safetensors", None),
    ],
)
def test_inspect_of_a_foreign_checkpoint_names_its_format_in_both(go_cli, which, fmt, version):
    """Issue 38: a foreign checkpoint's document says its format and that format's own version (never distckpt's);
    the text output cuts long user values (DCP's planner data) and --json gives them whole."""
    path = os.path.join(FIXTURES, which)
    go, py = run_go(go_cli, "inspect", "--json", path), run_py("inspect", "--json", path)
    assert go.returncode == py.returncode == OK, go.stderr + py.stderr
    go_doc, py_doc = json.loads(go.stdout), json.loads(py.stdout)
    assert go_doc == py_doc
    assert (go_doc["format"], go_doc["format_version"], go_doc["format_major"], go_doc["format_minor"]) == (
        fmt, version, None, None)  # fmt: skip
    long_values = {k: v for k, v in go_doc["user"].items() if len(v) > 100}
    if which == "dcp/fsdp2_2ranks":
        assert len(long_values["torch_dcp.planner_data"]) > 2000
    for text in (run_go(go_cli, "inspect", path).stdout, run_py("inspect", path).stdout):
        assert max(len(line) for line in text.splitlines()) < 400, text
        for value in long_values.values():
            assert f"{value[:100]}\u2026 ({len(value.encode())} bytes; --json for all)" in text
            assert value[:101] not in text


def test_both_helps_name_every_foreign_format(go_cli):
    go_help = run_go(go_cli, "--help").stderr + run_go(go_cli, "help", "inspect").stdout
    py_help = run_py("--help").stdout + run_py("inspect", "--help").stdout
    for text in (go_help, py_help):
        flat = " ".join(text.split())
        for fmt in ("safetensors directory", ".safetensors.index.json", "hub cache snapshot", "models--ORG--NAME",
                    "PyTorch DCP directory"):  # fmt: skip
            assert fmt in flat, text


def test_inspect_exit_statuses_agree(go_cli, ckpts):
    good = ckpts / "good"
    cases = [
        ("success", [good], OK),
        ("missing checkpoint", [ckpts / "missing"], NOT_FOUND),
        ("not a directory", [ckpts / "a-file"], NOT_FOUND),
        ("corrupt metadata", [ckpts / "corrupt"], CORRUPT),
        ("no such entry for --layout", ["--layout", "nope", good], NOT_FOUND),
        ("unknown flag", ["--bogus", good], USAGE),
        ("missing argument", [], USAGE),
        ("too many arguments", [good, good], USAGE),
    ]
    for what, args, status in cases:
        go = run_go(go_cli, "inspect", *args)
        py = run_py("inspect", *args)
        assert (go.returncode, py.returncode) == (status, status), f"inspect, {what}: go {go.returncode}, python " \
            f"{py.returncode}, want {status}\ngo: {go.stderr}\npython: {py.stderr}"  # fmt: skip
        # info, the older name, agrees in both (and the old --detailed-exit-status flag changes nothing).
        assert run_go(go_cli, "info", *args).returncode == status, f"go info, {what}"
        assert run_py("info", *args).returncode == status, f"python info, {what}"
        assert run_py("--detailed-exit-status", "info", *args).returncode == status, f"python info, {what}"
        if status not in (OK, USAGE):
            # The error in JSON mode: the same code, a message naming the checkpoint, on both sides.
            go_err = json.loads(run_go(go_cli, "inspect", "--json", *args).stdout)["error"]
            py_err = json.loads(run_py("inspect", "--json", *args).stdout)["error"]
            assert go_err["code"] == py_err["code"], f"{what}: {go_err} vs {py_err}"
            named = str(args[-1])
            assert named in go_err["message"] and named in py_err["message"], f"{what}: {go_err} vs {py_err}"


def test_export_safetensors_agrees(go_cli, ckpts, tmp_path):
    good = ckpts / "good"
    go = run_go(go_cli, "export-safetensors", "--json", "--max-shard-size", "600B", "--prefix", "m", good,
                tmp_path / "go")  # fmt: skip
    py = run_py("export-safetensors", "--json", "--max-shard-size", "600B", "--prefix", "m", good, tmp_path / "py")
    assert go.returncode == py.returncode == OK, go.stderr + py.stderr
    go_doc, py_doc = json.loads(go.stdout), json.loads(py.stdout)
    for doc in (go_doc, py_doc):
        doc.pop("seconds")
        assert doc.pop("out") in (str(tmp_path / "go"), str(tmp_path / "py"))
    assert go_doc == py_doc and go_doc["index"] == "m.safetensors.index.json" and len(go_doc["files"]) > 1
    for f in go_doc["files"]:
        assert (tmp_path / "go" / f["name"]).read_bytes() == (tmp_path / "py" / f["name"]).read_bytes()

    # The progress flags of both: nothing on stderr.
    for flags in (["--progress", "none"], ["--quiet"], ["--no-progress"]):
        for tool, p in (("go", run_go(go_cli, "export-safetensors", *flags, good, tmp_path / "q")),
                        ("python", run_py("export-safetensors", *flags, good, tmp_path / "q"))):  # fmt: skip
            assert p.returncode == OK and p.stderr == "", f"{tool} {flags}: {p.returncode} {p.stderr}"
    # --progress log: plain lines ending at 100% in both.
    for tool, p in (("go", run_go(go_cli, "export-safetensors", "--progress", "log", good, tmp_path / "q")),
                    ("python", run_py("export-safetensors", "--progress", "log", good, tmp_path / "q"))):  # fmt: skip
        assert p.returncode == OK and "100% (" in p.stderr.splitlines()[-1], f"{tool} --progress log: {p.stderr}"
    for tool, p in (("go", run_go(go_cli, "-q", "export-safetensors", good, tmp_path / "q")),
                    ("python", run_py("-q", "export-safetensors", good, tmp_path / "q"))):  # fmt: skip
        assert p.returncode == OK and p.stderr == "", f"{tool} -q: {p.returncode} {p.stderr}"

    for what, args, status in [
        ("missing checkpoint", [ckpts / "missing", tmp_path / "x"], NOT_FOUND),
        ("corrupt metadata", [ckpts / "corrupt", tmp_path / "x"], CORRUPT),
        ("bad --max-shard-size", ["--max-shard-size", "5XB", good, tmp_path / "x"], USAGE),
        ("bad --prefix", ["--prefix", "a/b", good, tmp_path / "x"], USAGE),
        ("bad --progress", ["--progress", "loud", good, tmp_path / "x"], USAGE),
        ("missing argument", [good], USAGE),
    ]:
        go = run_go(go_cli, "export-safetensors", *args)
        py = run_py("export-safetensors", *args)
        assert (go.returncode, py.returncode) == (status, status), f"export-safetensors, {what}: go " \
            f"{go.returncode}, python {py.returncode}, want {status}\n{go.stderr}\n{py.stderr}"  # fmt: skip


def test_export_reads_bad_data_with_the_same_status(go_cli, ckpts, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(ckpts / "good", bad)
    with distckpt.open(bad) as r:
        chunk = r.metadata["model.w"].chunks[0]
    with open(bad / chunk.file, "r+b") as f:
        f.seek(chunk.file_offset)
        byte = f.read(1)
        f.seek(chunk.file_offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    go = run_go(go_cli, "export-safetensors", bad, tmp_path / "go")
    py = run_py("export-safetensors", bad, tmp_path / "py")
    assert go.returncode == py.returncode == BAD_DATA, go.stderr + py.stderr
    assert run_py("export-safetensors", bad, tmp_path / "py2").returncode == 1


def test_consolidate_agrees(go_cli, ckpts, tmp_path):
    good = ckpts / "good"
    go = run_go(go_cli, "consolidate", "--json", good, tmp_path / "go.safetensors")
    py = run_py("consolidate", "--json", good, tmp_path / "py.safetensors")
    assert go.returncode == py.returncode == OK, go.stderr + py.stderr
    go_doc, py_doc = json.loads(go.stdout), json.loads(py.stdout)
    for doc in (go_doc, py_doc):
        doc.pop("seconds"), doc.pop("out")
    assert go_doc == py_doc and go_doc["format"] == "safetensors" and sorted(go_doc["skipped"]) == ["note", "step"]
    assert (tmp_path / "go.safetensors").read_bytes() == (tmp_path / "py.safetensors").read_bytes()
    # --format safetensors lets OUT have another suffix in both.
    for tool, run, out in (("go", lambda *a: run_go(go_cli, *a), "go.bin"), ("python", run_py, "py.bin")):
        p = run("consolidate", "--format", "safetensors", good, tmp_path / out)
        assert p.returncode == OK, f"{tool}: {p.stderr}"

    for what, args, status in [
        ("missing checkpoint", [ckpts / "missing", tmp_path / "x.safetensors"], NOT_FOUND),
        ("corrupt metadata", [ckpts / "corrupt", tmp_path / "x.safetensors"], CORRUPT),
        ("OUT exists, no --overwrite", [good, tmp_path / "go.safetensors"], FAILURE),
        ("unknown --format", ["--format", "onnx", good, tmp_path / "x.safetensors"], USAGE),
        ("missing argument", [good], USAGE),
    ]:
        go = run_go(go_cli, "consolidate", *args)
        py = run_py("consolidate", *args)
        assert (go.returncode, py.returncode) == (status, status), f"consolidate, {what}: go {go.returncode}, " \
            f"python {py.returncode}, want {status}\n{go.stderr}\n{py.stderr}"  # fmt: skip
    p = run_go(go_cli, "consolidate", "--overwrite", good, tmp_path / "go.safetensors")
    assert p.returncode == OK, p.stderr


@pytest.fixture()
def manager_tier(tmp_path):
    """A local tier a real CheckpointManager wrote (steps 1..3, keep_local 2), with a staging directory of a writer
    that exited and a symbolic link named like a step beside it."""
    tier = tmp_path / "tier"
    with distckpt.CheckpointManager(local_dir=str(tier), node_id="n0", replicas=0) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, {"w": np.full((64, 64), step, np.float32)})
        mgr.wait_until_finished()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tier / "step-0000000003" / "part-00001.dckpt-staging-00000000000000bb"
    dead.mkdir()
    (dead / "STAGING").write_text(f"distckpt staging directory (not committed)\nhost: {os.uname().nodename}\n"
                                  f"pid: {child.stdout.strip()}\nstarted_utc: 2026-11-28T10:00:00Z\n"
                                  f"final_path: {tier}/step-0000000003/part-00001\n")  # fmt: skip
    (dead / "data-00000.bin").write_bytes(b"x" * 5000)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not the manager's")
    os.symlink(elsewhere, tier / "step-0000000009")
    return tier


def test_tiers_is_the_same_document_in_both(go_cli, manager_tier):
    py, go = run_py("tiers", "--json", manager_tier), run_go(go_cli, "tiers", "--json", manager_tier)
    assert py.returncode == OK and go.returncode == OK, (py.stderr, go.stderr)
    doc = json.loads(py.stdout)
    assert doc == json.loads(go.stdout)
    assert [s["step"] for s in doc["steps"]] == [2, 3] and doc["other"] == ["step-0000000009"], doc
    s3 = doc["steps"][1]
    assert s3["complete"] and s3["restorable_here"] and not s3["abandoned"], s3
    states = {p["name"]: (p["rank"], p["state"]) for p in s3["parts"]}
    staging = "part-00001.dckpt-staging-00000000000000bb"
    assert states == {"part-00000": (0, "complete"), staging: (1, "abandoned")}, states
    own = next(p for p in s3["parts"] if p["name"] == "part-00000")
    assert own["ranks"] == 1 and own["bytes"] >= 64 * 64 * 4 and own["run"] and own["replica"] is False, own
    # The human tables are the same, character for character, and say what each part is.
    py_text, go_text = run_py("tiers", manager_tier).stdout, run_go(go_cli, "tiers", manager_tier).stdout
    assert py_text == go_text, f"python:\n{py_text}\ngo:\n{go_text}"
    assert "step 3: complete, restorable from this node alone" in py_text, py_text
    assert "abandoned: writer pid" in py_text and "has exited" in py_text, py_text
    assert "not the manager's (left alone): step-0000000009" in py_text, py_text


def test_tiers_prune_abandoned_in_both(go_cli, manager_tier, tmp_path):
    dead = manager_tier / "step-0000000003" / "part-00001.dckpt-staging-00000000000000bb"
    dry = run_go(go_cli, "tiers", "--prune-abandoned", "--dry-run", "--json", manager_tier)
    assert dry.returncode == OK, dry.stderr
    assert json.loads(dry.stdout) == {"schema_version": 1, "dir": str(manager_tier), "dry_run": True,
                                      "removed": [str(dead)]}  # fmt: skip
    assert dead.exists()
    py = run_py("tiers", "--prune-abandoned", manager_tier)
    assert py.returncode == OK and f"removed {dead}" in py.stdout, py.stdout + py.stderr
    assert not dead.exists()
    assert (manager_tier / "step-0000000003" / "part-00000" / "metadata.dckpt").exists()
    assert (tmp_path / "elsewhere" / "keep.txt").exists() and os.path.islink(manager_tier / "step-0000000009")
    again = run_go(go_cli, "tiers", "--prune-abandoned", manager_tier)
    assert again.returncode == OK and "nothing abandoned" in again.stdout, again.stdout


def test_tiers_and_ls_on_what_is_not_a_tier(go_cli, manager_tier, tmp_path):
    # ls on a tier finds no checkpoint, and says where to look instead.
    ls = run_go(go_cli, "ls", manager_tier)
    assert ls.returncode == OK and f"see distckpt tiers {manager_tier}" in ls.stdout, ls.stdout
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("x")
    for p in (run_py("tiers", plain), run_go(go_cli, "tiers", plain)):
        assert p.returncode == FAILURE, p
        assert "not a checkpoint manager's local tier" in p.stderr, p.stderr
    for p in (run_py("tiers", tmp_path / "missing"), run_go(go_cli, "tiers", tmp_path / "missing")):
        assert p.returncode == NOT_FOUND, (p.returncode, p.stderr)
