"""DCP benchmark: torch.distributed.checkpoint's FileSystemWriter/Reader vs distckpt.torch.StorageWriter/Reader vs
plain distckpt.save/load vs the disk's physical limit, in one run, on the same state and directory.

The state: --tensors float32 tensors (--mib MiB in all), each a DTensor Shard(0) over a CPU device mesh of --ranks
gloo ranks, plus {"step": 7}. Saved on --ranks ranks, loaded on --ranks ranks (same sharding) and on --load-ranks
ranks (resharded: Shard(0) over another mesh). Every load's values are checked against what was saved.

Durability is the same everywhere: DCP's FileSystemWriter fsyncs its files (sync_files=True, the default), distckpt
fsyncs data, metadata and directories (sync=True, the default), the physical measure fsyncs its files and directory.
"Cold" reads: the files' pages are evicted first with posix_fadvise(POSIX_FADV_DONTNEED) (no root needed; the pages
are clean after the fsyncs); "warm" reads come right after, from the page cache.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

COLS = 1024  # float32 per row: 4 KiB rows
SAVE_METHODS = ("physical", "dcp_fs", "dcp_distckpt", "distckpt")
LOAD_METHODS = ("physical", "dcp_fs", "dcp_distckpt", "distckpt")
LABELS = {
    "physical": "plain files (os.write+fsync / os.preadv)",
    "dcp_fs": "dcp + FileSystemWriter/Reader",
    "dcp_distckpt": "dcp + distckpt.torch.StorageWriter/Reader",
    "distckpt": "distckpt.save/load (comm=from_torch)",
}


# ---------------------------------------------------------------------------------------------------------- helpers


def rows_of(rows, world, rank):
    """[lo, hi) of DTensor Shard(0) (torch.chunk semantics) on `rank` of `world`."""
    chunk = -(-rows // world)
    lo = min(rank * chunk, rows)
    return lo, min(lo + chunk, rows)


def expected(i, lo, hi):
    import torch

    return torch.arange(lo * COLS, hi * COLS, dtype=torch.int64).add_(i * 7919).remainder_(1 << 24).float().view(
        hi - lo, COLS
    )


def evict(path):
    """Drops the page cache of every file under path (clean pages: written and fsynced)."""
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


# ---------------------------------------------------------------------------------------------------------- workers


def _state(world, rank, tensors, rows, fill):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    model = {}
    for i in range(tensors):
        lo, hi = rows_of(rows, world, rank)
        local = expected(i, lo, hi) if fill else torch.zeros(hi - lo, COLS)
        model[f"layer{i}.weight"] = DTensor.from_local(
            local, mesh, [Shard(0)], run_check=False, shape=torch.Size((rows, COLS)), stride=(COLS, 1)
        )
    return {"model": model, "step": 7 if fill else -1}


def _check(state, world, rank, rows):
    import torch

    assert state["step"] == 7, state["step"]
    for name, t in state["model"].items():
        i = int(name[len("layer"):].split(".")[0])
        lo, hi = rows_of(rows, world, rank)
        assert torch.equal(t.to_local(), expected(i, lo, hi)), f"{name}: values differ on rank {rank}"


def _zero(state):
    for t in state["model"].values():
        t.to_local().zero_()
    state["step"] = -1


def _timed(dist, fn):
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def _physical_write(path, rank, state):
    """This rank's bytes, one file, one os.write per tensor region (a single contiguous buffer), fsync."""
    import torch

    buf = torch.cat([t.to_local().reshape(-1) for t in state["model"].values()]).numpy()
    os.makedirs(path, exist_ok=True)

    def run():
        fd = os.open(os.path.join(path, f"rank{rank}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            mv = memoryview(buf).cast("B")
            while mv:
                mv = mv[os.write(fd, mv):]
            os.fsync(fd)
        finally:
            os.close(fd)

    return run, buf.nbytes


def _physical_read(path, rank, nbytes):
    import numpy as np

    out = np.empty(nbytes, dtype=np.uint8)

    def run():
        fd = os.open(os.path.join(path, f"rank{rank}.bin"), os.O_RDONLY)
        try:
            mv, off = memoryview(out), 0
            while off < nbytes:
                n = os.preadv(fd, [mv[off:]], off)
                assert n > 0
                off += n
        finally:
            os.close(fd)

    return run, out


@contextlib.contextmanager
def _gloo_group(rank, world, rdv):
    """A gloo process group over loopback for one rank, destroyed on the way out."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=rdv, rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def save_worker(rank, world, rdv, root, a, results):
    """Saves the state --repeat times with each method (rotating the order); keeps the last rep's checkpoints."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import distckpt
    import distckpt.comm
    import distckpt.torch

    with _gloo_group(rank, world, rdv):
        state = _state(world, rank, a.tensors, a.rows, fill=True)
        comm = distckpt.comm.from_torch()
        times = {m: [] for m in SAVE_METHODS}
        for rep in range(a.repeat):
            order = SAVE_METHODS[rep % 4:] + SAVE_METHODS[:rep % 4]
            for m in order:
                path = os.path.join(root, f"save_{m}")
                if rank == 0 and os.path.exists(path):
                    shutil.rmtree(path)
                dist.barrier()
                if m == "physical":
                    run, _ = _physical_write(path, rank, state)
                    dist.barrier()

                    def op(run=run, path=path):
                        run()
                        dist.barrier()  # every file fsynced, then the directory (as the libraries do)
                        if rank == 0:
                            fsync_dir(path)
                elif m == "dcp_fs":
                    def op(path=path):
                        dcp.save(state, storage_writer=dcp.FileSystemWriter(path))  # sync_files=True by default
                elif m == "dcp_distckpt":
                    def op(path=path):
                        dcp.save(state, storage_writer=distckpt.torch.StorageWriter(path))
                else:
                    def op(path=path):
                        distckpt.save(state, path, comm=comm)  # sync=True by default
                times[m].append(_timed(dist, op))
        if rank == 0:
            sizes = {m: dir_bytes(os.path.join(root, f"save_{m}")) for m in SAVE_METHODS}
            results.put(("save", times, sizes))
        dist.barrier()


def load_worker(rank, world, rdv, root, a, results):
    """Loads each checkpoint (cold, then warm) --repeat times on this world's sharding; checks every load."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import distckpt
    import distckpt.comm
    import distckpt.torch

    with _gloo_group(rank, world, rdv):
        state = _state(world, rank, a.tensors, a.rows, fill=False)
        comm = distckpt.comm.from_torch()
        # The physical read reads as many bytes per rank as the loads do: this world's own files of its share.
        phys = os.path.join(root, f"phys_read_{world}")
        full = _state(world, rank, a.tensors, a.rows, fill=True)
        wrun, nbytes = _physical_write(phys, rank, full)
        del full
        wrun()
        dist.barrier()
        rrun, _ = _physical_read(phys, rank, nbytes)
        times = {(m, c): [] for m in LOAD_METHODS for c in ("cold", "warm")}
        for rep in range(a.repeat):
            order = LOAD_METHODS[rep % 4:] + LOAD_METHODS[:rep % 4]
            for m in order:
                path = phys if m == "physical" else os.path.join(root, f"save_{m}")
                for cache in ("cold", "warm"):
                    _zero(state)
                    if cache == "cold" and rank == 0:
                        evict(path)
                    dist.barrier()
                    if m == "physical":
                        op = rrun
                    elif m == "dcp_fs":
                        def op(path=path):
                            dcp.load(state, storage_reader=dcp.FileSystemReader(path))
                    elif m == "dcp_distckpt":
                        def op(path=path):
                            dcp.load(state, storage_reader=distckpt.torch.StorageReader(path))
                    else:
                        def op(path=path):
                            distckpt.load(state, path, comm=comm)
                    times[(m, cache)].append(_timed(dist, op))
                    if m != "physical":
                        _check(state, world, rank, a.rows)
        if rank == 0:
            results.put(("load", {f"{m}|{c}": v for (m, c), v in times.items()}, nbytes))
        dist.barrier()


def _run(fn, rank, args, results):
    try:
        fn(rank, *args, results)
        results.put(("done", rank, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put(("done", rank, traceback.format_exc()))


def run_ranks(fn, world, *args, deadline=900):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_run, args=(fn, r, (world, *args), results)) for r in range(world)]
    for p in procs:
        p.start()
    out, done, failures = [], 0, []
    try:
        while done < world:
            try:
                msg = results.get(timeout=deadline)
            except queue.Empty:
                failures.append("timed out")
                break
            if msg[0] == "done":
                done += 1
                if msg[2]:
                    failures.append(f"rank {msg[1]}:\n{msg[2]}")
            else:
                out.append(msg)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    if failures:
        sys.exit("\n".join(failures))
    return out[0]


# ---------------------------------------------------------------------------------------------------------- fio


def fio(directory, jobs, mib_per_job, repeat):
    """fio sequential write (end_fsync) and cold read (invalidate=1) of jobs files of mib_per_job MiB: seconds as
    bytes / fio's aggregate bandwidth (fio's startup and file layout excluded)."""
    base = ["fio", "--name=phys", f"--directory={directory}", f"--numjobs={jobs}", f"--size={mib_per_job}M",
            "--bs=16M", "--ioengine=psync", "--group_reporting", "--output-format=json"]
    w, r = [], []
    for _ in range(repeat):
        for f in os.listdir(directory):
            os.remove(os.path.join(directory, f))
        for rw, extra, out in (("write", "--end_fsync=1", w), ("read", "--invalidate=1", r)):
            res = subprocess.run(base + [f"--rw={rw}", extra], check=True, capture_output=True, text=True)
            job = json.loads(res.stdout[res.stdout.index("{"):])["jobs"][0][rw]
            out.append(job["io_bytes"] / job["bw_bytes"])  # fio's own time for the I/O (no process start)
    return statistics.median(w), statistics.median(r)


# ---------------------------------------------------------------------------------------------------------- main


def table(title, rows, mib, ref, phys):
    print(f"\n{title}")
    print(f"{'':44s} {'median s':>9s} {'MiB/s':>8s} {'vs DCP FS':>9s} {'vs phys':>8s}")
    for label, t in rows:
        print(f"{label:44s} {t:9.3f} {mib / t:8.1f} {ref / t:9.2f} {phys / t:8.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=512, help="state size in MiB (default 512)")
    p.add_argument("--tensors", type=int, default=8, help="number of tensors (default 8)")
    p.add_argument("--ranks", type=int, default=2, help="saving ranks (default 2)")
    p.add_argument("--load-ranks", type=int, default=3, help="ranks of the resharded load (default 3)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions; medians are printed (default 3)")
    p.add_argument("--dir", default=None, help="directory for the checkpoints (default: a temporary directory)")
    p.add_argument("--no-fio", action="store_true", help="skip fio even where it is installed")
    p.add_argument("--json", default=None, help="also write the raw times here")
    a = p.parse_args()
    a.rows = a.mib * (1 << 20) // 4 // COLS // a.tensors
    mib = a.rows * COLS * 4 * a.tensors / (1 << 20)

    root = tempfile.mkdtemp(prefix="dcp_bench_", dir=a.dir)
    print(f"state: {a.tensors} float32 DTensors Shard(0), {a.rows} x {COLS} each, {mib:.0f} MiB in all; "
          f"save on {a.ranks} ranks, load on {a.ranks} and {a.load_ranks}; repeat {a.repeat}; dir {root}")
    med = statistics.median
    try:
        _, save_t, sizes = run_ranks(save_worker, a.ranks, f"file://{root}/rdv_save", root, a)
        loads = {}
        for world in dict.fromkeys((a.ranks, a.load_ranks)):
            _, lt, _ = run_ranks(load_worker, world, f"file://{root}/rdv_load{world}", root, a)
            loads[world] = lt
        fio_t = None
        if not a.no_fio and shutil.which("fio"):
            d = os.path.join(root, "fio")
            os.makedirs(d)
            fio_t = fio(d, a.ranks, int(mib) // a.ranks, a.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print("bytes on disk: " + ", ".join(f"{m} {sizes[m] / (1 << 20):.1f} MiB" for m in SAVE_METHODS))
    s = {m: med(v) for m, v in save_t.items()}
    rows = [(LABELS[m], s[m]) for m in SAVE_METHODS]
    if fio_t:
        rows.insert(1, (f"fio write, {a.ranks} jobs, end_fsync", fio_t[0]))
    table(f"SAVE on {a.ranks} ranks ({mib:.0f} MiB, durable)", rows, mib, s["dcp_fs"], s["physical"])
    for world, lt in loads.items():
        kind = "same sharding" if world == a.ranks else f"resharded {a.ranks} -> {world}"
        for cache in ("cold", "warm"):
            l = {m: med(lt[f"{m}|{cache}"]) for m in LOAD_METHODS}
            rows = [(LABELS[m], l[m]) for m in LOAD_METHODS]
            if fio_t and cache == "cold" and world == a.ranks:
                rows.insert(1, (f"fio read, {a.ranks} jobs, invalidate=1", fio_t[1]))
            table(f"LOAD on {world} ranks, {kind}, {cache} ({mib:.0f} MiB, values checked)", rows, mib,
                  l["dcp_fs"], l["physical"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"save": save_t, "load": {str(k): v for k, v in loads.items()}, "fio": fio_t, "sizes": sizes}, f)


if __name__ == "__main__":
    main()
