"""Compressed saves (``save(..., compression="zstd")``, FORMAT.md "Compressed chunks") through the Python package and
the real core: the files shrink, every read returns the saved values (resharded over real Gloo ranks, regions, views,
async saves, incremental saves), and a damaged stored block is refused naming the checkpoint, entry and file."""

from __future__ import annotations

import os

import numpy as np
import pytest

import _workers
import distckpt

DEADLINE = 180


def run_ranks(fn, world, *args):
    _workers.spawn(_workers.run, world, lambda rank, results: (fn, rank, (world, *args), results), DEADLINE)


def weights() -> dict:
    rng = np.random.default_rng(11)
    return {
        "w": (rng.standard_normal((512, 1024)) * 0.02).astype(np.float32),
        "h": (rng.standard_normal((256, 512)) * 0.02).astype(np.float16),
        "ids": np.arange(100_000, dtype=np.int64),
        "noise": rng.integers(0, 256, 300_000, dtype=np.uint8),
        "step": 12,
    }


def data_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.startswith("data-"))


def test_a_compressed_save_is_smaller_and_loads_exactly(tmp_path):
    want = weights()
    raw = distckpt.save(want, tmp_path / "raw")
    packed = distckpt.save(want, tmp_path / "zstd", compression="zstd")
    assert packed.total_bytes == raw.total_bytes
    assert packed.bytes_written < raw.bytes_written * 0.85
    assert data_bytes(tmp_path / "zstd") < data_bytes(tmp_path / "raw") * 0.85
    with distckpt.open(tmp_path / "zstd") as r:
        m = r.metadata
        assert m.format_version == (3, 0)
        assert m.stored_bytes == packed.bytes_written < m.total_bytes
        assert m.compressed_chunks >= 3
        assert m["w"].chunks[0].codec == "zstd" and m["w"].chunks[0].stored_length < m["w"].nbytes
        assert m["noise"].chunks[0].codec == "none"  # random bytes do not shrink: stored raw
        np.testing.assert_array_equal(r["w"][100:300, 17:900], want["w"][100:300, 17:900])
        r.verify()
        views = r.map_all()  # compressed tensors are decoded by the core (kept by the reader), not mapped
        np.testing.assert_array_equal(views["h"], want["h"])
        np.testing.assert_array_equal(views["w"], want["w"])
        assert "w" in views.copied and "noise" not in views.copied
        lazy = r.map_all(lazy=True)  # decoded on first touch
        np.testing.assert_array_equal(lazy["w"], want["w"])
        np.testing.assert_array_equal(lazy["noise"], want["noise"])
    got = distckpt.load(None, tmp_path / "zstd")
    for k in ("w", "h", "ids", "noise"):
        np.testing.assert_array_equal(got[k], want[k])
    assert got["step"] == 12
    with distckpt.open(tmp_path / "raw") as r:
        assert r.metadata.format_version[0] == 1 and r.metadata.compressed_chunks == 0


def test_levels_async_and_incremental_saves(tmp_path):
    want = weights()
    fast = distckpt.save(want, tmp_path / "fast", compression="zstd", compression_level=-3)
    slow = distckpt.save(want, tmp_path / "slow", compression="zstd", compression_level=9)
    assert slow.bytes_written <= fast.bytes_written
    with pytest.raises(ValueError, match="compression='lz4'"):
        distckpt.save(want, tmp_path / "bad", compression="lz4")
    with pytest.raises(distckpt.Error, match="compression level 99"):
        distckpt.save(want, tmp_path / "bad", compression="zstd", compression_level=99)
    handle = distckpt.async_save(want, tmp_path / "async", compression="zstd")
    want_w = want["w"].copy()
    want["w"][...] = 0  # the staged copy is what is compressed
    assert handle.result(timeout=60).bytes_written < handle.result(timeout=60).total_bytes
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "async")["w"], want_w)
    want["w"][...] = want_w
    want["step"] = 13
    incr = distckpt.save(want, tmp_path / "incr", base=tmp_path / "fast", compression="zstd")
    assert incr.bytes_reused >= want["w"].nbytes
    got = distckpt.load(None, tmp_path / "incr")
    np.testing.assert_array_equal(got["w"], want_w)
    assert got["step"] == 13
    flat = distckpt.flatten(tmp_path / "incr", tmp_path / "flat")
    assert flat["bytes_copied"] < incr.total_bytes  # compressed chunks are copied as stored
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "flat")["h"], want["h"])


def test_a_damaged_stored_block_is_refused_naming_entry_and_file(tmp_path):
    want = weights()
    distckpt.save({"w": want["w"]}, tmp_path / "c", compression="zstd")
    with distckpt.open(tmp_path / "c") as r:
        chunk = r.metadata["w"].chunks[0]
    with open(tmp_path / "c" / chunk.file, "r+b") as f:
        f.seek(chunk.file_offset + chunk.stored_length // 2)
        b = f.read(1)
        f.seek(chunk.file_offset + chunk.stored_length // 2)
        f.write(bytes([b[0] ^ 0x01]))
    with pytest.raises(distckpt.CorruptCheckpointError, match=r"entry 'w' chunk #0 block #\d+ in data file 'data-"):
        distckpt.load(None, tmp_path / "c")
    with distckpt.open(tmp_path / "c") as r:
        with pytest.raises(distckpt.CorruptCheckpointError, match="stored checksum mismatch"):
            r.verify()


def test_three_ranks_save_compressed_two_ranks_load_it_resharded(tmp_path):
    path, async_path = str(tmp_path / "ckpt"), str(tmp_path / "ckpt_async")
    run_ranks(_workers.save_rank, 3, f"file://{tmp_path}/rdv_save", path, async_path, "zstd")
    with distckpt.open(path) as r:
        assert r.metadata.format_version == (3, 0) and r.metadata.compressed_chunks > 0
    run_ranks(_workers.load_rank, 2, f"file://{tmp_path}/rdv_load", path)
    run_ranks(_workers.load_rank, 2, f"file://{tmp_path}/rdv_fanout", async_path, "always")
