#!/usr/bin/env python3
"""Export to the Hugging Face hub's format (issue 30): distckpt's exporter against fio and DCP's consolidation.

One state, saved twice by --ranks ranks (real processes over Gloo on loopback): a transformer-like model (TinyLlama
shapes: bf16 matrices sharded by rows, down projections by columns, f32 norms replicated) of about --gib GiB, once
with distckpt.save and once with torch.distributed.checkpoint.save through DCP's HuggingFaceStorageWriter
(save_distributed=True: each rank's shards in safetensors files). Then, interleaved, --runs rounds of:

- distckpt, 1 process: ``export_safetensors(ckpt, out, --max-shard-size, buffer_size=--buffer)``;
- distckpt, --ranks ranks: the same call collective over a Gloo communicator (each rank writes its share of files);
- DCP, 1 process: ``consolidate_safetensors_files`` (torch's _consolidate_hf_safetensors) into the same files (the
  fqn -> file index mapping taken from distckpt's export), then fsync of every file it wrote (DCP does not sync; the
  time without it is reported too);
- DCP, --ranks ranks: ``consolidate_safetensors_files_on_every_rank`` over a gloo process group, fsync likewise;
- fio: a sequential write of the same number of bytes into one file in the same directory, fsync at the end, with
  O_DIRECT (psync, 16 MiB blocks) and through the page cache; the better of the two is the limit.

each with the source in the page cache (warm: read once before) and evicted (cold: posix_fadvise DONTNEED after a
sync), as --cache says. Every measured process reports its wall time (from a barrier, the slowest rank for a job),
its peak RSS and its RSS before the operation (the interpreter, torch for DCP). The outputs are checked: distckpt's
files equal DCP's, tensor by tensor. Writes bench/results/<date>-export-<host>.md and .json; the load average is
recorded around every measurement.

    .venv/bin/python bench/export/export_bench.py [--ranks 4] [--gib 2] [--runs 3] [--cache warm,cold]
        [--max-shard-size 400MB] [--buffer 64MiB] [--dir /path/on/the/disk] [--skip-dcp] [--tag vm]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HIDDEN, FFN, VOCAB = 2048, 5632, 32000


# ------------------------------------------------------------------------------------------------------------ state
def spec(gib):
    """[(name, global shape, dtype, shard dim or None)] of a TinyLlama-like model of about `gib` GiB."""
    per_layer = (4 * HIDDEN * HIDDEN + 3 * FFN * HIDDEN) * 2 + 2 * HIDDEN * 4
    layers = max(1, round((gib * 2**30 - 2 * VOCAB * HIDDEN * 2) / per_layer))
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN), "bf16", 0)]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.qkv_proj.weight", (3 * HIDDEN, HIDDEN), "bf16", 0),
                (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN), "bf16", 1),
                (p + "mlp.gate_up_proj.weight", (2 * FFN, HIDDEN), "bf16", 0),
                (p + "mlp.down_proj.weight", (HIDDEN, FFN), "bf16", 1),
                (p + "input_layernorm.weight", (HIDDEN,), "f32", None),
                (p + "post_attention_layernorm.weight", (HIDDEN,), "f32", None)]  # fmt: skip
    out += [("model.norm.weight", (HIDDEN,), "f32", None), ("lm_head.weight", (VOCAB, HIDDEN), "bf16", 0)]
    return out


def split(n, parts, k):
    base, extra = divmod(n, parts)
    lo = k * base + min(k, extra)
    return lo, lo + base + (1 if k < extra else 0)


def values(name, shape, dtype, box):
    """Piece `box` ((lo, hi) per dimension) of tensor `name`, as uint16 (bf16 bits) or float32: a hash of the global
    element index, so every rank makes its own piece without the rest (and DCP's ranks the same ones)."""
    import numpy as np

    seed = np.uint32(sum(ord(c) * 131**i for i, c in enumerate(name)) % 2**31)
    if len(shape) == 1:
        flat = np.arange(box[0][0], box[0][1], dtype=np.uint32)
    else:
        rows = np.arange(box[0][0], box[0][1], dtype=np.uint32)[:, None] * np.uint32(shape[1])
        flat = rows + np.arange(box[1][0], box[1][1], dtype=np.uint32)[None, :]
    h = flat * np.uint32(2654435761) + seed  # wraps modulo 2^32
    if dtype == "bf16":
        return ((h >> np.uint32(8)) & np.uint32(0x7EFF)).astype(np.uint16)  # exponent never all ones: finite
    return ((h % np.uint32(2000)).astype(np.float32) - 1000) / 1000


def local_pieces(rank, world, gib):
    """This rank's piece of every tensor: (name, shape, dtype, box, array) with box the (lo, hi) per dimension."""
    for name, shape, dtype, dim in spec(gib):
        box = [(0, n) for n in shape]
        if dim is not None:
            box[dim] = split(shape[dim], world, rank)
        yield name, shape, dtype, box, values(name, shape, dtype, box)


# ------------------------------------------------------------------------------------------------------ child roles
def rss_kib():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child_save_dckpt(rank, world, rdv, ckpt, gib):
    import ml_dtypes

    import distckpt

    state = {}
    for name, shape, dtype, box, a in local_pieces(rank, world, gib):
        if dtype == "bf16":
            a = a.view(ml_dtypes.bfloat16)
        state[name] = distckpt.Shard(a, shape, tuple(lo for lo, _ in box)) if a.shape != shape else a
    with distckpt.comm.gloo(rank, world, rendezvous=rdv, prefix="save", timeout=600) as comm:
        distckpt.save(state, ckpt, comm=comm, timeout=600)
    return {}


def child_save_dcp(rank, world, rdv, dcp_dir, gib, mapping_path):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    dist.init_process_group("gloo", init_method=rdv + "_dcp_save", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    with open(mapping_path) as f:
        mapping = json.load(f)
    state = {}
    for name, shape, dtype, box, a in local_pieces(rank, world, gib):
        t = torch.from_numpy(a)
        if dtype == "bf16":
            t = t.view(torch.bfloat16)
        dims = [i for i, (lo, hi) in enumerate(box) if hi - lo != shape[i]]
        placement = [Shard(dims[0])] if dims else [Replicate()]
        state[name] = DTensor.from_local(t, mesh, placement, run_check=False, shape=torch.Size(shape),
                                         stride=torch.empty(shape, device="meta").stride())  # fmt: skip
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(dcp_dir, fqn_to_index_mapping=mapping,
                                                            save_distributed=True))  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()
    return {}


def child_export(rank, world, rdv, ckpt, out, shard, buffer, threads):
    import distckpt

    before = rss_kib()
    comm = distckpt.comm.gloo(rank, world, rendezvous=rdv, prefix="export", timeout=600) if world > 1 else None
    if comm is not None:
        comm.barrier(timeout=600)
    t = time.perf_counter()
    distckpt.export_safetensors(ckpt, out, shard, buffer_size=buffer, io_threads=threads, comm=comm, timeout=600)
    seconds = time.perf_counter() - t
    if comm is not None:
        comm.close()
    return {"seconds": seconds, "rss_before_kib": before, "rss_peak_kib": rss_kib()}


def child_consolidate(rank, world, rdv, dcp_dir, out, mapping_path):
    import torch.distributed as dist
    from torch.distributed.checkpoint import _consolidate_hf_safetensors as chf

    with open(mapping_path) as f:
        mapping = json.load(f)
    if world > 1:
        dist.init_process_group("gloo", init_method=rdv + "_dcp_consolidate", rank=rank, world_size=world)
        dist.barrier()
    before = rss_kib()
    t = time.perf_counter()
    if world > 1:
        chf.consolidate_safetensors_files_on_every_rank(dcp_dir, out, mapping, num_threads=1)
    else:
        chf.consolidate_safetensors_files(dcp_dir, out, mapping, num_threads=1)
    unsynced = time.perf_counter() - t
    # DCP leaves its files unsynced; the same durability as the others costs an fsync of each file this rank wrote
    # (files go to ranks by index % world, as DCP assigns them).
    largest = max(mapping.values())
    for idx in sorted(set(mapping.values())):
        if idx % world == rank or world == 1:
            name = f"model-{idx:05d}-of-{largest:05d}.safetensors"
            fd = os.open(os.path.join(out, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    seconds = time.perf_counter() - t
    if world > 1:
        dist.barrier()
        seconds_job = time.perf_counter() - t
        dist.destroy_process_group()
    else:
        seconds_job = seconds
    return {"seconds": seconds_job, "seconds_rank": seconds, "seconds_unsynced": unsynced, "rss_before_kib": before,
            "rss_peak_kib": rss_kib()}  # fmt: skip


ROLES = {"save-dckpt": child_save_dckpt, "save-dcp": child_save_dcp, "export": child_export,
         "consolidate": child_consolidate}  # fmt: skip


def child_main(argv):
    role, rank, world, rdv, *rest = argv
    args = []
    for a in rest:
        try:
            args.append(json.loads(a))
        except ValueError:
            args.append(a)
    result = ROLES[role](int(rank), int(world), rdv, *args)
    print("BENCH_RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------------------- driver
def launch(role, world, *args, rdv_dir):
    """Runs `role` on `world` processes; returns their results (by rank) and the load average around them."""
    rdv = "file://" + tempfile.mkdtemp(prefix="rdv-", dir=rdv_dir)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", role]
    load_before = os.getloadavg()[0]
    procs = [subprocess.Popen(cmd + [str(r), str(world), rdv] + [json.dumps(a) if not isinstance(a, str) else a
                                                                   for a in args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(world)]  # fmt: skip
    results = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            for q in procs:
                q.kill()
            sys.exit(f"export_bench: {role} rank {r} failed ({p.returncode}):\n{err[-4000:]}")
        line = [x for x in out.splitlines() if x.startswith("BENCH_RESULT ")][-1]
        results.append(json.loads(line[len("BENCH_RESULT ") :]))
    return results, (load_before, os.getloadavg()[0])


def data_files(path):
    out = []
    for dirpath, _, files in os.walk(path):
        out += [os.path.join(dirpath, f) for f in files]
    return out


def warm(path):
    for f in data_files(path):
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass


def evict(path):
    os.sync()
    for f in data_files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def fio(path, nbytes, direct):
    """MB/s of a sequential write of `nbytes` into one file, fsync at the end (fio's own figure)."""
    cmd = ["fio", "--name=limit", "--rw=write", f"--size={nbytes}", "--ioengine=psync", "--end_fsync=1",
           f"--direct={1 if direct else 0}", "--bs=16m", f"--filename={path}", "--output-format=json"]  # fmt: skip
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        if os.path.exists(path):
            os.remove(path)
    job = json.loads(out[out.index("{") :])["jobs"][0]["write"]
    return job["bw_bytes"] / 1e6


def compare_outputs(a_dir, b_dir):
    """Checks that every tensor of the export in a_dir equals the one in b_dir (safetensors, torch, bytes)."""
    from safetensors import safe_open

    with open(os.path.join(a_dir, "model.safetensors.index.json")) as f:
        wa = json.load(f)["weight_map"]
    with open(os.path.join(b_dir, "model.safetensors.index.json")) as f:
        wb = json.load(f)["weight_map"]
    assert set(wa) == set(wb), "the two exports hold different tensors"
    import torch

    for name in sorted(wa):
        with safe_open(os.path.join(a_dir, wa[name]), "pt") as fa, safe_open(os.path.join(b_dir, wb[name]), "pt") as fb:
            ta, tb = fa.get_tensor(name), fb.get_tensor(name)
            assert ta.dtype == tb.dtype and ta.shape == tb.shape, name
            assert torch.equal(ta.view(torch.uint8), tb.view(torch.uint8)), f"{name} differs"
    return len(wa)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cache", default="warm,cold")
    ap.add_argument("--max-shard-size", default="400MB")
    ap.add_argument("--buffer", default="64MiB")
    ap.add_argument("--threads", type=int, default=0, help="io_threads of each exporting process (0: default)")
    ap.add_argument("--dir", default="", help="work directory on the disk to measure (default: under bench/results)")
    ap.add_argument("--skip-dcp", action="store_true")
    ap.add_argument("--tag", default=platform.node() or "host")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    a = ap.parse_args()
    caches = [c for c in a.cache.split(",") if c]

    work = (
        os.path.abspath(a.dir)
        if a.dir
        else tempfile.mkdtemp(prefix="export-bench-", dir=os.path.join(ROOT, "bench", "results"))
    )
    os.makedirs(work, exist_ok=True)
    ckpt, dcp_dir = os.path.join(work, "ckpt"), os.path.join(work, "dcp")
    out_d, out_c = os.path.join(work, "hub-distckpt"), os.path.join(work, "hub-dcp")
    mapping_path = os.path.join(work, "fqn_to_index.json")
    for p in (ckpt, dcp_dir, out_d, out_c):
        shutil.rmtree(p, ignore_errors=True)
    started = time.time()
    loads = []

    print(f"saving {a.gib} GiB on {a.ranks} ranks (distckpt)", flush=True)
    _, ld = launch("save-dckpt", a.ranks, ckpt, a.gib, rdv_dir=work)
    loads.append(ld)
    # One export first: its files give DCP the same fqn -> file mapping (and check the whole path once).
    launch("export", 1, ckpt, out_d, a.max_shard_size, a.buffer, a.threads, rdv_dir=work)
    with open(os.path.join(out_d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    mapping = {name: int(file.split("-")[1]) for name, file in index["weight_map"].items()}
    with open(mapping_path, "w") as f:
        json.dump(mapping, f)
    files = sorted(set(index["weight_map"].values()))
    nbytes = sum(os.path.getsize(os.path.join(out_d, f)) for f in files)
    tensor_bytes = index["metadata"]["total_size"]
    if not a.skip_dcp:
        print(f"saving the same state on {a.ranks} ranks (DCP, HuggingFaceStorageWriter)", flush=True)
        _, ld = launch("save-dcp", a.ranks, dcp_dir, a.gib, mapping_path, rdv_dir=work)
        loads.append(ld)

    cases = [("distckpt", 1), ("distckpt", a.ranks)]
    if not a.skip_dcp:
        cases += [("dcp", 1), ("dcp", a.ranks)]
    samples = {}  # (cache, what, world) -> list of dicts
    fio_samples = {}  # (cache, direct) -> list of MB/s
    for run in range(a.runs):
        for cache in caches:
            order = cases if run % 2 == 0 else cases[::-1]
            for what, world in order:
                src, out = (ckpt, out_d) if what == "distckpt" else (dcp_dir, out_c)
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(out)
                os.sync()
                (warm if cache == "warm" else evict)(src)
                if what == "distckpt":
                    res, ld = launch("export", world, ckpt, out, a.max_shard_size, a.buffer, a.threads, rdv_dir=work)
                else:
                    res, ld = launch("consolidate", world, dcp_dir, out, mapping_path, rdv_dir=work)
                loads.append(ld)
                sample = {"seconds": max(r["seconds"] for r in res),
                          "rss_peak_mib": max(r["rss_peak_kib"] for r in res) / 1024,
                          "rss_growth_mib": max(r["rss_peak_kib"] - r["rss_before_kib"] for r in res) / 1024,
                          "rss_before_mib": max(r["rss_before_kib"] for r in res) / 1024,
                          "load": ld}  # fmt: skip
                if what == "dcp":
                    sample["seconds_unsynced"] = max(r["seconds_unsynced"] for r in res)
                sample["mb_s"] = nbytes / sample["seconds"] / 1e6
                samples.setdefault((cache, what, world), []).append(sample)
                print(f"run {run} {cache} {what} x{world}: {sample['mb_s']:.0f} MB/s, {sample['seconds']:.2f} s, "
                      f"peak RSS {sample['rss_peak_mib']:.0f} MiB (+{sample['rss_growth_mib']:.0f}), "
                      f"load {ld[0]:.1f}->{ld[1]:.1f}", flush=True)  # fmt: skip
            for direct in (True, False):
                lb = os.getloadavg()[0]
                mbs = fio(os.path.join(work, "fio.dat"), nbytes, direct)
                loads.append((lb, os.getloadavg()[0]))
                fio_samples.setdefault((cache, direct), []).append(mbs)
                print(f"run {run} {cache} fio {'direct' if direct else 'buffered'}: {mbs:.0f} MB/s", flush=True)

    checked = compare_outputs(out_d, out_c) if not a.skip_dcp else 0
    report(a, work, files, nbytes, tensor_bytes, samples, fio_samples, loads, checked, caches, cases, started)
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)


def report(a, work, files, nbytes, tensor_bytes, samples, fio_samples, loads, checked, caches, cases, started):
    date = datetime.date.today().isoformat()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    dev = subprocess.run(["df", "--output=source", work], capture_output=True, text=True).stdout.split()[-1]
    fio_version = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "-"
    all_loads = [x for pair in loads for x in pair]
    lines = [
        "# Export to the Hugging Face hub format: distckpt vs fio and DCP's consolidation",
        "",
        f"{date}, {platform.node()}, {os.cpu_count()} CPUs, {mem_gib:.0f} GiB RAM, disk {dev}; {fio_version}, torch "
        f"{torch_version}. State: TinyLlama-like, {tensor_bytes / 2**30:.2f} GiB of tensors (bf16 matrices sharded "
        f"by rows or columns over {a.ranks} ranks, f32 norms replicated), exported as {len(files)} files of at most "
        f"{a.max_shard_size} ({nbytes / 1e6:.0f} MB with headers); distckpt buffer {a.buffer}; median of {a.runs} "
        f"interleaved runs. Load average (1 min) around the measurements: min {min(all_loads):.1f}, median "
        f"{med(all_loads):.1f}, max {max(all_loads):.1f} (the machine is shared; the figures are noisy).",
        "",
        "Every time is wall time to durable files (fsync'd; for DCP, which does not sync, the fsync of its files is "
        "added and the time without it shown too), the slowest rank for several ranks. Peak RSS is the largest "
        "process's; growth is its peak minus its RSS before the operation (after imports: torch's for DCP).",
        "",
    ]
    doc = {"date": date, "host": platform.node(), "cpus": os.cpu_count(), "mem_gib": mem_gib, "disk": dev,
           "fio": fio_version, "torch": torch_version, "ranks": a.ranks, "tensor_bytes": tensor_bytes,
           "file_bytes": nbytes, "files": len(files), "max_shard_size": a.max_shard_size, "buffer": a.buffer,
           "runs": a.runs, "load_avg_1min": {"min": min(all_loads), "median": med(all_loads), "max": max(all_loads)},
           "tensors_checked_equal_to_dcp": checked, "seconds_total": time.time() - started, "results": {}}  # fmt: skip
    for cache in caches:
        limit = [max(d, b) for d, b in zip(fio_samples[(cache, True)], fio_samples[(cache, False)])]
        title = f"## Source {cache}" + (" (in the page cache)" if cache == "warm" else " (evicted)")
        lines += [title, "",
                  "| what | processes | MB/s | seconds | x fio (limit) | x DCP same processes | peak RSS MiB | RSS growth "
                  "MiB |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        res = {"fio_direct_mb_s": fio_samples[(cache, True)], "fio_buffered_mb_s": fio_samples[(cache, False)]}
        for what, world in cases:
            s = samples[(cache, what, world)]
            mbs = [x["mb_s"] for x in s]
            # Ratios per round (the same round's fio and DCP), then the median: the disk's speed drifts.
            to_fio = [x / f for x, f in zip(mbs, limit)]
            row = {"mb_s": mbs, "seconds": [x["seconds"] for x in s], "x_fio": to_fio,
                   "rss_peak_mib": [x["rss_peak_mib"] for x in s], "rss_growth_mib": [x["rss_growth_mib"] for x in s],
                   "rss_before_mib": [x["rss_before_mib"] for x in s], "load": [x["load"] for x in s]}  # fmt: skip
            x_dcp = ""
            if what == "distckpt" and (cache, "dcp", world) in samples:
                d = samples[(cache, "dcp", world)]
                ratios = [x / y["mb_s"] for x, y in zip(mbs, d)]
                row["x_dcp"] = ratios
                x_dcp = f"{med(ratios):.2f}"
            if what == "dcp":
                row["seconds_unsynced"] = [x["seconds_unsynced"] for x in s]
            res[f"{what}_x{world}"] = row
            secs = f"{med(row['seconds']):.2f}"
            if what == "dcp":
                secs += f" ({med(row['seconds_unsynced']):.2f} unsynced)"
            lines.append(f"| {what} | {world} | {med(mbs):.0f} | {secs} | {med(to_fio):.2f} | {x_dcp} | "
                         f"{med(row['rss_peak_mib']):.0f} | {med(row['rss_growth_mib']):.0f} |")  # fmt: skip
        lines.append(f"| fio O_DIRECT / buffered | 1 | {med(fio_samples[(cache, True)]):.0f} / "
                     f"{med(fio_samples[(cache, False)]):.0f} | | 1 | | | |")  # fmt: skip
        lines.append("")
        doc["results"][cache] = res
    if checked:
        lines += [f"distckpt's files and DCP's hold the same {checked} tensors, equal byte for byte (checked with "
                  "safetensors' torch backend after the runs).", ""]  # fmt: skip
    lines += ["Raw samples: the .json beside this file. Command: `" + " ".join([os.path.relpath(sys.argv[0], ROOT)] +
                                                                               sys.argv[1:]) + "`", ""]  # fmt: skip
    text = "\n".join(lines)
    print(text)
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"{date}-export-{a.tag}")
    with open(base + ".md", "w") as f:
        f.write(text)
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    print("written to", os.path.relpath(base + ".md", ROOT), "and .json")


if __name__ == "__main__":
    main()
