"""Checkpoints other libraries wrote, read in place by the core (docs/foreign.md): Hugging Face safetensors files
and hub directories written by the real ``safetensors`` library, compared value by value with that library's own
load; resharded loads on several ranks over Gloo; zero-copy mappings; hostile files refused naming the file.
PyTorch DCP directories: test_foreign_dcp.py."""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

import _foreign_workers
import _workers
import distckpt

safetensors_numpy = pytest.importorskip("safetensors.numpy")
safetensors = pytest.importorskip("safetensors")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

DEADLINE = 180


def _numpy_tensors():
    rng = np.random.default_rng(7)
    out = {f"int/{t}": rng.integers(-100, 100, (3, 5)).astype(t) for t in ("int8", "int16", "int32", "int64")}
    out.update({f"uint/{t}": rng.integers(0, 200, (4,)).astype(t) for t in ("uint8", "uint16", "uint32", "uint64")})
    out.update({f"float/{t}": rng.standard_normal((2, 3, 4)).astype(t) for t in ("float16", "float32", "float64")})
    out["bool"] = rng.integers(0, 2, (7,)).astype(bool)
    out["complex64"] = (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64)
    out["scalar"] = np.array(3.5, np.float32)
    out["empty"] = np.zeros((0, 4), np.float32)
    out["bf16"] = rng.standard_normal((4, 4)).astype(ml_dtypes.bfloat16)
    return out


def test_a_file_written_by_safetensors_numpy_reads_in_place(tmp_path):
    tensors = _numpy_tensors()
    path = tmp_path / "weights.safetensors"
    safetensors_numpy.save_file(tensors, str(path), metadata={"format": "np", "source": "test"})
    want = safetensors_numpy.load_file(str(path))
    with distckpt.open(path) as r:
        assert r.metadata.format == "safetensors" and not r.metadata.checksummed
        assert r.user_metadata == {"format": "np", "source": "test"}
        assert set(r) == set(want)
        for name, value in want.items():
            got = r.read(name)
            assert got.dtype == value.dtype and got.shape == value.shape, name
            np.testing.assert_array_equal(got, value, err_msg=name)
        # A region: only its bytes are read.
        np.testing.assert_array_equal(r["float/float32"][1, :, 1:3], want["float/float32"][1, :, 1:3])
        with pytest.raises(distckpt.UnsupportedError, match="weights.safetensors.*no checksums"):
            r.verify()
    # load() into a nested target, by entry name.
    out = distckpt.load({"bool": np.zeros(7, bool), "int/int32": np.zeros((3, 5), np.int32)}, path)
    np.testing.assert_array_equal(out["int/int32"], want["int/int32"])


def _hub(tmp_path, tensors, files):
    """A hub-style directory: `files` lists of names per shard, an index mapping each to its file."""
    hub = tmp_path / "hub"
    hub.mkdir()
    weight_map = {}
    for i, names in enumerate(files):
        fname = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        safetensors_torch.save_file({n: tensors[n] for n in names}, str(hub / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in names})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (hub / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return hub


def _torch_model():
    g = torch.Generator().manual_seed(3)
    return {
        "embed.weight": torch.randn(50, 16, generator=g).to(torch.bfloat16),
        "layers.0.attn.qkv.weight": torch.randn(48, 16, generator=g).to(torch.bfloat16),
        "layers.0.mlp.up.weight": torch.randn(64, 16, generator=g),
        "layers.0.norm.weight": torch.ones(16, dtype=torch.float16),
        "lm_head.weight": torch.randn(50, 16, generator=g).to(torch.float8_e4m3fn),
        "step": torch.tensor(1234, dtype=torch.int64),
    }


def test_a_hub_directory_reads_as_transformers_loads_it(tmp_path):
    tensors = _torch_model()
    names = list(tensors)
    hub = _hub(tmp_path, tensors, [names[:2], names[2:4], names[4:]])
    # The reference: every file through safetensors, found through the index as transformers does.
    index = json.loads((hub / "model.safetensors.index.json").read_text())
    want = {}
    for fname in sorted(set(index["weight_map"].values())):
        want.update(safetensors_torch.load_file(str(hub / fname)))
    targets = {n: torch.empty_like(t) for n, t in want.items()}
    distckpt.load(targets, hub)
    for n, t in want.items():
        assert torch.equal(targets[n].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), n
    with distckpt.open(hub) as r:
        assert r.metadata.num_files == 3
        assert len(r) == len(tensors)
    # The index file itself opens the same checkpoint.
    with distckpt.open(hub / "model.safetensors.index.json") as r:
        assert set(r) == set(tensors)
    # The Go/Python CLI's view: ls/inspect go through the same reader (tests/crosslang); here the Python CLI.
    with distckpt.open(hub / "model-00002-of-00003.safetensors") as r:
        assert set(r) == set(names[2:4])


@pytest.mark.parametrize("fanout", ["auto", "always"])
def test_three_ranks_load_row_shards_of_a_hub_directory(tmp_path, fanout):
    rng = np.random.default_rng(11)
    arrays = {
        "a": rng.standard_normal((10, 6)).astype(np.float32),
        "b": rng.integers(0, 1 << 30, (7,)).astype(np.int64),
        "c": rng.standard_normal((5, 3, 2)).astype(np.float16),
    }
    hub = _hub(tmp_path, {k: torch.from_numpy(v) for k, v in arrays.items()}, [["a"], ["b", "c"]])
    np.savez(tmp_path / "expected.npz", **arrays)
    _workers.spawn(
        _workers.run,
        3,
        lambda rank, results: (
            _foreign_workers.hub_load_rank,
            rank,
            (3, f"file://{tmp_path}/rdv", str(hub), str(tmp_path / "expected.npz"), fanout),
            results,
        ),
        DEADLINE,
    )


def test_map_all_gives_read_only_views_of_the_file(tmp_path):
    tensors = _numpy_tensors()
    path = tmp_path / "weights.safetensors"
    safetensors_numpy.save_file(tensors, str(path))
    r = distckpt.open(path)
    for lazy in (False, True):
        m = r.map_all(lazy=lazy)
        assert set(m.keys()) == set(tensors) and not m.copied
        for name, value in tensors.items():
            a = m.get_tensor(name)
            assert not a.flags.writeable
            np.testing.assert_array_equal(a, value, err_msg=name)
    before = r.io_stats.bytes_read
    m = r.map_all()
    assert r.io_stats.bytes_read == before  # no read calls: the bytes come through the mapping
    r.close()
    # The views outlive the reader: the mapping stays until the last of them goes.
    np.testing.assert_array_equal(m["float/float64"], tensors["float/float64"])
    with pytest.raises(distckpt.Error, match="closed"):
        r.map_all()


def test_map_all_of_a_sharded_distckpt_checkpoint_copies_only_what_is_split(tmp_path):
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    distckpt.save({"w": w, "b": np.ones(3)}, tmp_path / "c")
    with distckpt.open(tmp_path / "c") as r:
        m = r.map_all(lazy=True)  # verified on first touch
        np.testing.assert_array_equal(m["w"], w)
        assert m.copied == []


def _raw(path):
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write_raw(path, header, data):
    body = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(body).to_bytes(8, "little") + body + data)


@pytest.mark.parametrize(
    "damage,says",
    [
        (lambda h: h["b"].update(data_offsets=[0, 16]), "overlaps"),  # b starts inside a
        (lambda h: h["b"].update(data_offsets=[16, 4096]), "holds 4080 bytes"),
        (lambda h: h["b"].update(shape=[9]), "needs 36"),
        (lambda h: h["b"].update(dtype="F4"), "F4"),
        (lambda h: h.update(c=h["b"]), "overlaps"),
    ],
)
def test_hostile_headers_are_refused_naming_the_file(tmp_path, damage, says):
    path = tmp_path / "w.safetensors"
    safetensors_numpy.save_file({"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)}, str(path))
    header, data = _raw(path)
    damage(header)
    _write_raw(path, header, data)
    with pytest.raises((distckpt.CorruptCheckpointError, distckpt.UnsupportedError), match=f"w.safetensors.*{says}"):
        distckpt.open(path)


def test_a_symlinked_shard_is_not_followed(tmp_path):
    tensors = {"x": torch.ones(3), "y": torch.zeros(2)}
    hub = _hub(tmp_path, tensors, [["x"], ["y"]])
    outside = tmp_path / "outside.safetensors"
    safetensors_torch.save_file({"y": torch.full((2,), 7.0)}, str(outside))
    shard = hub / "model-00002-of-00002.safetensors"
    os.unlink(shard)
    os.symlink(outside, shard)
    with pytest.raises(distckpt.Error, match="model-00002-of-00002.safetensors"):
        distckpt.load({"x": torch.zeros(3), "y": torch.zeros(2)}, hub)
