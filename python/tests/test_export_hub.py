"""Export to the Hugging Face hub's format (issue 30): a multi-rank sharded save exported by the ranks together
(``export_safetensors(..., comm=...)``), names mapped by rules the core applies, then every file and the index loaded
with the real ``safetensors`` package (numpy and torch) and, where installed, ``transformers``' ``from_pretrained``;
values must equal the originals. Also: a failing rank leaves no index, bad rules are refused naming them, and the
export's memory stays within its buffer whatever the checkpoint's size.

Ranks are spawned processes over Gloo on loopback (a file:// rendezvous in the test's directory); every wait is
bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import _export_workers as ew
import _workers
import distckpt

safetensors = pytest.importorskip("safetensors", reason="the safetensors package is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is needed for bf16")
from safetensors import safe_open  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

DEADLINE = 180
RENAME = [
    (r"optim\..*", ""),  # optimizer state: left out
    (r"model\.rotary\..*", ""),
    (r"model\.layers\.(\d+)\.norm\.weight", r"model.layers.\1.ln.weight"),
]


def ranks(fn, world, *args):
    """Runs ``fn(rank, world, *args)`` on ``world`` spawned ranks; returns their return values by rank."""
    out = _workers.spawn(ew.run, world, lambda rank, results: (fn, rank, world, args, results), DEADLINE)
    return [out[r] for r in range(world)]


def exported_name(name):
    """What RENAME makes of a checkpoint name (None: left out), written out by hand for the test."""
    if name.startswith("optim.") or name.startswith("model.rotary."):
        return None
    parts = name.split(".")
    if len(parts) == 5 and parts[:2] == ["model", "layers"] and parts[3:] == ["norm", "weight"]:
        return f"model.layers.{parts[2]}.ln.weight"
    return name


def load_like_transformers(out_dir):
    """What transformers does with a sharded directory: read the index, open each file its weight_map names, take
    each tensor from the file the map gives (torch tensors)."""
    with open(os.path.join(out_dir, "model.safetensors.index.json"), encoding="utf-8") as f:
        index = json.load(f)
    state = {}
    by_file = {}
    for name, file in index["weight_map"].items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with safe_open(os.path.join(out_dir, file), framework="pt") as f:
            assert f.metadata()["format"] == "pt"
            for name in names:
                state[name] = f.get_tensor(name)
    return index, state


def as_numpy(t):
    """A torch tensor as numpy, bf16 through its bit pattern (numpy has no bf16)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def test_multirank_save_then_collective_export_loads_back_equal(tmp_path):
    world = 4
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "hub")
    ranks(ew.save_rank, world, f"file://{tmp_path}/rdv_save", ckpt)
    limit = 24_000
    results = ranks(ew.export_rank, world, f"file://{tmp_path}/rdv_export", ckpt, out, RENAME, limit)
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res}"
    files = results[0]["files"]
    assert all(res["files"] == files for res in results), "every rank returns the same paths"
    shards, index_path = files[:-1], files[-1]
    assert index_path == os.path.join(out, "model.safetensors.index.json")

    expected = {}
    for name, a in ew.hub_state().items():
        new = exported_name(name)
        if new is not None:
            expected[new] = a
    # The ranks shared the files: each wrote some (its progress total), together exactly the tensors' bytes.
    totals = [res["total"] for res in results]
    assert all(t > 0 for t in totals), totals
    assert [res["done"] for res in results] == totals
    assert sum(totals) == sum(a.nbytes for a in expected.values())

    # Every file: within the size limit (no tensor here is larger), loadable by safetensors' numpy and torch
    # backends, holding the expected tensors.
    seen = {}
    for path in shards:
        assert os.path.getsize(path) <= limit, path
        with safe_open(path, framework="numpy") as f:
            for name in f.keys():
                want = expected[name]
                if want.dtype == ml_dtypes.bfloat16:
                    continue  # numpy's backend has no bf16: checked through torch below
                np.testing.assert_array_equal(f.get_tensor(name), want, err_msg=name)
                seen[name] = path
        if torch is not None:
            from safetensors.torch import load_file

            for name, t in load_file(path).items():
                np.testing.assert_array_equal(as_numpy(t), expected[name], err_msg=name)
                seen[name] = path
    if torch is None:
        pytest.skip("torch is not installed: bf16 tensors were not checked")
    assert set(seen) == set(expected)

    # The index the way transformers reads it.
    index, state = load_like_transformers(out)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in expected.values())
    assert set(index["weight_map"]) == set(expected)
    assert {os.path.join(out, f) for f in index["weight_map"].values()} == set(shards)
    for name, t in state.items():
        np.testing.assert_array_equal(as_numpy(t), expected[name], err_msg=name)
    assert not [n for n in os.listdir(out) if ".tmp-" in n]


def test_transformers_from_pretrained_loads_a_collective_export(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    world = 3
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "hub")
    ranks(ew.save_llama_rank, world, f"file://{tmp_path}/rdv_save", ckpt)
    rename = [(r"module\.(.*)", r"\1"), (r"optim\..*", "")]
    results = ranks(ew.export_rank, world, f"file://{tmp_path}/rdv_export", ckpt, out, rename, "8KB")
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res}"
    assert len(results[0]["files"]) > world, "several files per rank"
    ew.llama_config().save_pretrained(out)
    model = transformers.LlamaForCausalLM.from_pretrained(out)
    want = ew.llama_state()
    got = model.state_dict()
    assert set(got) == set(want)
    for name, a in want.items():
        np.testing.assert_array_equal(got[name].detach().numpy(), a, err_msg=name)


def test_a_failing_rank_leaves_no_index_and_no_temporary_files(tmp_path):
    world = 3
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "hub")
    ranks(ew.save_rank, world, f"file://{tmp_path}/rdv_save", ckpt)
    results = ranks(ew.export_rank, world, f"file://{tmp_path}/rdv_export", ckpt, out, RENAME, 24_000, 1)
    assert all("error" in res for res in results), results
    assert results[1]["error"] == "CallbackError" and "progress callback" in results[1]["message"], results[1]
    for r in (0, 2):
        assert "rank 1" in results[r]["message"], results[r]
    assert os.listdir(out) == []


def test_rename_rules_are_checked_by_the_core(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    distckpt.save({"a": {"w": np.ones(3, np.float32)}, "b": {"w": np.zeros(3, np.float32)}}, ckpt)
    out = tmp_path / "hub"
    with pytest.raises(distckpt.InvalidArgumentError, match=r"'a\.w'.*'b\.w'|'b\.w'.*'a\.w'"):
        distckpt.export_safetensors(ckpt, out, rename=[(r"(a|b)\.w", "w")])
    with pytest.raises(distckpt.InvalidArgumentError, match="rule 1"):
        distckpt.export_safetensors(ckpt, out, rename=[("a.(", "x")])
    with pytest.raises(distckpt.InvalidArgumentError, match="group 2"):
        distckpt.export_safetensors(ckpt, out, rename=[(r"a\.(w)", r"\2")])
    with pytest.raises(distckpt.InvalidArgumentError, match="pairs"):
        distckpt.export_safetensors(ckpt, out, rename={"a": "b"})
    assert not [n for n in os.listdir(out) if n.endswith(".safetensors")]
    # Python-style patterns and replacements work as they would with re.fullmatch + expand.
    files = distckpt.export_safetensors(ckpt, out, rename=[(r"(?:a)\.(\w+)", r"model.\g<1>"), (r"b\..*", "")])
    with safe_open(files[0], framework="numpy") as f:
        assert list(f.keys()) == ["model.w"]


def test_export_memory_stays_within_its_buffer(tmp_path):
    """A 256 MiB checkpoint exported through a 16 MiB buffer, in a fresh process: its peak RSS grows by about the
    buffer, not by the checkpoint's size."""
    ckpt = str(tmp_path / "ckpt")
    rng = np.random.default_rng(0)
    distckpt.save({f"w{i}": rng.integers(0, 255, (4096, 4096), np.uint8) for i in range(16)}, ckpt)
    script = textwrap.dedent(f"""
        import resource, distckpt
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        distckpt.export_safetensors({ckpt!r}, {str(tmp_path / "hub")!r}, "100MB", buffer_size="16MiB")
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) * 1024)
    """)
    grown = int(subprocess.check_output([sys.executable, "-c", script], text=True, timeout=300).strip())
    # The buffer (16 MiB) plus the reader's own segment buffers and mapped pages in flight; far below 256 MiB.
    assert grown < 64 << 20, f"peak RSS grew by {grown / 2**20:.1f} MiB exporting 256 MiB through a 16 MiB buffer"
