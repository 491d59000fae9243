"""distckpt.open: metadata, lazy views, partial reads that read only the needed bytes (checked by I/O counters)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import sample

import distckpt


@pytest.fixture
def matrix_ckpt(tmp_path):
    a = sample((1024, 1024), np.float32)  # 4 MiB, rows of 4 KiB
    path = tmp_path / "m"
    distckpt.save({"a": a, "step": 3, "small": np.arange(5)}, path, checksum_block_size=4096)
    return str(path), a


def test_metadata_describes_dtype_shape_and_chunks(tmp_path):
    full = sample((8, 6), np.float64)
    shards = [distckpt.Shard(full[:5], (8, 6), (0, 0)), distckpt.Shard(full[5:], (8, 6), (5, 0))]
    distckpt.save({"w": shards, "cfg": {"lr": 0.5}}, tmp_path / "c", user_metadata={"step": "9"})
    with distckpt.open(tmp_path / "c") as r:
        assert list(r.keys()) == ["cfg.lr", "w"] and len(r) == 2 and "w" in r and "x" not in r
        m = r.metadata
        assert m.format_version == (1, 2) and m.user == {"step": "9"} and m.total_bytes == full.nbytes + 3
        w = m["w"]
        assert (w.kind, w.dtype, w.shape, w.num_chunks, w.nbytes) == ("tensor", "F64", (8, 6), 2, full.nbytes)
        assert w.numpy_dtype == np.float64
        assert [(c.offsets, c.lengths) for c in w.chunks] == [((0, 0), (5, 6)), ((5, 0), (3, 6))]
        assert all(c.file.startswith("data-") and c.file_offset % 4096 == 0 for c in w.chunks)
        assert m["cfg.lr"].kind == "bytes"
        view = r["w"]
        assert (view.shape, view.dtype, view.ndim, view.size, len(view)) == ((8, 6), np.float64, 2, 48, 8)
        np.testing.assert_array_equal(np.asarray(view), full)
        np.testing.assert_array_equal(r.read("w"), full)
        assert r["cfg.lr"] == 0.5
        assert r.to_dict()["cfg"] == {"lr": 0.5}
        with pytest.raises(KeyError):
            r["missing"]
        with pytest.raises(distckpt.NotFoundError, match="'missing'"):
            r.read("missing")


@pytest.mark.parametrize(
    "index",
    [
        (slice(None),),
        (1,),
        (-1, 2),
        (slice(1, 3), slice(None), 0),
        (Ellipsis, 1),
        (slice(None, None, 2),),
        (slice(None, None, -1), slice(3, 0, -2)),
        (slice(5, 1),),
        (0, Ellipsis, slice(-2, None)),
        (np.int64(2), slice(1, 4, 3)),
    ],
    ids=repr,
)
def test_indexing_matches_numpy(tmp_path, index):
    a = sample((4, 5, 6), np.int32)
    distckpt.save({"a": a}, tmp_path / "c")
    with distckpt.open(tmp_path / "c") as r:
        got = r["a"][index]
        np.testing.assert_array_equal(got, a[index])
        assert got.shape == a[index].shape


def test_bad_indices(tmp_path):
    distckpt.save({"a": np.zeros((2, 3))}, tmp_path / "c")
    with distckpt.open(tmp_path / "c") as r:
        with pytest.raises(IndexError):
            r["a"][2]
        with pytest.raises(IndexError):
            r["a"][0, 0, 0]
        with pytest.raises(IndexError, match="fancy"):
            r["a"][[0, 1]]


def test_partial_read_reads_only_the_needed_bytes(matrix_ckpt):
    path, a = matrix_ckpt
    row_bytes = 1024 * 4
    # Bytes come from read() (bytes_read) or, when the file is in the page cache, straight from a mapping of it
    # (bytes_mapped: only the bytes delivered are touched).
    with distckpt.open(path, verify=False) as r:
        assert r.io_stats.bytes_read == 0 and r.io_stats.bytes_mapped == 0  # opening reads only the metadata
        rows = r["a"][100:110]
        np.testing.assert_array_equal(rows, a[100:110])
        s = r.io_stats
        assert s.bytes_read + s.bytes_mapped == 10 * row_bytes and s.bytes_delivered == 10 * row_bytes
    with distckpt.open(path) as r:  # verifying rounds out to whole 4 KiB checksum blocks, and no further
        np.testing.assert_array_equal(r["a"][100:110, 7:9], a[100:110, 7:9])
        s = r.io_stats
        assert s.bytes_delivered == 10 * 2 * 4
        assert s.bytes_verified == 10 * row_bytes
        assert s.bytes_read in (0, 10 * row_bytes) and s.bytes_mapped in (0, 10 * 2 * 4)
        assert s.bytes_read + s.bytes_mapped > 0


def test_full_read_and_out_buffer(matrix_ckpt):
    path, a = matrix_ckpt
    with distckpt.open(path) as r:
        out = np.empty((2, 1024), np.float32)
        assert r["a"].read((5, 0), (2, 1024), out=out) is out
        np.testing.assert_array_equal(out, a[5:7])
        with pytest.raises(distckpt.InvalidArgumentError, match="out must be"):
            r["a"].read((5, 0), (2, 1024), out=np.empty((2, 1024), np.float64))
        np.testing.assert_array_equal(r["a"][...], a)
        assert r.io_stats.bytes_read + r.io_stats.bytes_mapped >= a.nbytes


def test_readinto_fills_any_buffer_with_the_stored_bytes(matrix_ckpt):
    path, a = matrix_ckpt
    with distckpt.open(path) as r:
        raw = bytearray(a[2:4, 8:12].nbytes)
        assert r.readinto("a", raw, (2, 8), (2, 4)) == len(raw)
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(2, 4), a[2:4, 8:12])
        whole = np.empty(a.shape, np.uint32)  # any dtype: the bytes are copied as stored
        r.readinto("a", whole)
        np.testing.assert_array_equal(whole.view(np.float32), a)
        with pytest.raises(distckpt.InvalidArgumentError, match=r"checkpoint '.*': readinto\('a'.*needs .* 32 bytes"):
            r.readinto("a", bytearray(31), (0, 0), (2, 4))
        with pytest.raises(distckpt.InvalidArgumentError, match="writable"):
            r.readinto("a", bytes(32), (0, 0), (2, 4))
        with pytest.raises(distckpt.InvalidArgumentError, match="'step' is a bytes entry"):
            r.readinto("step", bytearray(8))
        with pytest.raises(distckpt.NotFoundError, match="no entry 'nope'"):
            r.readinto("nope", bytearray(8))


def test_structure_is_the_saved_nesting(tmp_path):
    distckpt.save({"model": {"w": np.ones(3), "layers": [np.zeros(2)]}, "step": 7}, tmp_path / "c")
    with distckpt.open(tmp_path / "c") as r:
        root = r.structure
        assert root == {
            "dict": [
                ["model", {"dict": [["w", {"array": "model.w"}], ["layers", {"list": [{"array": "model.layers.0"}]}]]}],
                ["step", {"object": "step", "encoding": "json"}],
            ]
        }
        root["dict"].clear()  # a copy: the reader is unchanged
        assert r.structure["dict"] and r.to_dict()["step"] == 7


def test_concurrent_reads_from_threads(matrix_ckpt):
    path, a = matrix_ckpt
    errors = []
    with distckpt.open(path) as r:

        def work(k):
            try:
                for i in range(20):
                    lo = (k * 97 + i * 13) % 1000
                    np.testing.assert_array_equal(r["a"][lo : lo + 24], a[lo : lo + 24])
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors


def test_closed_reader(matrix_ckpt):
    path, _ = matrix_ckpt
    r = distckpt.open(path)
    view = r["a"]
    r.close()
    r.close()
    assert r.closed
    with pytest.raises(distckpt.errors.StateError, match="closed"):
        view[0]
    with pytest.raises(distckpt.errors.StateError):
        r.io_stats  # noqa: B018 - reading the property is what raises


def test_verify_and_verify_progress(matrix_ckpt):
    path, a = matrix_ckpt
    seen = []
    with distckpt.open(path) as r:
        r.verify(progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1]


def test_map_files_off_reads_everything_with_read_calls(matrix_ckpt):
    path, a = matrix_ckpt
    with distckpt.open(path, map_files=False) as r:
        np.testing.assert_array_equal(r["a"][...], a)
        s = r.io_stats
        assert s.bytes_mapped == 0 and s.bytes_read >= a.nbytes and s.read_calls > 0
    # load() takes the same switch (and share_verification, which only matters with several ranks on one host).
    out = {"a": np.zeros_like(a)}
    distckpt.load(out, path, map_files=False, share_verification=False)
    np.testing.assert_array_equal(out["a"], a)


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("map_files", [True, False])
def test_an_open_reader_keeps_reading_the_checkpoint_it_opened(tmp_path, verify, map_files):
    # Issue 10: after an overwrite an open reader used to read the new files against the old metadata (false
    # corruption with verification on, the new checkpoint's data with it off). It pins its files when it opens.
    old, new = np.arange(4096, dtype=np.float32), np.arange(4096, dtype=np.float32) + 1e5
    path = tmp_path / "ckpt"
    distckpt.save({"w": old}, path)
    with distckpt.open(path, verify=verify, map_files=map_files) as r:
        distckpt.save({"w": new}, path, overwrite=True)
        np.testing.assert_array_equal(r.read("w"), old)
        np.testing.assert_array_equal(np.asarray(r["w"][100:200]), old[100:200])
        with distckpt.open(path) as fresh:
            np.testing.assert_array_equal(fresh.read("w"), new)
        import shutil

        shutil.rmtree(path)
        np.testing.assert_array_equal(r.read("w"), old)


def test_a_data_file_that_is_a_link_is_refused(tmp_path):
    import os

    path = tmp_path / "step-1"
    distckpt.save({"w": np.arange(10.0)}, path)
    os.symlink("step-1", tmp_path / "latest")  # a link to the checkpoint itself is fine
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "latest")["w"], np.arange(10.0))
    data = path / "data-00000.bin"
    os.rename(data, tmp_path / "outside.bin")
    os.symlink(tmp_path / "outside.bin", data)  # a valid copy: following it would "work"
    with pytest.raises(distckpt.CorruptCheckpointError, match="data-00000.bin' is a symbolic link"):
        distckpt.load(None, path)
    with distckpt.open(path) as r, pytest.raises(distckpt.CorruptCheckpointError, match="symbolic link"):
        r.read("w")


def test_load_takes_everything_from_one_checkpoint(tmp_path, monkeypatch):
    # load() reads the structure and object entries through a reader, then the tensors. It used to load the tensors
    # by path, reading the metadata a second time: a checkpoint overwritten in between gave the old structure and
    # objects with the new tensors. Now the tensors come through the same reader.
    from distckpt import _checkpoint

    path = tmp_path / "ckpt"
    distckpt.save({"w": np.full(1000, 1.0), "note": "v1"}, path)
    opened = _checkpoint._Opened
    written = [1]

    class OverwrittenRightAfterOpening(opened):  # type: ignore[misc, valid-type]
        def __init__(self, reader, p):
            super().__init__(reader, p)
            written.append(written[-1] + 1)
            v = written[-1]
            distckpt.save({"w": np.full(1000, float(v)), "note": f"v{v}"}, path, overwrite=True)

    monkeypatch.setattr(_checkpoint, "_Opened", OverwrittenRightAfterOpening)
    everything = distckpt.load(None, path)  # opens v1; v2 replaces it right away
    assert everything["note"] == "v1" and (everything["w"] == 1.0).all()
    into = distckpt.load({"w": np.zeros(1000), "note": None}, path)  # opens v2; v3 replaces it
    assert into["note"] == "v2" and (into["w"] == 2.0).all()
