"""safetensors interop, checked with the real `safetensors` package from PyPI (and torch's loader when present)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import all_numpy_dtypes, ml_dtypes, sample

import distckpt

safetensors = pytest.importorskip("safetensors", reason="the safetensors package is not installed")
from safetensors import deserialize, safe_open  # noqa: E402
from safetensors.numpy import save_file as np_save_file  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

# safetensors' numpy backend lacks these; they are checked through deserialize (and torch when installed).
NO_NUMPY_BACKEND = {"BF16", "F8_E4M3", "F8_E5M2", "C128"}
ST_NAME = {np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8", np.dtype(np.uint16): "U16",
           np.dtype(np.int16): "I16", np.dtype(np.uint32): "U32", np.dtype(np.int32): "I32",
           np.dtype(np.uint64): "U64", np.dtype(np.int64): "I64", np.dtype(np.float16): "F16",
           np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.complex64): "C64"}  # fmt: skip
if ml_dtypes is not None:
    ST_NAME.update({np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
                    np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2"})  # fmt: skip


@pytest.fixture
def model(tmp_path):
    """A checkpoint with every exportable dtype, several shapes, sharded tensors, objects and user metadata."""
    tensors = {}
    for i, dt in enumerate(d for d in all_numpy_dtypes() if d != np.complex128):
        tensors[f"layers.{i}.weight"] = sample((16, 9), dt, seed=i)
    tensors["scalar"] = np.array(3.5, np.float32)
    tensors["empty"] = np.zeros((0, 4), np.int32)
    tensors["deep"] = sample((2, 1, 2, 1, 2, 1, 2, 3), np.float32)
    big = sample((300, 128), np.float32)  # 150 KB: larger than the shard size below
    state = {
        "model": dict(tensors, big=[distckpt.Shard(big[:100], big.shape, (0, 0)),
                                    distckpt.Shard(big[100:], big.shape, (100, 0))]),
        "step": 12,
    }  # fmt: skip
    path = tmp_path / "ckpt"
    distckpt.save(state, path, user_metadata={"source": "test", "step": "12"})
    expected = {f"model.{k}": v for k, v in tensors.items()}
    expected["model.big"] = big
    return str(path), expected


def test_export_loads_in_the_real_safetensors_package(model, tmp_path):
    path, expected = model
    out = tmp_path / "hf"
    files = distckpt.export_safetensors(path, out, max_shard_size="4KB")
    *shards, index_path = files
    n = len(shards)
    assert n >= 3
    assert [os.path.basename(f) for f in shards] == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads(open(index_path).read())
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in expected.values())
    assert set(index["weight_map"]) == set(expected)  # bytes entries ("step") are not tensors

    seen = {}
    for f in shards:
        size = os.path.getsize(f)
        raw = open(f, "rb").read()
        parsed = dict(deserialize(raw))  # the package's own parser and validator
        if "model.big" not in parsed:
            assert size <= 4_000
        for name, info in parsed.items():
            a = expected[name]
            assert index["weight_map"][name] == os.path.basename(f)
            assert info["dtype"] == ST_NAME[a.dtype] and list(info["shape"]) == list(a.shape)
            assert bytes(info["data"]) == a.tobytes(), name
            seen[name] = f
        with safe_open(f, framework="np") as st:
            assert st.metadata() == {"source": "test", "step": "12", "format": "pt"}
            for name in st.keys():
                if ST_NAME[expected[name].dtype] not in NO_NUMPY_BACKEND:
                    got = st.get_tensor(name)
                    np.testing.assert_array_equal(got, expected[name])
                    assert got.dtype == expected[name].dtype
    assert set(seen) == set(expected)


@pytest.mark.skipif(torch is None, reason="torch is not installed: safetensors.torch cannot be checked")
def test_export_loads_in_safetensors_torch_with_bf16_and_fp8(model, tmp_path):
    from safetensors.torch import load_file

    path, expected = model
    *shards, _ = distckpt.export_safetensors(path, tmp_path / "hf", max_shard_size=10**9)
    assert len(shards) == 1
    loaded = load_file(shards[0])
    assert set(loaded) == set(expected)
    for name, t in loaded.items():
        a = expected[name]
        assert t.element_size() == a.itemsize and tuple(t.shape) == a.shape
        raw = t.view(torch.uint8) if t.dim() and t.numel() else t.reshape(-1).view(torch.uint8)
        assert raw.numpy().tobytes() == a.tobytes(), name


def test_complex128_is_refused_by_name(tmp_path):
    distckpt.save({"ok": np.ones(2), "z": np.ones(2, np.complex128)}, tmp_path / "c")
    with pytest.raises(distckpt.UnsupportedError, match="'z'.*C128"):
        distckpt.export_safetensors(tmp_path / "c", tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []


def test_import_from_files_directories_and_index(tmp_path):
    a = {"embed.weight": sample((10, 4), np.float32), "head.bias": np.arange(3, dtype=np.int64)}
    b = {"layer.0.w": sample((2, 2, 2), np.float16), "flag": np.array([True, False])}
    np_save_file(a, str(tmp_path / "a.safetensors"), metadata={"format": "np", "origin": "x"})
    np_save_file(b, str(tmp_path / "b.safetensors"))
    summary = distckpt.import_safetensors([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], tmp_path / "c1")
    assert summary.num_entries == 4
    out = distckpt.load(None, tmp_path / "c1")
    assert set(out) == set(a) | set(b)  # HF names kept flat
    for k, v in {**a, **b}.items():
        np.testing.assert_array_equal(out[k], v)
        assert out[k].dtype == v.dtype
    with distckpt.open(tmp_path / "c1") as r:
        assert r.user_metadata == {"format": "np", "origin": "x"}

    # A directory, and an exported index, round trip the same tensors.
    distckpt.import_safetensors(tmp_path, tmp_path / "c2")
    files = distckpt.export_safetensors(tmp_path / "c2", tmp_path / "hf", max_shard_size=100)
    distckpt.import_safetensors(files[-1], tmp_path / "c3")
    again = distckpt.load(None, tmp_path / "c3")
    for k, v in {**a, **b}.items():
        np.testing.assert_array_equal(again[k], v)


@pytest.mark.skipif(torch is None, reason="torch is not installed: cannot write BF16/FP8 safetensors files")
def test_import_bf16_and_fp8_written_by_safetensors_torch(tmp_path):
    from safetensors.torch import save_file

    tensors = {"bf": torch.randn(5, 3).to(torch.bfloat16), "f8": torch.randn(7).to(torch.float8_e4m3fn),
               "f8b": torch.randn(2, 2).to(torch.float8_e5m2)}  # fmt: skip
    save_file(tensors, str(tmp_path / "t.safetensors"))
    distckpt.import_safetensors(tmp_path / "t.safetensors", tmp_path / "c")
    with distckpt.open(tmp_path / "c") as r:
        assert {n: r.metadata[n].dtype for n in r} == {"bf": "BF16", "f8": "F8_E4M3", "f8b": "F8_E5M2"}
    targets = {k: torch.zeros_like(v) for k, v in tensors.items()}
    distckpt.load(targets, tmp_path / "c")
    for k, v in tensors.items():
        assert torch.equal(targets[k].view(torch.uint8), v.view(torch.uint8)), k


def test_import_rejects_damaged_files(tmp_path):
    np_save_file({"w": np.ones(4, np.float32)}, str(tmp_path / "ok.safetensors"))
    raw = bytearray(open(tmp_path / "ok.safetensors", "rb").read())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["w"]["data_offsets"] = [0, 4096]  # points past the end of the file
    body = json.dumps(header).encode()
    (tmp_path / "bad.safetensors").write_bytes(len(body).to_bytes(8, "little") + body + raw[8 + n :])
    with pytest.raises(distckpt.CorruptCheckpointError, match='bad.safetensors.*tensor "w": holds 4096 bytes'):
        distckpt.import_safetensors(tmp_path / "bad.safetensors", tmp_path / "c")
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(distckpt.CorruptCheckpointError, match="short.safetensors.*too short for a header"):
        distckpt.import_safetensors(tmp_path / "short.safetensors", tmp_path / "c")
    assert not os.path.exists(tmp_path / "c")


def test_parse_size():
    from distckpt.interop import parse_size

    assert parse_size("5GB") == 5 * 10**9 and parse_size("500MB") == 5 * 10**8 and parse_size("4GiB") == 4 << 30
    assert parse_size(123) == 123 and parse_size("1.5 kb") == 1500
    with pytest.raises(distckpt.InvalidArgumentError):
        parse_size("lots")
    with pytest.raises(distckpt.InvalidArgumentError):
        parse_size(0)
