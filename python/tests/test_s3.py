"""S3 through a real HTTP endpoint: a moto server the tests start on loopback, reached with s3fs (URLs routed through
fsspec, with the endpoint in fsspec's configuration) by several Gloo ranks. Checks a multi-rank save and async save,
a resharded load on another number of ranks, verify, overwrite, and a save killed midway (no checkpoint appears;
the leftovers are found and removed)."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import _s3_server
import _workers
import distckpt
from test_multiprocess import run_ranks


@pytest.fixture(scope="module")
def server():
    srv = _s3_server.MotoServer()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def s3(server, monkeypatch):
    """A fresh bucket; the endpoint and credentials in the environment (inherited by spawned ranks) and in this
    process's fsspec configuration. Yields (s3fs filesystem, bucket name)."""
    import fsspec.config

    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"client_kwargs": {"endpoint_url": server.endpoint}})
    fs = server.s3fs()
    bucket = f"b{time.monotonic_ns()}"
    fs.mkdir(bucket)
    return fs, bucket


def objects(fs, prefix):
    fs.invalidate_cache()
    try:
        return sorted(fs.find(prefix))
    except FileNotFoundError:
        return []


def test_three_ranks_save_to_s3_two_ranks_load_resharded(s3, tmp_path):
    fs, bucket = s3
    url, async_url = f"s3://{bucket}/ckpt", f"s3://{bucket}/ckpt_async"
    # save_rank saves, then async-saves and scribbles over its arrays at once; load_rank loads on 2 ranks with
    # other shardings and checks every value (also through load(None) and a collective open).
    run_ranks(_workers.save_rank, 3, f"file://{tmp_path}/rdv_save", url, async_url)
    run_ranks(_workers.load_rank, 2, f"file://{tmp_path}/rdv_load", url)
    run_ranks(_workers.load_rank, 2, f"file://{tmp_path}/rdv_load_async", async_url, "always")
    ex = _workers.expected()
    for u in (url, async_url):
        out = distckpt.load(None, u)
        np.testing.assert_array_equal(out["model"]["w"], ex["w"])
        np.testing.assert_array_equal(out["model"]["emb"], ex["emb"])
        with distckpt.open(u) as r:
            r.verify()
            assert len(r.metadata["model.w"].chunks) == 3
        info = distckpt.storage_stat(u)
        assert info.kind == "checkpoint" and info.leftover_files == 0, info
    names = [p.rsplit("/", 1)[-1] for p in objects(fs, f"{bucket}/ckpt/")]
    assert "metadata.dckpt" in names and not any(n.startswith("STAGING") for n in names), names


def test_verify_finds_a_corrupted_object(s3):
    fs, bucket = s3
    url = f"s3://{bucket}/c"
    distckpt.save({"w": np.arange(100000, dtype=np.float64)}, url)
    (data,) = [p for p in objects(fs, f"{bucket}/c/") if "/data-" in p]
    raw = bytearray(fs.cat_file(data))
    raw[1000] ^= 0xFF
    fs.pipe_file(data, bytes(raw))
    with distckpt.open(url) as r:
        with pytest.raises(distckpt.CorruptCheckpointError):
            r.verify()
    with pytest.raises(distckpt.CorruptCheckpointError):
        distckpt.load(None, url)


def test_overwrite_on_s3_replaces_and_drops_the_old_files(s3):
    fs, bucket = s3
    url = f"s3://{bucket}/ow"
    distckpt.save({"w": np.zeros(5000), "step": 1}, url)
    old = objects(fs, f"{bucket}/ow/")
    with pytest.raises(distckpt.AlreadyExistsError):
        distckpt.save({"w": np.ones(5000)}, url)
    distckpt.save({"w": np.ones(5000), "step": 2}, url, overwrite=True)
    out = distckpt.load(None, url)
    np.testing.assert_array_equal(out["w"], np.ones(5000))
    assert out["step"] == 2
    new = objects(fs, f"{bucket}/ow/")
    old_data = [p for p in old if "/data-" in p]
    assert old_data and not set(old_data) & set(new), (old, new)
    assert distckpt.storage_stat(url).leftover_files == 0


def test_async_save_to_s3_with_an_explicit_storage(s3, server):
    fs, bucket = s3
    storage = distckpt.FsspecStorage(server.s3fs(), max_in_flight=8)
    state = {"w": np.arange(1 << 20, dtype=np.float32), "step": 3}
    handle = distckpt.async_save(state, f"s3://{bucket}/async", storage=storage)
    del storage  # the save keeps its storage alive
    state["w"][...] = 0
    summary = handle.result(timeout=120)
    assert summary.total_bytes >= 4 << 20
    out = distckpt.load(None, f"s3://{bucket}/async")
    np.testing.assert_array_equal(out["w"], np.arange(1 << 20, dtype=np.float32))


def test_a_save_killed_midway_leaves_no_checkpoint_and_prune_removes_it(s3, server, tmp_path):
    fs, bucket = s3
    url = f"s3://{bucket}/killed"
    world = 3
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_workers.run,
            args=(_workers.slow_s3_save_rank, rank, (world, f"file://{tmp_path}/rdv", url, server.endpoint), results),
        )  # fmt: skip
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 120
        while True:  # until the marker and a data file are in the bucket: the ranks are writing
            names = [p.rsplit("/", 1)[-1] for p in objects(fs, f"{bucket}/killed/")]
            if any(n.startswith("STAGING.") for n in names) and any(n.startswith("data-00000.") for n in names):
                break
            failed = [p.exitcode for p in procs if p.exitcode is not None]
            assert not failed, f"a rank exited early: {failed}; {results.get(timeout=5) if not results.empty() else ''}"
            assert time.monotonic() < deadline, f"the save never got going: {names}"
            time.sleep(0.2)
        # While its writers live and its marker is younger than the grace period, the save is in progress: nothing
        # to prune. (grace_seconds=0 would take its files now: the grace period bounds how long a save may run.)
        running = distckpt.storage_stat(url)
        assert running.kind == "incomplete" and running.saves_in_progress == 1, running
        assert distckpt.remove_leftovers(url) == []
    finally:
        for p in procs:
            p.kill()  # SIGKILL: no cleanup runs
        for p in procs:
            p.join()
    assert all(p.exitcode == -9 for p in procs), [p.exitcode for p in procs]
    left = objects(fs, f"{bucket}/killed/")
    assert left and not any(p.endswith("/metadata.dckpt") for p in left), left

    with pytest.raises(distckpt.NotFoundError):
        distckpt.open(url)
    with pytest.raises(distckpt.NotFoundError):
        distckpt.load(None, url)
    # The marker names its writer (host and pid): on this host a dead writer makes the save abandoned at once,
    # whatever the grace period.
    info = distckpt.storage_stat(url)
    assert info.kind == "incomplete" and info.saves_in_progress == 0, info
    assert info.leftover_files == len(left), (info, left)
    would = distckpt.remove_leftovers(url, dry_run=True)
    assert len(would) == len(left) and all(w.rsplit("/", 1)[-1] in {p.rsplit("/", 1)[-1] for p in left} for w in would)
    assert objects(fs, f"{bucket}/killed/") == left
    removed = distckpt.remove_leftovers(url)
    assert len(removed) == len(left), (removed, left)
    assert objects(fs, f"{bucket}/killed/") == []
    assert distckpt.storage_stat(url).kind == "none"
    # The path is free again.
    distckpt.save({"w": np.ones(3)}, url)
    np.testing.assert_array_equal(distckpt.load(None, url)["w"], np.ones(3))


def _multipart_uploads(fs, bucket):
    return fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])


def test_large_files_stream_as_multipart_uploads(s3, server):
    # Files of more than one part go up as S3 multipart uploads whose parts distckpt assembles and sends while the
    # file is being written; a failed save aborts its upload (nothing left, not even parts).
    fs, bucket = s3
    part = 5 << 20
    storage = distckpt.FsspecStorage(server.s3fs(), upload_part_size=part, max_in_flight=4)
    state = {"w": np.arange(6 << 20, dtype=np.float32), "b": np.ones(100)}  # 24 MiB: 5 parts
    url = f"s3://{bucket}/mp"
    distckpt.save(state, url, storage=storage)
    (data,) = [p for p in objects(fs, f"{bucket}/mp/") if "/data-" in p]
    etag = fs.info(data)["ETag"].strip('"')
    assert etag.endswith("-5"), etag  # S3's ETag of a 5-part multipart upload
    with distckpt.open(url, storage=storage) as r:
        r.verify()
    np.testing.assert_array_equal(distckpt.load(None, url, storage=storage)["w"], state["w"])
    assert _multipart_uploads(fs, bucket) == []
    (meta,) = [p for p in objects(fs, f"{bucket}/mp/") if p.endswith("metadata.dckpt")]
    assert "-" not in fs.info(meta)["ETag"]  # a small file: one PUT

    from distckpt._fsspec_storage import _FsspecFiles

    class FailingFiles(_FsspecFiles):  # the third part fails: distckpt aborts the upload and discards the save
        def upload_part(self, up, number, data):
            if number == 3:
                raise OSError("network unreachable")
            sent.append((number, len(data)))
            super().upload_part(up, number, data)

        def upload_abort(self, up):
            aborted.append(up.upload_id)
            super().upload_abort(up)

    sent, aborted = [], []
    failing = distckpt.CallbackStorage(FailingFiles(server.s3fs(), None, 0, part), max_in_flight=1)
    with pytest.raises(distckpt.Error, match="network unreachable"):
        distckpt.save(state, f"s3://{bucket}/failed", storage=failing, io_threads=1)
    assert sent == [(1, part), (2, part)], sent  # parts had gone up, in order, before the failure
    assert len(aborted) == 1, aborted
    assert not [p for p in objects(fs, f"{bucket}/failed/") if "/data-" in p]
    assert _multipart_uploads(fs, bucket) == []
