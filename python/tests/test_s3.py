"""S3 through a real HTTP endpoint: a moto server on loopback (conftest's ``moto_server``). ``s3://`` URLs go to the
core's S3 backend, configured from the AWS_* environment (AWS_ENDPOINT_URL: the server), the same backend C, Rust
and Go use. Checks a multi-rank save and async save, a resharded load on another number of ranks, verify,
overwrite, an explicit ``S3Storage``, streamed multipart uploads, listing, export, a save killed midway (no
checkpoint appears; the leftovers are found and pruned), and the memory a save of a large data file takes. The
store is inspected with boto3, never through distckpt. One test keeps the fsspec route (``FsspecStorage`` over
s3fs), still there as an option. Faults: test_s3_faults.py."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

import _s3_faults
import _workers
import distckpt
from conftest import run_python
from test_multiprocess import run_ranks


def test_three_ranks_save_to_s3_two_ranks_load_resharded(s3_env, moto_server, tmp_path):
    bucket = s3_env
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
    names = [k.rsplit("/", 1)[-1] for k in moto_server.keys(bucket, "ckpt/")]
    assert "metadata.dckpt" in names and not any(n.startswith("STAGING") for n in names), names
    assert distckpt.listdir(f"s3://{bucket}") == ["ckpt", "ckpt_async"]
    assert "metadata.dckpt" in distckpt.listdir(url)
    assert distckpt.listdir(f"s3://{bucket}/nothing-here") == []


def test_verify_finds_a_corrupted_object(s3_env, moto_server):
    bucket = s3_env
    url = f"s3://{bucket}/c"
    distckpt.save({"w": np.arange(100000, dtype=np.float64)}, url)
    (data,) = [k for k in moto_server.keys(bucket, "c/") if "/data-" in k]
    s3 = moto_server.client()
    raw = bytearray(s3.get_object(Bucket=bucket, Key=data)["Body"].read())
    raw[1000] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=data, Body=bytes(raw))
    with distckpt.open(url) as r:
        with pytest.raises(distckpt.CorruptCheckpointError, match="data-"):
            r.verify()
    with pytest.raises(distckpt.CorruptCheckpointError):
        distckpt.load(None, url)


def test_overwrite_on_s3_replaces_and_drops_the_old_files(s3_env, moto_server):
    bucket = s3_env
    url = f"s3://{bucket}/ow"
    distckpt.save({"w": np.zeros(5000), "step": 1}, url)
    old = moto_server.keys(bucket, "ow/")
    with pytest.raises(distckpt.AlreadyExistsError, match=url):
        distckpt.save({"w": np.ones(5000)}, url)
    distckpt.save({"w": np.ones(5000), "step": 2}, url, overwrite=True)
    out = distckpt.load(None, url)
    np.testing.assert_array_equal(out["w"], np.ones(5000))
    assert out["step"] == 2
    new = moto_server.keys(bucket, "ow/")
    old_data = [k for k in old if "/data-" in k]
    assert old_data and not set(old_data) & set(new), (old, new)
    assert distckpt.storage_stat(url).leftover_files == 0


def test_async_save_to_s3_with_an_explicit_storage(moto_server):
    # No environment at all: the storage carries the endpoint and the keys.
    bucket = moto_server.new_bucket()
    storage = distckpt.S3Storage(moto_server.endpoint, access_key_id="testing", secret_access_key="testing",
                                 region="us-east-1", max_in_flight=8)  # fmt: skip
    assert moto_server.endpoint in repr(storage)
    state = {"w": np.arange(1 << 20, dtype=np.float32), "step": 3}
    url = f"s3://{bucket}/async"
    handle = distckpt.async_save(state, url, storage=storage)
    state["w"][...] = 0
    summary = handle.result(timeout=120)
    assert summary.total_bytes >= 4 << 20
    out = distckpt.load(None, url, storage=storage)
    np.testing.assert_array_equal(out["w"], np.arange(1 << 20, dtype=np.float32))
    assert out["step"] == 3
    with distckpt.open(url, storage=storage) as r:
        np.testing.assert_array_equal(r["w"][1000:1010], np.arange(1000, 1010, dtype=np.float32))
    assert distckpt.storage_for(url, endpoint=moto_server.endpoint).endpoint == moto_server.endpoint
    with pytest.raises(distckpt.InvalidArgumentError, match="addressing"):
        distckpt.S3Storage(addressing="sideways")


def test_large_files_stream_as_multipart_uploads(s3_env, moto_server):
    # A data file of more than one part goes up as an S3 multipart upload, part by part; small files are one PUT.
    bucket = s3_env
    part = 5 << 20
    storage = distckpt.S3Storage(part_size=part)
    state = {"w": np.arange(6 << 20, dtype=np.float32), "b": np.ones(100)}  # 24 MiB: 5 parts
    url = f"s3://{bucket}/mp"
    distckpt.save(state, url, storage=storage)
    s3 = moto_server.client()
    (data,) = [k for k in moto_server.keys(bucket, "mp/") if "/data-" in k]
    etag = s3.head_object(Bucket=bucket, Key=data)["ETag"].strip('"')
    assert etag.endswith("-5"), etag  # S3's ETag of a 5-part multipart upload
    assert "-" not in s3.head_object(Bucket=bucket, Key="mp/metadata.dckpt")["ETag"]  # a small file: one PUT
    with distckpt.open(url) as r:
        r.verify()
    np.testing.assert_array_equal(distckpt.load(None, url)["w"], state["w"])
    assert moto_server.open_uploads(bucket) == []


def test_a_save_killed_midway_leaves_no_checkpoint_and_prune_removes_it(s3_env, moto_server, tmp_path, monkeypatch):
    bucket = s3_env
    url = f"s3://{bucket}/killed"
    # The ranks reach the server through a proxy that holds every data file's upload but data-00000's: the marker
    # and one data file get written, the metadata never.
    proxy = _s3_faults.FaultProxy(moto_server.endpoint, [
        _s3_faults.stall(key_contains="killed/data-", key_excludes="killed/data-00000."),
    ])  # fmt: skip
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    world = 3
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_workers.run, args=(_workers.stuck_s3_save_rank, rank, (world, f"file://{tmp_path}/rdv",
                                                                                   url), results))
        for rank in range(world)
    ]  # fmt: skip
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 120
        while True:  # until the marker and a data file are in the bucket: the ranks are writing
            names = [k.rsplit("/", 1)[-1] for k in moto_server.keys(bucket, "killed/")]
            if any(n.startswith("STAGING.") for n in names) and any(n.startswith("data-00000.") for n in names):
                break
            failed = [p.exitcode for p in procs if p.exitcode is not None]
            assert not failed, f"a rank exited early: {failed}; {results.get(timeout=5) if not results.empty() else ''}"
            assert time.monotonic() < deadline, f"the save never got going: {names}"
            time.sleep(0.2)
        # While its writers live, the save is in progress: nothing to prune, whatever the grace period (which judges
        # only writers on other hosts, whose liveness nobody here can ask).
        running = distckpt.storage_stat(url)
        assert running.kind == "incomplete" and running.saves_in_progress == 1, running
        assert distckpt.remove_leftovers(url) == []
        assert distckpt.remove_leftovers(url, grace_seconds=0) == []
        assert distckpt.prune(f"s3://{bucket}") == []
    finally:
        for p in procs:
            p.kill()  # SIGKILL: no cleanup runs
        for p in procs:
            p.join()
        proxy.stop()
        monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)  # the server itself from here on
    assert all(p.exitcode == -9 for p in procs), [p.exitcode for p in procs]
    left = moto_server.keys(bucket, "killed/")
    assert left and not any(k.endswith("/metadata.dckpt") for k in left), left

    with pytest.raises(distckpt.NotFoundError, match=url):
        distckpt.open(url)
    with pytest.raises(distckpt.NotFoundError):
        distckpt.load(None, url)
    # The marker names its writer (host and pid): on this host a dead writer makes the save abandoned at once,
    # whatever the grace period.
    info = distckpt.storage_stat(url)
    assert info.kind == "incomplete" and info.saves_in_progress == 0, info
    assert info.leftover_files == len(left), (info, left)
    (found,) = distckpt.scan_leftovers(f"s3://{bucket}")
    assert found.name == "killed" and found.path == url and found.garbage and found.kind == "staging", found
    would = distckpt.remove_leftovers(url, dry_run=True)
    assert sorted(w.rsplit("/", 1)[-1] for w in would) == sorted(k.rsplit("/", 1)[-1] for k in left), (would, left)
    assert [x.name for x in distckpt.prune(f"s3://{bucket}", dry_run=True)] == ["killed"]
    assert moto_server.keys(bucket, "killed/") == left
    assert [x.name for x in distckpt.prune(f"s3://{bucket}")] == ["killed"]
    assert moto_server.keys(bucket, "killed/") == []
    assert distckpt.storage_stat(url).kind == "none"
    # The path is free again.
    distckpt.save({"w": np.ones(3)}, url)
    np.testing.assert_array_equal(distckpt.load(None, url)["w"], np.ones(3))


def test_export_safetensors_to_s3(s3_env, moto_server):
    bucket = s3_env
    url = f"s3://{bucket}/src"
    w = np.arange(3000, dtype=np.float32).reshape(30, 100)
    distckpt.save({"w": w, "b": np.ones(7, np.float16), "step": 5}, url)
    files = distckpt.export_safetensors(url, f"s3://{bucket}/hf", max_shard_size=8000)
    assert files == [f"s3://{bucket}/hf/model-00001-of-00002.safetensors",
                     f"s3://{bucket}/hf/model-00002-of-00002.safetensors",
                     f"s3://{bucket}/hf/model.safetensors.index.json"]  # fmt: skip
    assert moto_server.keys(bucket, "hf/") == sorted(f.split("/", 3)[3] for f in files)


def test_the_fsspec_route_stays_an_option(s3_env, moto_server):
    # FsspecStorage over s3fs, explicitly: the same checkpoint format, readable by the core's S3 backend and back.
    pytest.importorskip("s3fs")
    bucket = s3_env
    storage = distckpt.FsspecStorage(moto_server.s3fs(), upload_part_size=5 << 20, max_in_flight=4)
    state = {"w": np.arange(3 << 20, dtype=np.float32), "step": 7}  # 12 MiB: a streamed multipart upload
    url = f"s3://{bucket}/via-fsspec"
    distckpt.save(state, url, storage=storage)
    out = distckpt.load(None, url)  # the core
    np.testing.assert_array_equal(out["w"], state["w"])
    assert out["step"] == 7
    distckpt.save(state, f"s3://{bucket}/via-core")
    with distckpt.open(f"s3://{bucket}/via-core", storage=storage) as r:
        r.verify()
        np.testing.assert_array_equal(r["w"][:], state["w"])
    assert distckpt.storage_stat(url, storage=storage).kind == "checkpoint"
    assert moto_server.open_uploads(bucket) == []


def test_a_data_file_far_larger_than_the_memory_allowed_streams_to_s3(s3_env):
    # A process holding a 512 MiB array (touched) saves it as one data file; what the save adds to the peak resident
    # set must be a small fraction of the file: parts go up as they are written, the file is never held. Then the
    # array is read back in slabs, each compared with the source (no second full copy).
    out = run_python(
        f"""
        import resource, numpy as np, distckpt
        MiB = 1 << 20
        a = np.empty(512 * MiB // 8, np.float64)
        slab = 4 * MiB
        for i in range(0, a.size, slab):  # touched, without a temporary the size of the array
            a[i:i + slab] = np.arange(i, min(i + slab, a.size), dtype=np.float64)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        url = "s3://{s3_env}/big"
        summary = distckpt.save({{"big": a}}, url)
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        with distckpt.open(url) as r:
            assert len(r.metadata["big"].chunks) == 1
            for i in range(0, a.size, slab):
                assert np.array_equal(r["big"][i:i + slab], a[i:i + slab]), i
        print(summary.total_bytes // MiB, round(grew))
        """,
        emulate_cuda=False,
        timeout=600,
    )
    size_mib, grew_mib = map(int, out.split())
    print(f"save of a {size_mib} MiB data file to S3: peak RSS +{grew_mib} MiB")
    assert size_mib == 512, out
    assert grew_mib < 128, f"the save of a {size_mib} MiB file raised the peak RSS by {grew_mib} MiB"
