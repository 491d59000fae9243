"""Worker processes for the multi-process tests (spawned, so they live in an importable module)."""

from __future__ import annotations

import traceback

import numpy as np

GLOBAL_W = (12, 10)
GLOBAL_EMB = (9, 16)


def expected():
    """The global arrays every test rank derives its pieces from."""
    rng = np.random.default_rng(1234)
    return {
        "w": rng.standard_normal(GLOBAL_W).astype(np.float32),
        "emb": rng.integers(-1000, 1000, GLOBAL_EMB).astype(np.int64),
        "bias": np.linspace(0, 1, 7).astype(np.float64),
        "f16": rng.standard_normal((5, 6)).astype(np.float16),
    }


def split(n, parts, k):
    """[lo, hi) of part k of n split into `parts` nearly equal pieces."""
    base, extra = divmod(n, parts)
    lo = k * base + min(k, extra)
    return lo, lo + base + (1 if k < extra else 0)


def run(fn, rank, args, results):
    try:
        fn(rank, *args)
        results.put((rank, None, None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((rank, traceback.format_exc(), None))


def run_then_exit(fn, rank, args, results):
    """As ``run``, then ends the process at once (os._exit) with the outcome's status once the result is sent: for
    torch.distributed workers, whose Gloo teardown at interpreter exit now and then aborts ("terminate called without
    an active exception") after the work is done and reported; the test is about the work, not torch's teardown."""
    import os

    ok = True
    try:
        fn(rank, *args)
        results.put((rank, None, None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        ok = False
        results.put((rank, traceback.format_exc(), None))
    results.close()
    results.join_thread()  # the result is in the pipe before the process ends
    os._exit(0 if ok else 1)


def spawn(target, world, args_of, deadline, killed=()):
    """Runs ``target(*args_of(rank, results))`` in ``world`` spawned processes; each puts ``(rank, error text or None,
    payload)`` on ``results`` (as ``run`` does). Returns the payloads by rank; fails with every rank's error, or when a
    rank sends nothing within ``deadline`` seconds. The ranks in ``killed`` must instead end by SIGKILL (a fault the
    test set up), sending nothing. Every wait is bounded, so a failure cannot hang pytest."""
    import multiprocessing as mp
    import queue
    import signal

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=args_of(rank, results)) for rank in range(world)]
    for p in procs:
        p.start()
    failures, payloads = [], {}
    waiting = set(range(world)) - set(killed)
    ended_by_us = []
    try:
        while waiting:
            try:
                rank, error, payload = results.get(timeout=deadline)
            except queue.Empty:
                failures.append(f"no result within {deadline} s from rank(s) {sorted(waiting)}")
                break
            if rank in killed:
                failures.append(f"rank {rank} was to be killed (SIGKILL) but reported: {error or payload}")
                continue
            waiting.discard(rank)
            if error:
                failures.append(f"rank {rank}:\n{error}")
            payloads[rank] = payload
    finally:
        for rank, p in enumerate(procs):
            p.join(timeout=30)
            if p.is_alive():
                ended_by_us.append(rank)
                p.kill()
                p.join()
    for rank in killed:
        if rank in ended_by_us or procs[rank].exitcode != -signal.SIGKILL:
            failures.append(
                f"rank {rank} did not die by SIGKILL as the test's fault asks (exit code "
                f"{procs[rank].exitcode}{', ended by the test' if rank in ended_by_us else ''})"
            )
    assert not failures, "\n".join(failures)
    assert all(p.exitcode == 0 for r, p in enumerate(procs) if r not in killed), [p.exitcode for p in procs]
    return payloads


def save_rank(rank, world, rendezvous, path, async_path, compression=None):
    import distckpt

    ex = expected()
    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=60) as comm:
        r0, r1 = split(GLOBAL_W[0], world, rank)  # w: row shards
        c0, c1 = split(GLOBAL_EMB[1], world, rank)  # emb: column shards
        h0, h1 = split(5, world, rank)  # f16: row shards, several per rank when it can (two half pieces)
        mid = (h0 + h1) // 2
        state = {
            "model": {
                "w": distckpt.Shard(ex["w"][r0:r1], GLOBAL_W, (r0, 0)),
                "emb": distckpt.Shard(ex["emb"][:, c0:c1], GLOBAL_EMB, (0, c0)),
                "bias": ex["bias"],  # replicated on every rank: written once
                "f16": [
                    distckpt.Shard(ex["f16"][h0:mid], (5, 6), (h0, 0)),
                    distckpt.Shard(ex["f16"][mid:h1], (5, 6), (mid, 0)),
                ],
            },
            "step": 1000,
            "world": world,
        }
        summary = distckpt.save(state, path, comm=comm, timeout=60, compression=compression)
        # Replicas (bias, step, world) are written once: the data is exactly the arrays plus two JSON values.
        assert summary.total_bytes == sum(a.nbytes for a in ex.values()) + len(b"1000") + len(str(world))
        # The same state through async_save, mutated as soon as the call returns.
        handle = distckpt.async_save(state, async_path, comm=comm, timeout=60, compression=compression)
        state["model"]["w"].data[...] = -1
        state["model"]["bias"][...] = -1
        handle.result(timeout=120)
        comm.barrier(timeout=60)


def load_rank(rank, world, rendezvous, path, fanout="auto"):
    import distckpt

    ex = expected()
    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=60) as comm:
        c0, c1 = split(GLOBAL_W[1], world, rank)  # w: now column shards
        r0, r1 = split(GLOBAL_EMB[0], world, rank)  # emb: now row shards
        w = np.zeros((GLOBAL_W[0], c1 - c0), np.float32)
        emb = np.zeros((r1 - r0, GLOBAL_EMB[1]), np.int64)
        f16 = np.zeros((5, 6), np.float32)  # whole, and converted from F16
        state = {
            "model": {
                "w": distckpt.Shard(w, GLOBAL_W, (0, c0)),
                "emb": distckpt.Shard(emb, GLOBAL_EMB, (r0, 0)),
                "bias": np.zeros(7),
                "f16": f16,
            },
            "step": None,
        }
        distckpt.load(state, path, comm=comm, timeout=60, fanout=fanout)
        np.testing.assert_array_equal(w, ex["w"][:, c0:c1])
        np.testing.assert_array_equal(emb, ex["emb"][r0:r1])
        np.testing.assert_array_equal(state["model"]["bias"], ex["bias"])
        np.testing.assert_array_equal(f16, ex["f16"].astype(np.float32))
        assert state["step"] == 1000
        # Every rank can also read the whole checkpoint, and open it collectively.
        everything = distckpt.load(None, path, comm=comm, timeout=60)
        np.testing.assert_array_equal(everything["model"]["w"], ex["w"])
        assert everything["world"] == 3
        with distckpt.open(path, comm=comm, timeout=60) as reader:
            np.testing.assert_array_equal(reader["model.emb"][r0:r1, 3], ex["emb"][r0:r1, 3])


def absent_rank_save(rank, world, rendezvous, path):
    """Every rank but the last connects and saves; the last exits without saving: the others must fail in time."""
    import distckpt

    comm = distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=30)
    if rank == world - 1:
        return
    try:
        distckpt.save({"a": np.ones(4)}, path, comm=comm, timeout=3)
    except distckpt.Error as e:
        if not isinstance(e, (distckpt.TimeoutError, distckpt.PeerError)):
            raise
        assert str(world - 1) in str(e), str(e)
        return
    raise AssertionError("save succeeded although a rank never called it")


def local_error_save(rank, world, rendezvous, path):
    """The last rank's state cannot be saved (an object that needs pickle): it raises before any collective, and its
    abort makes the other ranks fail at once (well inside their 60 s timeout), naming it."""
    import time

    import distckpt

    comm = distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=30)
    state = {"a": np.ones(4), "extra": object() if rank == world - 1 else 1}
    start = time.monotonic()
    try:
        distckpt.save(state, path, comm=comm, timeout=60)
    except distckpt.Error as e:
        elapsed = time.monotonic() - start
        if rank == world - 1:
            assert isinstance(e, distckpt.PickleNotAllowedError) or "pickle" in str(e), repr(e)
            return
        assert isinstance(e, distckpt.PeerError), repr(e)
        assert f"rank {world - 1}" in str(e), str(e)
        assert elapsed < 10, f"took {elapsed:.1f} s to notice the aborted rank"
        return
    raise AssertionError("save succeeded although a rank could not build its state")


def torch_rank(rank, world, init_file, path):
    """DTensors over a real torch.distributed gloo process group, with distckpt.comm.from_torch."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, distribute_tensor, init_device_mesh
    from torch.distributed.tensor import Shard as TShard

    import distckpt
    import distckpt.torch

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    try:
        comm = distckpt.comm.from_torch()
        assert (comm.rank, comm.size, comm.kind) == (rank, world, "torch")
        mesh = init_device_mesh("cpu", (world,))
        full = torch.arange(70, dtype=torch.float32).reshape(10, 7)
        state = {
            "rows": distribute_tensor(full, mesh, [TShard(0)]),
            "cols_bf16": distribute_tensor(full.to(torch.bfloat16), mesh, [TShard(1)]),  # 7 columns: uneven
            "replicated": distribute_tensor(torch.ones(4), mesh, [Replicate()]),
            "step": 7,
        }
        (shard,) = distckpt.torch.to_shards(state["rows"])
        assert shard.global_shape == (10, 7) and shard.offsets == (5 * rank, 0)
        distckpt.save(state, path, comm=comm, timeout=60)

        # Load with other placements, filling the DTensors' local shards in place.
        rows_as_cols = distribute_tensor(torch.zeros(10, 7), mesh, [TShard(1)])
        cols_as_rows = distribute_tensor(torch.zeros(10, 7, dtype=torch.bfloat16), mesh, [TShard(0)])
        target = {"rows": rows_as_cols, "cols_bf16": cols_as_rows, "step": None}
        distckpt.load(target, path, comm=comm, timeout=60)
        assert target["rows"] is rows_as_cols and target["step"] == 7
        assert torch.equal(rows_as_cols.full_tensor(), full)
        assert torch.equal(cols_as_rows.full_tensor(), full.to(torch.bfloat16))

        created = distckpt.torch.load_dtensor(path, "rows", mesh, [TShard(1)])
        assert created.placements == (TShard(1),) and torch.equal(created.full_tensor(), full)
        comm.barrier(timeout=60)
        comm.close()
    finally:
        dist.destroy_process_group()


def torch_async_rank(rank, world, init_file, path):
    """async_save over from_torch() of the default group while training runs collectives on that group at once: the
    save's background collectives go over a group of its own, made once and reused by the next save."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import distckpt

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))  # fmt: skip
    try:
        for step in (1, 2):
            state = {"w": distckpt.Shard(torch.full((4, 8), float(rank + 10 * step)), (4 * world, 8), (4 * rank, 0)),
                     "step": step}  # fmt: skip
            handle = distckpt.async_save(state, f"{path}-{step}", comm=distckpt.comm.from_torch(), timeout=60)
            for i in range(50):  # training's collectives on the default group, while the save runs its own
                t = torch.full((1024,), float(rank + i))
                dist.all_reduce(t)
                assert float(t[0]) == sum(r + i for r in range(world)), (step, i, float(t[0]))
            handle.result(timeout=60)
        assert len(distckpt.comm._background_groups) == 1, "one background group, reused"
        dist.barrier()
    finally:
        dist.destroy_process_group()


def stuck_s3_save_rank(rank, world, rendezvous, url):
    """Saves 8 MiB per rank to an s3:// URL through the core, whose endpoint (AWS_ENDPOINT_URL) is a test proxy that
    holds the uploads of every data file but data-00000 (the parent kills this process while they hang): the marker
    and one data file get written, the metadata never."""
    import distckpt

    rows = 2048  # 8 MiB of float32 per rank
    local = np.full((rows, 1024), rank, np.float32)
    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=60) as comm:
        distckpt.save({"w": distckpt.Shard(local, (rows * world, 1024), (rows * rank, 0))}, url, comm=comm,
                      timeout=600)  # fmt: skip
    raise AssertionError("the save finished although its uploads never do")


def last_collective_rank(rank, world, root, mode):
    """A torch program whose last collective is distckpt's: a save (or a load) over from_torch, then the interpreter
    exits with the gloo group still up (the process group is torch's to tear down at exit)."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    import distckpt  # noqa: PLC0415

    dist.init_process_group("gloo", init_method=f"file://{root}/rdzv-{mode}", rank=rank, world_size=world)
    state = {"w": torch.arange(1000, dtype=torch.float32) + rank, "b": torch.ones(10)}
    if mode == "save":
        distckpt.save(state, f"{root}/ckpt", comm=distckpt.comm.from_torch())
    else:
        for t in state.values():
            t.zero_()
        distckpt.load(state, f"{root}/ckpt", comm=distckpt.comm.from_torch())
        # Both ranks saved a whole "w": a replicated tensor, written once (rank 0's).
        assert torch.equal(state["w"], torch.arange(1000, dtype=torch.float32)), "w read back wrong"
        assert torch.equal(state["b"], torch.ones(10)), "b read back wrong"
    print(f"rank {rank}: {mode} done", flush=True)


def incremental_save_rank(rank, world, rendezvous, full, incremental):
    """Saves the sharded state whole, then again with only "w" changed, as an incremental save of the first."""
    import distckpt

    ex = expected()
    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=60) as comm:
        r0, r1 = split(GLOBAL_W[0], world, rank)
        c0, c1 = split(GLOBAL_EMB[1], world, rank)
        w = ex["w"][r0:r1].copy()
        state = {
            "w": distckpt.Shard(w, GLOBAL_W, (r0, 0)),
            "emb": distckpt.Shard(ex["emb"][:, c0:c1], GLOBAL_EMB, (0, c0)),
            "bias": ex["bias"],
        }
        distckpt.save(state, full, comm=comm, timeout=60)
        w += 1
        summary = distckpt.save(state, incremental, comm=comm, timeout=60, base=full)
        assert summary.bytes_reused == ex["emb"].nbytes + ex["bias"].nbytes, summary
        comm.barrier(timeout=60)


def incremental_load_rank(rank, world, rendezvous, incremental):
    """Loads the incremental checkpoint of incremental_save_rank resharded (w by columns, emb by rows)."""
    import distckpt

    ex = expected()
    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=60) as comm:
        c0, c1 = split(GLOBAL_W[1], world, rank)
        r0, r1 = split(GLOBAL_EMB[0], world, rank)
        w = np.zeros((GLOBAL_W[0], c1 - c0), np.float32)
        emb = np.zeros((r1 - r0, GLOBAL_EMB[1]), np.int64)
        state = {
            "w": distckpt.Shard(w, GLOBAL_W, (0, c0)),
            "emb": distckpt.Shard(emb, GLOBAL_EMB, (r0, 0)),
            "bias": None,
        }
        distckpt.load(state, incremental, comm=comm, timeout=60, fanout="always")  # each byte read once, shared
        np.testing.assert_array_equal(w, ex["w"][:, c0:c1] + 1)
        np.testing.assert_array_equal(emb, ex["emb"][r0:r1])
        np.testing.assert_array_equal(state["bias"], ex["bias"])
