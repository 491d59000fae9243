#!/usr/bin/env python3
"""The checkpoint manager (distckpt.CheckpointManager) against a training loop without checkpoints, DCP's async_save,
memcpy and the restore paths it replaces, in one run.

1. Throughput. --ranks ranks (real processes, one simulated node each, replicas=1 over Gloo on loopback) run a loop
   whose step is either a fixed wait with the host idle (--step-mode sleep: time.sleep(--step-s), as while a GPU
   computes) or CPU work that keeps every core busy (--step-mode matmul: float32 matmuls for about --step-s, BLAS
   threads = cores / ranks, as a CPU-bound input pipeline or a CPU trainer) or half of each (--step-mode mixed: a
   host that prepares a batch, then waits for the GPU), for each state size per rank in --mib:
   without checkpoints, with ``mgr.save(step, state)`` every step (local tier in /dev/shm) once per background
   priority in --priorities (the manager's ``background_priority``: normal, low, idle; "low:4" with 4 writer threads)
   with ``threads=--threads`` unless given,
   and with DCP's ``async_save`` every step (to /dev/shm, each save waiting for the previous one as DCP asks; --skip-dcp
   leaves it out). Reports steps per second and the ratios, the saves that waited (``mgr.stats()``), and the largest
   size for which the manager (at the first priority listed) keeps >= 0.95x.
2. Stall. The time ``mgr.save`` blocks the loop, against a memcpy of the rank's state (numpy copyto into a buffer
   allocated once, best of 5), per size.
3. Recovery after losing a node. 4 ranks on 2 nodes (replicas=1) save one step of --recover-mib MiB per rank,
   persisted to a directory on disk; then node b's local directory is wiped and a new group of 4 ranks restores:
   from the peers (the manager), from the persisted step on disk (distckpt.load, its pages evicted first with
   posix_fadvise DONTNEED), and from S3 (a moto server on loopback; the same state saved there with distckpt.save).
   The limit: node b's bytes (its two ranks' states) copied over loopback TCP, two streams at once. Every restore's
   values are checked.

    .venv/bin/python bench/manager/manager_bench.py [--ranks 2] [--mib 16,64,256] [--steps 12] [--step-s 0.5]
        [--step-mode sleep|matmul] [--priorities low,normal,idle] [--threads 0] [--skip-dcp] [--skip-throughput]
        [--skip-recovery] [--recover-mib 128] [--skip-s3] [--out bench/results]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))  # the moto server helper

TENSORS = 8


def make_state(rank: int, world: int, mib: int, step: int):
    """TENSORS float32 tensors, row-sharded by rank: rank's rows are filled from (step, rank)."""
    rows_per_rank = max(1, mib * (1 << 20) // (TENSORS * 4 * 1024))
    state = {}
    import distckpt

    for t in range(TENSORS):
        local = np.empty((rows_per_rank, 1024), dtype=np.float32)
        local[:] = step * 1000 + rank * 10 + t
        state[f"layer{t}.w"] = distckpt.Shard(local, offsets=(rank * rows_per_rank, 0),
                                              global_shape=(world * rows_per_rank, 1024))
    return state


def check_state(state, rank: int, world: int, step: int, saved_world: int) -> None:
    for t in range(TENSORS):
        shard = state[f"layer{t}.w"]
        data = shard.data if hasattr(shard, "data") else shard
        rows = data.shape[0]
        first = shard.offsets[0] if hasattr(shard, "offsets") else 0
        # the saved value of a row is step*1000 + (saving rank)*10 + t
        saved_rows = rows * world // saved_world
        for r in (0, rows - 1):
            want = step * 1000 + ((first + r) // saved_rows) * 10 + t
            if data[r, 0] != want:
                raise AssertionError(f"rank {rank}: layer{t}.w row {first + r} = {data[r, 0]}, want {want}")


def group(rank: int, world: int, rdv: str, prefix: str):
    import distckpt

    return distckpt.comm.gloo(rank, world, rendezvous="file://" + rdv, prefix=prefix, timeout=300)


def run_ranks(world: int, target, *args):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(q, target, r, world) + args) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + 1800
    while len(results) < world:
        try:
            r, ok, value = q.get(timeout=max(1, deadline - time.monotonic()))
        except Exception:
            for p in procs:
                p.kill()
            raise SystemExit("manager_bench: ranks did not finish")
        if not ok:
            for p in procs:
                p.kill()
            raise SystemExit(f"manager_bench: rank {r} failed:\n{value}")
        results[r] = value
    for p in procs:
        p.join()
    return [results[r] for r in range(world)]


def _entry(q, target, rank, world, *args):
    try:
        q.put((rank, True, target(rank, world, *args)))
    except BaseException:
        q.put((rank, False, traceback.format_exc()))


# ------------------------------------------------------------------------------------------------- throughput
def matmul_step(seconds: float):
    """A step of CPU work of about ``seconds`` (calibrated once): float32 matmuls of 384 x 384."""
    a = np.random.default_rng(0).random((384, 384), dtype=np.float32)
    t = time.perf_counter()
    for _ in range(20):
        a @ a
    reps = max(1, round(seconds / ((time.perf_counter() - t) / 20)))

    def step():
        for _ in range(reps):
            a @ a

    return step


def throughput_worker(rank, world, rdv, shm, mib, steps, step_s, step_mode, priorities, threads, skip_dcp, rounds):
    import distckpt

    if not skip_dcp:
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        dist.init_process_group("gloo", init_method="file://" + os.path.join(rdv, "torch"), rank=rank,
                                world_size=world)
    comm = group(rank, world, rdv, "mgr")
    barrier_comm = group(rank, world, rdv, "barrier")
    state = make_state(rank, world, mib, 1)
    arrays = [state[k].data for k in sorted(state)]
    nbytes = sum(a.nbytes for a in arrays)
    out = {"bytes": nbytes}
    # memcpy of the rank's state into a buffer allocated once
    dst = [np.empty_like(a) for a in arrays]
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for d, a in zip(dst, arrays):
            np.copyto(d, a)
        best = min(best, time.perf_counter() - t)
    out["memcpy_s"] = best
    if step_mode == "matmul":
        work = matmul_step(step_s)
    elif step_mode == "mixed":  # half CPU work, half waiting (a host that feeds a GPU, then waits for it)
        busy = matmul_step(step_s / 2)

        def work():
            busy()
            time.sleep(step_s / 2)
    else:
        work = lambda: time.sleep(step_s)  # noqa: E731

    def loop(body):
        barrier_comm.barrier()
        t0 = time.perf_counter()
        stalls = []
        for step in range(1, steps + 1):
            work()
            for a in arrays:
                a[0, 0] = step  # training changes the state
            t = time.perf_counter()
            body(step)
            stalls.append(time.perf_counter() - t)
        return t0, time.perf_counter(), stalls

    # Rounds of every configuration in a rotating order, medians reported: the host's other load (builds, other
    # users) then weighs on every configuration alike.
    local = os.path.join(shm, f"node-{rank}")
    runs = {None: [], **{p: [] for p in priorities}}
    configs = [None] + list(priorities)
    for r in range(rounds):
        for priority in configs[r % len(configs):] + configs[:r % len(configs)]:
            if priority is None:
                t0, t_end, _ = loop(lambda step: None)
                barrier_comm.barrier()
                runs[None].append({"s": t_end - t0, "drained_s": time.perf_counter() - t0})
                continue
            name, _, n = priority.partition(":")  # "low" or "low:4" (4 writer threads)
            with distckpt.CheckpointManager(comm, local_dir=local, node_id=f"n{rank}",
                                            replicas=1 if world > 1 else 0, keep_local=2,
                                            threads=int(n or threads) or None, background_priority=name) as mgr:
                for step in range(1, 3):  # warm-up: the staging buffers and the first parts
                    mgr.save(10_000 + step, state)
                mgr.wait_until_finished()
                before = mgr.stats()
                t0, t_end, stalls = loop(lambda step: mgr.save(20_000 + step, state))
                mgr.wait_until_finished()
                barrier_comm.barrier()
                after = mgr.stats()
                runs[priority].append({
                    "s": t_end - t0, "drained_s": time.perf_counter() - t0, "stalls": stalls,
                    "saves_waited": after.saves_waited - before.saves_waited,
                    "wait_s": after.wait_seconds - before.wait_seconds,
                })
            shutil.rmtree(local, ignore_errors=True)
            barrier_comm.barrier()
    out["none_s"] = statistics.median(x["s"] for x in runs[None])
    out["none_drained_s"] = statistics.median(x["drained_s"] for x in runs[None])
    out["manager"] = {}
    for priority in priorities:
        stalls = [t for x in runs[priority] for t in x["stalls"]]
        out["manager"][priority] = {
            "s": statistics.median(x["s"] for x in runs[priority]),
            "drained_s": statistics.median(x["drained_s"] for x in runs[priority]), "stall_s": statistics.median(stalls),
            "stall_max_s": max(stalls), "saves_waited": sum(x["saves_waited"] for x in runs[priority]),
            "wait_s": sum(x["wait_s"] for x in runs[priority]),
        }

    if not skip_dcp:
        tensors = {k: torch.from_numpy(v.data) for k, v in state.items()}
        # DCP needs the global view: a DTensor would do; plain per-rank tensors under per-rank names are what DCP
        # saves without a device mesh, and cost it the same bytes.
        tensors = {f"r{rank}.{k}": v for k, v in tensors.items()}
        pending = [None]
        dcp_dir = os.path.join(shm, "dcp")

        def dcp_save(step):
            if pending[0] is not None:
                pending[0].result()
            pending[0] = dcp.async_save(tensors, checkpoint_id=os.path.join(dcp_dir, f"step-{step}"))

        for step in range(1, 3):
            dcp_save(10_000 + step)
        pending[0].result()
        pending[0] = None
        t0, t_end, stalls = loop(dcp_save)
        pending[0].result()
        dist.barrier()
        out["dcp_s"] = t_end - t0
        out["dcp_drained_s"] = time.perf_counter() - t0
        out["dcp_stall_s"] = statistics.median(stalls)
        if rank == 0:
            shutil.rmtree(dcp_dir, ignore_errors=True)
        dist.barrier()
        dist.destroy_process_group()
    barrier_comm.barrier()
    barrier_comm.close()
    comm.close()
    return out


# --------------------------------------------------------------------------------------------------- recovery
def recover_save_worker(rank, world, rdv, shm, persistent, s3_url, mib):
    import distckpt

    comm = group(rank, world, rdv, "save")
    state = make_state(rank, world, mib, 7)
    node = "a" if rank < 2 else "b"
    with distckpt.CheckpointManager(comm, local_dir=os.path.join(shm, f"node-{node}"), node_id=node, replicas=1,
                                    persistent=persistent) as mgr:
        mgr.save(7, state, persist=True)
        mgr.wait_until_finished()
    if s3_url:
        comm2 = group(rank, world, rdv, "s3save")
        distckpt.save(state, s3_url, comm=comm2)
        comm2.close()
    comm.close()
    return sum(v.data.nbytes for v in state.values())


def recover_load_worker(rank, world, rdv, shm, persistent, s3_url, mib, what):
    import distckpt

    state = make_state(rank, world, mib, 0)
    node = "a" if rank < 2 else "b"
    comm = group(rank, world, rdv, what)
    comm.barrier()
    t = time.perf_counter()
    info = {}
    if what == "peers":
        with distckpt.CheckpointManager(comm, local_dir=os.path.join(shm, f"node-{node}"), node_id=node,
                                        replicas=1) as mgr:
            rss0 = _reset_peak_rss()
            cpu0 = time.process_time()
            t = time.perf_counter()
            r = mgr.restore(state, use_persistent=False)
            restore_s = time.perf_counter() - t
            cpu_s = time.process_time() - cpu0  # every thread of the rank; copies back to node b start after this
            info = {"tier": r.tier, "from_peers": r.bytes_from_peers, "from_persistent": r.bytes_from_persistent,
                    "peak_extra": _peak_rss() - rss0 if rss0 else None, "cpu_s": cpu_s}
            assert r.step == 7, r.report
            comm.barrier()
            seconds = time.perf_counter() - t
            mgr.wait_until_finished()  # the restored step saved again (not timed: background work)
        check_state(state, rank, world, 7, world)
        comm.close()
        return {"seconds": seconds, "restore_s": restore_s, **info}
    elif what == "posix":
        distckpt.load(state, os.path.join(persistent, "step-0000000007"), comm=comm)
    else:
        distckpt.load(state, s3_url, comm=comm)
    comm.barrier()
    seconds = time.perf_counter() - t
    check_state(state, rank, world, 7, world)
    comm.close()
    return {"seconds": seconds, **info}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak_rss() -> int:
    """Resets the peak resident set (VmHWM) to the current one; returns it (0 where the kernel cannot)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return 0
    return _status_kib("VmRSS")


def _peak_rss() -> int:
    return _status_kib("VmHWM")


def evict(path: str) -> int:
    os.sync()
    n = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return n


def loopback_copy(nbytes_each: int, streams: int) -> tuple:
    """Seconds to send `nbytes_each` bytes on each of `streams` loopback TCP connections at once, and the CPU seconds
    it took (this process's threads: the senders and receivers, and the kernel's copies done for them)."""
    payload = np.ones(min(nbytes_each, 64 << 20), dtype=np.uint8)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(streams)
    port = srv.getsockname()[1]
    dst = np.empty(nbytes_each, dtype=np.uint8)
    done = []

    def sender():
        s = socket.create_connection(("127.0.0.1", port))
        left = nbytes_each
        view = memoryview(payload)
        while left:
            n = min(left, len(view))
            s.sendall(view[:n])
            left -= n
        s.close()

    def receiver(conn):
        buf = memoryview(np.empty(nbytes_each, dtype=np.uint8))
        got = 0
        while got < nbytes_each:
            n = conn.recv_into(buf[got:], nbytes_each - got)
            if n == 0:
                break
            got += n
        done.append(got)
        conn.close()

    cpu0 = time.process_time()
    t = time.perf_counter()
    senders = [threading.Thread(target=sender) for _ in range(streams)]
    for s in senders:
        s.start()
    receivers = []
    for _ in range(streams):
        conn, _ = srv.accept()
        th = threading.Thread(target=receiver, args=(conn,))
        th.start()
        receivers.append(th)
    for th in senders + receivers:
        th.join()
    seconds = time.perf_counter() - t
    cpu = time.process_time() - cpu0
    srv.close()
    del dst
    assert done == [nbytes_each] * streams
    return seconds, cpu


# ------------------------------------------------------------------------------------------------------- main
class _Done(Exception):
    """--skip-recovery: the report ends after the throughput part."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mib", default="16,64,256")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--step-s", type=float, default=0.5)
    ap.add_argument("--recover-mib", default="128,512", help="sizes per rank, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="recovery runs per size (medians)")
    ap.add_argument("--skip-s3", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-recovery", action="store_true")
    ap.add_argument("--skip-dcp", action="store_true")
    ap.add_argument("--step-mode", choices=("sleep", "matmul", "mixed"), default="sleep")
    ap.add_argument("--priorities", default="low,normal,idle",
                    help="background_priority values to run the manager with, each optionally with its threads "
                         "(low:4); the first one decides the largest size reported")
    ap.add_argument("--threads", type=int, default=0, help="the manager's threads (0: its default)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of every configuration, in rotating order (the medians are reported)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    work = tempfile.mkdtemp(prefix="manager-bench-")
    shm = tempfile.mkdtemp(prefix="manager-bench-", dir=shm_root)
    report = {"host": platform.node(), "cpus": os.cpu_count(), "date": datetime.date.today().isoformat(),
              "args": vars(args), "throughput": [], "recovery": {}}
    lines = [f"### distckpt CheckpointManager benchmark ({report['date']}, {os.cpu_count()} CPUs)", ""]
    try:
        if not args.skip_throughput:
            priorities = args.priorities.split(",")
            if args.step_mode != "sleep":  # the ranks' BLAS threads share the cores (children read it at import)
                blas = str(max(1, (os.cpu_count() or 1) // args.ranks))
                for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                    os.environ[var] = blas
            step_what = {"matmul": f"{args.step_s} s of float32 matmuls on every core",
                         "mixed": f"{args.step_s / 2} s of float32 matmuls on every core then {args.step_s / 2} s idle",
                         "sleep": f"{args.step_s} s (host idle)"}[args.step_mode]
            lines += [f"Throughput: {args.ranks} ranks (one node each, replicas=1), {args.steps} steps of {step_what}, "
                      f"a checkpoint every step; manager threads={args.threads or 'default'}; medians of {args.rounds} "
                      "rounds of every configuration in rotating order (saves waited: the sum). Steps/s: over the "
                      "training loop, from its first step to the return of its last save (the training's rate; "
                      "every stall and back-pressure wait is inside it); \"drained\": the ratio when the wait for the "
                      "last step's background work after the loop is counted too (it is the same for every step "
                      "count, so it weighs less the longer the run).", "",
                      "| MiB/rank | no ckpt steps/s | " + " | ".join(
                          f"manager ({p}) steps/s | ratio | drained | saves waited | stall ms (median/max)"
                          for p in priorities)
                      + " | memcpy ms | DCP async_save steps/s | ratio | drained | DCP stall ms |",
                      "|---|---|" + "---|---|---|---|---|" * len(priorities) + "---|---|---|---|---|"]
            largest = None
            for mib in [int(x) for x in args.mib.split(",")]:
                rdv = tempfile.mkdtemp(prefix="rdv-", dir=work)
                res = run_ranks(args.ranks, throughput_worker, rdv, shm, mib, args.steps, args.step_s,
                                args.step_mode, priorities, args.threads, args.skip_dcp, args.rounds)
                none_sps = args.steps / max(r["none_s"] for r in res)
                none_drained = max(r["none_drained_s"] for r in res)
                memcpy = statistics.median(r["memcpy_s"] for r in res)
                row = {"mib": mib, "bytes_per_rank": res[0]["bytes"], "none_s": none_sps, "memcpy_s": memcpy,
                       "manager": {}}
                cells = [f"{mib}", f"{none_sps:.3f}"]
                for p in priorities:
                    sps = args.steps / max(r["manager"][p]["s"] for r in res)
                    drained = none_drained / max(r["manager"][p]["drained_s"] for r in res)
                    stall = statistics.median(r["manager"][p]["stall_s"] for r in res)
                    stall_max = max(r["manager"][p]["stall_max_s"] for r in res)
                    waited = sum(r["manager"][p]["saves_waited"] for r in res)
                    row["manager"][p] = {"steps_per_s": sps, "ratio": sps / none_sps, "drained_ratio": drained,
                                         "stall_s": stall,
                                         "stall_max_s": stall_max, "saves_waited": waited,
                                         "stall_over_memcpy": stall / memcpy}
                    cells += [f"{sps:.3f}", f"{sps / none_sps:.3f}", f"{drained:.3f}", f"{waited}",
                              f"{stall * 1e3:.1f} / {stall_max * 1e3:.1f}"]
                cells.append(f"{memcpy * 1e3:.1f}")
                if args.skip_dcp:
                    cells += ["-", "-", "-", "-"]
                else:
                    dcp_sps = args.steps / max(r["dcp_s"] for r in res)
                    row["dcp_s"] = dcp_sps
                    row["dcp_ratio"] = dcp_sps / none_sps
                    row["dcp_drained_ratio"] = none_drained / max(r["dcp_drained_s"] for r in res)
                    row["dcp_stall_s"] = statistics.median(r["dcp_stall_s"] for r in res)
                    cells += [f"{dcp_sps:.3f}", f"{dcp_sps / none_sps:.3f}", f"{row['dcp_drained_ratio']:.3f}",
                              f"{row['dcp_stall_s'] * 1e3:.1f}"]
                report["throughput"].append(row)
                if row["manager"][priorities[0]]["ratio"] >= 0.95:
                    largest = mib
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
            report["largest_mib_at_0.95"] = largest
            lines += ["", f"Largest state per rank with throughput >= 0.95x the loop without checkpoints "
                          f"({priorities[0]} priority): {largest} MiB" if largest else "No size kept >= 0.95x.", ""]

        if args.skip_recovery:
            raise _Done()

        # Recovery, per size: the step saved once; each repeat loses node b again (the restore copies its parts
        # back to it) and restores; medians of --repeat runs.
        server = None
        s3_url_base = None
        if not args.skip_s3:
            from _s3_server import MotoServer

            server = MotoServer()
            server.client().create_bucket(Bucket="bench")
            os.environ.update(server.env())
            s3_url_base = "s3://bench/recover"
        med = statistics.median
        report["recovery"] = []
        for mib in [int(x) for x in str(args.recover_mib).split(",")]:
            persistent = os.path.join(work, f"persistent-{mib}")
            os.makedirs(persistent)
            s3_url = f"{s3_url_base}-{mib}/step-7" if s3_url_base else None
            shutil.rmtree(shm, ignore_errors=True)
            os.makedirs(shm)
            rdv = tempfile.mkdtemp(prefix="rdv-", dir=work)
            per_rank = run_ranks(4, recover_save_worker, rdv, shm, persistent, s3_url, mib)[0]
            rec = {"mib": mib, "bytes_per_rank": per_rank, "peers_s": [], "posix_cold_s": [], "s3_s": [],
                   "loopback_copy_s": [], "loopback_copy_cpu_s": [], "peak_extra": [], "peers_cpu_s": []}
            for _ in range(args.repeat):
                shutil.rmtree(os.path.join(shm, "node-b"))
                rdv = tempfile.mkdtemp(prefix="rdv-", dir=work)
                peers = run_ranks(4, recover_load_worker, rdv, shm, persistent, s3_url, mib, "peers")
                rec["peers_s"].append(max(r["seconds"] for r in peers))
                rec["peers_cpu_s"].append(sum(r["cpu_s"] for r in peers))
                rec["peers_from_persistent"] = sum(r["from_persistent"] for r in peers)
                rec["peers_bytes_from_peers"] = sum(r["from_peers"] for r in peers)
                if all(r["peak_extra"] is not None for r in peers):
                    rec["peak_extra"].append(max(r["peak_extra"] for r in peers))
                rec["evicted_bytes"] = evict(persistent)
                rdv = tempfile.mkdtemp(prefix="rdv-", dir=work)
                rec["posix_cold_s"].append(max(r["seconds"] for r in run_ranks(4, recover_load_worker, rdv, shm,
                                                                                  persistent, s3_url, mib, "posix")))
                if s3_url:
                    rdv = tempfile.mkdtemp(prefix="rdv-", dir=work)
                    rec["s3_s"].append(max(r["seconds"] for r in run_ranks(4, recover_load_worker, rdv, shm,
                                                                             persistent, s3_url, mib, "s3")))
                copy_s, copy_cpu_s = min(loopback_copy(per_rank, 2) for _ in range(3))
                rec["loopback_copy_s"].append(copy_s)
                rec["loopback_copy_cpu_s"].append(copy_cpu_s)
            report["recovery"].append(rec)
            peers_s, copy_s, cold_s = med(rec["peers_s"]), med(rec["loopback_copy_s"]), med(rec["posix_cold_s"])
            lines += ["", f"Recovery: 4 ranks on 2 nodes, {mib} MiB per rank; node b (2 ranks) lost; restore on 4 "
                          f"ranks; medians of {args.repeat} runs (each restore also copies node b's lost parts back to it "
                          "in the background, not timed).", "",
                      "| restore | seconds | peers restore is |", "|---|---|---|",
                      f"| from peers (manager; {rec['peers_bytes_from_peers'] / 2**20:.0f} MiB sent by peers, "
                      f"{rec['peers_from_persistent']} bytes from persistent storage) | {peers_s:.3f} | |",
                      f"| limit: node b's {2 * per_rank / 2**20:.0f} MiB over loopback TCP (2 streams) | "
                      f"{copy_s:.3f} | {peers_s / copy_s:.2f}x the copy (target <= 1.5x) |",
                      f"| persisted step on disk, cold (distckpt.load; {rec['evicted_bytes'] / 2**20:.0f} MiB evicted "
                      f"with fadvise DONTNEED) | {cold_s:.3f} | {cold_s / peers_s:.2f}x faster (target >= 2x) |"]
            if rec["s3_s"]:
                s3 = med(rec["s3_s"])
                lines.append(f"| persisted step in S3 (moto on loopback; distckpt.load) | {s3:.3f} | "
                             f"{s3 / peers_s:.2f}x faster (target >= 5x) |")
            if rec["peak_extra"]:
                extra = max(rec["peak_extra"])
                lines += ["", f"Peak extra resident memory of a restoring rank (VmHWM over the resident set before the "
                              f"call, state allocated): {extra / 2**20:.0f} MiB (target <= exchange budget "
                              f"2 x 64 MiB + 64 MiB = 192 MiB)"]
            cpu_s, copy_cpu_s, cores = med(rec["peers_cpu_s"]), med(rec["loopback_copy_cpu_s"]), os.cpu_count() or 1
            lines += ["", f"CPU: the restore took {cpu_s * 1e3:.0f} ms of CPU over its 4 ranks (the copy of node b's "
                          f"bytes: {copy_cpu_s * 1e3:.0f} ms), so on this machine's {cores} cores it cannot end in less "
                          f"than {cpu_s / cores:.3f} s: {cpu_s / cores / copy_s:.2f}x the copy's time, the best ratio this "
                          "host allows (node a's ranks restore their own state beside serving node b's)"]
            print("\n".join(lines[-10:]), flush=True)
        if server is not None:
            server.stop()
    except _Done:
        pass
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"{report['date']}-manager-{platform.node()}")
    with open(base + ".md", "w") as f:
        f.write(text)
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=2)
    print(f"manager_bench: wrote {base}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
