"""distckpt.consolidate: a checkpoint as one torch.save / safetensors file, and a torch.save file as a checkpoint.

Every result is loaded by the real consumer (torch.load(weights_only=True), safetensors) and compared value by value,
byte for byte for tensors. Memory bounds are measured in a fresh process with resource.getrusage.
"""

from __future__ import annotations

import fractions
import io
import itertools
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import distckpt
from conftest import all_numpy_dtypes, assert_same, sample, tensor_bytes
from distckpt.consolidate import _pieces, consolidate, import_torch_save

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# Subprocesses import the distckpt this process imported (the installed package, or the sources on PYTHONPATH).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(distckpt.__file__)))
PYTHONPATH = os.pathsep.join(p for p in [_PACKAGE_DIR, os.environ.get("PYTHONPATH", "")] if p)


def _torch_dtype(np_dtype):
    names = {"bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "uint16": torch.uint16,
             "int16": torch.int16, "uint32": torch.uint32, "int32": torch.int32, "uint64": torch.uint64,
             "int64": torch.int64, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
             "complex64": torch.complex64, "complex128": torch.complex128, "bfloat16": torch.bfloat16,
             "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}  # fmt: skip
    return names[np.dtype(np_dtype).name]


def _to_torch(a):
    """A numpy array as the torch tensor with the same dtype and bytes."""
    t = torch.frombuffer(bytearray(a.tobytes()), dtype=torch.uint8) if a.nbytes else torch.empty(0, dtype=torch.uint8)
    return t.view(_torch_dtype(a.dtype)).reshape(a.shape)


def _state():
    """Every dtype, nested dicts/lists/tuples, int keys, plain values; tensors larger than the tiny test budget."""
    arrays = {np.dtype(dt).name: sample((3, 5, 700) if i % 3 == 0 else (41, 37), dt, seed=i)
              for i, dt in enumerate(all_numpy_dtypes())}  # fmt: skip
    state = {
        "model": {"layers": [{"w": arrays["float32"], "b": np.arange(5, dtype=np.float64)}, {"w": arrays["bfloat16"]}],
                  "dtypes": arrays, "scalar0d": np.array(2.5, np.float32), "empty": np.zeros((0, 3), np.int32)},
        "optimizer": {"state": {0: {"exp_avg": arrays["float16"], "step": 10}}, "param_groups": [{"lr": 0.1}]},
        "pair": (np.ones(3, np.int8), "tag"),
        "step": 1000, "lr": 3e-4, "name": "run-1", "flags": [True, None, 2.5], "nan": float("nan"), "blob": b"\x00\x01",
        "np_step": np.int64(7),
    }  # fmt: skip
    return state


def _expected_torch(x):
    """What the torch file must hold for the state _state() saved: numpy arrays as tensors, numpy scalars as numbers."""
    if isinstance(x, np.ndarray):
        return _to_torch(x)
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {k: _expected_torch(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_expected_torch(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_expected_torch(v) for v in x)
    return x


def test_pieces_tile_the_tensor_in_c_order():
    rng = np.random.default_rng(5)
    for _ in range(300):
        shape = tuple(int(s) for s in rng.integers(0, 6, size=rng.integers(0, 5)))
        itemsize = int(rng.choice([1, 2, 4, 8, 16]))
        budget = int(rng.integers(itemsize, 400))
        a = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
        seen = []
        for offsets, lengths in _pieces(shape, itemsize, budget):
            box = a[tuple(slice(o, o + n) for o, n in zip(offsets, lengths))]
            assert box.size >= 1 and box.size * itemsize <= max(budget, itemsize)
            seen.extend(box.reshape(-1).tolist())
        assert seen == list(range(a.size)), (shape, itemsize, budget)


def test_torch_file_equals_the_checkpoint_and_torch_saves_own_pickle(tmp_path):
    state = _state()
    distckpt.save(state, tmp_path / "ckpt")
    out = tmp_path / "model.pt"
    # 8 KiB of buffers: every tensor above 4 KiB goes through in many pieces, rows of (3, 5, 700) included.
    summary = consolidate(tmp_path / "ckpt", out, max_memory=8192)
    assert summary.format == "torch" and summary.path == str(out) and summary.bytes == out.stat().st_size
    want = _expected_torch(state)
    got = torch.load(out, weights_only=True)
    assert_same(got, want)
    assert_same(torch.load(out, weights_only=True, mmap=True), want)  # the records are aligned for mapping
    with zipfile.ZipFile(out) as mine:
        assert mine.testzip() is None  # every CRC matches
    # For nested tensors the pickle is byte for byte the one torch.save writes for the same state dict (values
    # decoded from JSON differ only in which equal strings pickle memoizes, which depends on object identity).
    distckpt.save({"model": state["model"]}, tmp_path / "tensors")
    consolidate(tmp_path / "tensors", tmp_path / "tensors.pt")
    ref = io.BytesIO()
    torch.save({"model": want["model"]}, ref)
    with zipfile.ZipFile(tmp_path / "tensors.pt") as mine, zipfile.ZipFile(ref) as theirs:
        assert mine.read("archive/data.pkl") == theirs.read("archive/data.pkl")
        names = [i.filename for i in mine.infolist()]
        assert names == [i.filename for i in theirs.infolist()]
        for i in mine.infolist():
            assert (i.header_offset + 30 + len(i.filename) + len(_local_extra(mine, i))) % 64 == 0, i.filename
    os.unlink(tmp_path / "tensors.pt")
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "model.pt", "tensors"]  # no temporary file left


def _local_extra(z, info):
    """The extra field of a record's local header (which holds the alignment padding)."""
    z.fp.seek(info.header_offset + 28)
    n = int.from_bytes(z.fp.read(2), "little")
    z.fp.seek(info.header_offset + 30 + len(info.filename))
    return z.fp.read(n)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_safetensors_file_holds_every_tensor(tmp_path):
    from safetensors import safe_open

    state = _state()
    del state["model"]["dtypes"]["complex128"]  # safetensors has no C128 (tested below)
    distckpt.save(state, tmp_path / "ckpt", user_metadata={"framework": "test"})
    out = tmp_path / "weights.safetensors"
    summary = consolidate(tmp_path / "ckpt", out)
    assert os.listdir(tmp_path) == sorted(os.listdir(tmp_path)) and set(os.listdir(tmp_path)) == {"ckpt", out.name}
    with distckpt.open(tmp_path / "ckpt") as r:
        tensors = {n: r.read(n) for n, e in r.metadata.items() if e.kind == "tensor"}
        values = sorted(n for n, e in r.metadata.items() if e.kind != "tensor")
    assert summary.num_tensors == len(tensors) and sorted(summary.skipped) == values
    with safe_open(str(out), "pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        assert f.metadata()["framework"] == "test"
        for name, a in tensors.items():
            t = f.get_tensor(name)
            assert t.dtype == _torch_dtype(a.dtype) and tuple(t.shape) == np.shape(a), name
            assert tensor_bytes(t) == np.asarray(a).tobytes(), name


def test_c128_cannot_go_to_safetensors_and_nothing_is_left(tmp_path):
    distckpt.save({"z": np.ones(3, np.complex128)}, tmp_path / "ckpt")
    with pytest.raises(distckpt.UnsupportedError, match="z"):
        consolidate(tmp_path / "ckpt", tmp_path / "out.safetensors")
    assert os.listdir(tmp_path) == ["ckpt"]


def test_checkpoint_saved_by_three_ranks(tmp_path):
    from test_multiprocess import run_ranks

    import _workers

    path = str(tmp_path / "ckpt")
    run_ranks(_workers.save_rank, 3, f"file://{tmp_path}/rdv", path, str(tmp_path / "ckpt_async"))
    with distckpt.open(path) as r:
        assert r.metadata["model.w"].num_chunks == 3 and r.metadata["model.emb"].num_chunks == 3
    ex = _workers.expected()
    consolidate(path, tmp_path / "full.pt", max_memory=8192)
    got = torch.load(tmp_path / "full.pt", weights_only=True)
    assert_same(
        got,
        {
            "model": {k: _to_torch(ex[n]) for k, n in [("w", "w"), ("emb", "emb"), ("bias", "bias"), ("f16", "f16")]},
            "step": 1000,
            "world": 3,
        },
    )
    consolidate(path, tmp_path / "full.safetensors")
    from safetensors.numpy import load_file

    st = load_file(str(tmp_path / "full.safetensors"))
    assert sorted(st) == ["model.bias", "model.emb", "model.f16", "model.w"]
    for k in ("w", "emb", "bias", "f16"):
        np.testing.assert_array_equal(st[f"model.{k}"], ex[k])


# The peak resident set of this process: VmHWM, which exec resets. (resource.getrusage's ru_maxrss does not: a child
# keeps the high-water mark its parent had when it forked, here pytest's with torch and the test arrays.)
_MEMORY_SCRIPT = r"""
import json, sys
import numpy as np
import distckpt
from distckpt.consolidate import consolidate

def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

ckpt, out, budget = sys.argv[1], sys.argv[2], sys.argv[3]
with distckpt.open(ckpt):  # the metadata, read once before the baseline
    pass
base = hwm()
s = consolidate(ckpt, out, max_memory=budget)
print(json.dumps({"base": base, "peak": hwm(), "seconds": s.seconds, "bytes": s.bytes}))
"""


def _big_checkpoint(path):
    """~200 MiB: one 128 MiB tensor (far above the budgets), one 64 MiB, small ones; values from their index."""
    state = {"model": {"big": np.arange(32 * 2**20, dtype=np.float32).reshape(4096, 8192),
                       "emb": (np.arange(8 * 2**20, dtype=np.int64) * 7).reshape(2**20, 8),
                       "b": np.arange(1000, dtype=np.float64)}, "step": 7}  # fmt: skip
    distckpt.save(state, path, sync=False)
    return state


def _measure(tmp_path, out, budget):
    p = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(tmp_path / "ckpt"), str(out), budget],
                       env={**os.environ, "PYTHONPATH": PYTHONPATH}, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_consolidating_a_large_checkpoint_stays_within_max_memory(tmp_path):
    state = _big_checkpoint(tmp_path / "ckpt")
    total = sum(a.nbytes for a in state["model"].values())
    m = _measure(tmp_path, tmp_path / "big.pt", "16MiB")
    grew = m["peak"] - m["base"]
    print(f"torch: {total / 2**20:.0f} MiB checkpoint, --max-memory 16MiB: peak RSS grew {grew / 2**20:.1f} MiB "
          f"in {m['seconds']:.2f}s")  # fmt: skip
    assert grew < 16 * 2**20 + 8 * 2**20, grew  # the buffers, plus a little
    got = torch.load(tmp_path / "big.pt", weights_only=True, mmap=True)
    assert_same(got, _expected_torch(state))
    os.unlink(tmp_path / "big.pt")
    # safetensors: the core's exporter, with --max-memory as its buffer (plus the reader's 8 MiB segment buffers).
    m = _measure(tmp_path, tmp_path / "big.safetensors", "16MiB")
    grew = m["peak"] - m["base"]
    print(f"safetensors: peak RSS grew {grew / 2**20:.1f} MiB in {m['seconds']:.2f}s")
    assert grew < 16 * 2**20 + 32 * 2**20, grew
    from safetensors import safe_open

    with safe_open(str(tmp_path / "big.safetensors"), "np") as f:
        for k, a in state["model"].items():
            np.testing.assert_array_equal(f.get_tensor(f"model.{k}"), a)


def test_import_torch_save_and_back(tmp_path):
    # What a Lightning / plain PyTorch checkpoint looks like: nested dicts, int keys, lists, plain values.
    sd = {
        "state_dict": {"layer.weight": torch.randn(16, 8), "layer.bias": torch.randn(16, dtype=torch.float64),
                       "emb": torch.randint(0, 100, (10, 4)), "half": torch.randn(3, 3).to(torch.bfloat16)},
        "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(16, 8)}},
                              "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0, 1]}]}],
        "epoch": 4, "global_step": 100, "hparams": {"name": "net", "dropout": 0.1},
    }  # fmt: skip
    src = tmp_path / "lightning.ckpt"
    torch.save(sd, src)
    summary = import_torch_save(src, tmp_path / "ckpt")
    assert summary.num_entries == 11
    with distckpt.open(tmp_path / "ckpt") as r:
        assert sorted(r.metadata) == sorted([
            "state_dict.layer.weight", "state_dict.layer.bias", "state_dict.emb", "state_dict.half",
            "optimizer_states.0.state.0.step", "optimizer_states.0.state.0.exp_avg",
            "optimizer_states.0.param_groups", "epoch", "global_step", "hparams.name", "hparams.dropout"])  # fmt: skip
        assert r.user_metadata["converted_from"] == "torch.save" and r.user_metadata["epoch"] == "4"
        np.testing.assert_array_equal(r.read("state_dict.layer.weight"), sd["state_dict"]["layer.weight"].numpy())
    # Back to one torch file: the same state dict, every value.
    consolidate(tmp_path / "ckpt", tmp_path / "back.pt", max_memory=8192)
    assert_same(torch.load(tmp_path / "back.pt", weights_only=True), sd)


def test_import_torch_refuses_bad_files(tmp_path):
    with pytest.raises(distckpt.NotFoundError, match="nope.pt"):
        import_torch_save(tmp_path / "nope.pt", tmp_path / "c")
    torch.save([torch.ones(2)], tmp_path / "list.pt")
    with pytest.raises(distckpt.InvalidArgumentError, match="list.pt.*list"):
        import_torch_save(tmp_path / "list.pt", tmp_path / "c")
    torch.save({"f": fractions.Fraction(1, 3)}, tmp_path / "obj.pt")
    with pytest.raises(distckpt.PickleNotAllowedError, match="obj.pt"):
        import_torch_save(tmp_path / "obj.pt", tmp_path / "c")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file at all")
    with pytest.raises(distckpt.CorruptCheckpointError, match="junk.pt"):
        import_torch_save(tmp_path / "junk.pt", tmp_path / "c")
    assert not (tmp_path / "c").exists()
    # A file that is trusted: full pickle on both sides.
    import_torch_save(tmp_path / "obj.pt", tmp_path / "c", weights_only=False, allow_pickle=True)
    with pytest.raises(distckpt.PickleNotAllowedError):
        consolidate(tmp_path / "c", tmp_path / "obj2.pt")
    consolidate(tmp_path / "c", tmp_path / "obj2.pt", allow_pickle=True)
    assert torch.load(tmp_path / "obj2.pt", weights_only=False) == {"f": fractions.Fraction(1, 3)}


def test_consolidate_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(distckpt.NotFoundError, match="missing"):
        consolidate(tmp_path / "missing", tmp_path / "o.pt")
    distckpt.save({"w": np.arange(4096, dtype=np.float32)}, tmp_path / "ckpt")
    with pytest.raises(distckpt.InvalidArgumentError, match="o.txt"):
        consolidate(tmp_path / "ckpt", tmp_path / "o.txt")
    consolidate(tmp_path / "ckpt", tmp_path / "o.txt", format="torch")
    with pytest.raises(distckpt.AlreadyExistsError, match="o.txt"):
        consolidate(tmp_path / "ckpt", tmp_path / "o.txt", format="torch")
    with pytest.raises(distckpt.InvalidArgumentError, match="directory"):
        consolidate(tmp_path / "ckpt", tmp_path / "ckpt", format="torch")
    with pytest.raises(distckpt.NotFoundError, match="nodir"):
        consolidate(tmp_path / "ckpt", tmp_path / "nodir" / "o.pt")
    with pytest.raises(distckpt.InvalidArgumentError, match="max_memory"):
        consolidate(tmp_path / "ckpt", tmp_path / "o.pt", max_memory=100)
    # A flipped byte in the data: the checksum fails naming the entry, and nothing is published.
    with distckpt.open(tmp_path / "ckpt") as r:
        c = r.metadata["w"].chunks[0]
    with open(tmp_path / "ckpt" / c.file, "r+b") as f:
        f.seek(c.file_offset + 100)
        byte = f.read(1)
        f.seek(c.file_offset + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    for out in ("bad.pt", "bad.safetensors"):
        with pytest.raises(distckpt.CorruptCheckpointError, match="'w'|w"):
            consolidate(tmp_path / "ckpt", tmp_path / out)
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "o.txt"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "distckpt", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": PYTHONPATH}, timeout=300)  # fmt: skip


def test_cli_consolidate_and_import_torch(tmp_path):
    state = {"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "step": 5}
    distckpt.save(state, tmp_path / "ckpt")
    p = _cli("consolidate", tmp_path / "ckpt", tmp_path / "m.pt", "--max-memory", "1MiB")
    assert p.returncode == 0 and "m.pt: torch, 1 tensors" in p.stdout, p.stderr
    assert_same(torch.load(tmp_path / "m.pt", weights_only=True), _expected_torch(state))
    p = _cli("consolidate", tmp_path / "ckpt", tmp_path / "m.pt")
    assert p.returncode == 3 and "already exists" in p.stderr  # docs/cli.md: a failure
    p = _cli("consolidate", "--format", "safetensors", tmp_path / "ckpt", tmp_path / "m.bin")
    assert p.returncode == 0 and "left out 1 values" in p.stderr and "step" in p.stderr, p.stderr
    from safetensors.numpy import load_file

    np.testing.assert_array_equal(load_file(str(tmp_path / "m.bin"))["model.w"], state["model"]["w"])
    p = _cli("import-torch", tmp_path / "m.pt", tmp_path / "back")
    assert p.returncode == 0 and "2 entries" in p.stdout, p.stderr
    back = distckpt.load(None, tmp_path / "back")
    np.testing.assert_array_equal(back["model"]["w"], state["model"]["w"])
    assert back["step"] == 5
    p = _cli("consolidate", tmp_path / "nope", tmp_path / "x.pt")
    assert p.returncode == 4 and "nope" in p.stderr  # docs/cli.md: not found
    p = _cli("consolidate", tmp_path / "ckpt", tmp_path / "x.pt", "--format", "onnx")
    assert p.returncode == 2


def test_example_runs(tmp_path):
    script = os.path.join(ROOT, "examples", "python", "consolidate_example.py")
    p = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": PYTHONPATH})  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert "torch.load matches" in p.stdout and "round trip matches" in p.stdout, p.stdout
    assert (tmp_path / "model.pt").is_file() and (tmp_path / "model.safetensors").is_file()


def test_every_piece_size_gives_the_same_file_contents(tmp_path):
    distckpt.save({"a": sample((7, 9, 11), np.float64), "b": sample((5, 3), np.int16)}, tmp_path / "ckpt")
    loaded = []
    for budget, name in zip((8192, 16384, 2**20), itertools.count()):
        out = tmp_path / f"o{name}.pt"
        consolidate(tmp_path / "ckpt", out, max_memory=budget)
        loaded.append(torch.load(out, weights_only=True))
    for other in loaded[1:]:
        assert_same(other, loaded[0])
