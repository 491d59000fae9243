"""The peers' side of bench/run: torch.distributed.checkpoint (CPU path, gloo) and safetensors.

Multi-rank modes run one process per rank (bench/driver.py sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) on a
gloo process group; every rank builds the state of bench/spec.py (DTensors: Shard(0) for sharded tensors and
Replicate() for replicated ones when saving; Shard(1) / Shard(0) when loading on another world size), all ranks
start together after a barrier, and the figure is the slowest rank's. Rank 0 prints one line "RESULT {json}".

  dcp-save   --spec S --dir D --threads N     dcp.save with FileSystemWriter(thread_count=N, sync_files=True)
  dcp-load   --spec S --dir D                 dcp.load, resharded (the checkpoint of dcp-save)
  dcp-async  --spec S --dir D                 dcp.async_save: stall (until it returns) and total
  st-save    --spec S --dir D                 safetensors save_file of the whole state + fsync, one process
  st-load    --dir D                          safetensors load_file of that file, one process
  st-view    --file F [--cold]                safe_open + get_tensor of a 1-tensor file: first element, full sum
  st-model   --file F --backend B [--cold]    load_file(backend=mmap|pread) of a whole model, then one byte of
                                              every 4 KiB page of every tensor read (what makes it resident)
  dcp-plan   --ranks R --tensors T --dir D    DCP global save planning of plan_scale's layout; .metadata pickle
"""

import argparse
import json
import os
import pickle
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec as specmod  # noqa: E402

import torch  # noqa: E402

DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32}


def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def result(d):
    print("RESULT " + json.dumps(d), flush=True)


def drop_file_cache(path):
    """Evicts a file's clean pages (posix_fadvise DONTNEED): no root needed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- distributed (DCP) --------------------------------------------------------------------------------------------

def init_dist():
    import torch.distributed as dist
    dist.init_process_group("gloo")
    return dist, dist.get_rank(), dist.get_world_size()


def make_state(entries, world, rank, saving):
    from torch.distributed.tensor import DTensor, Replicate, Shard, init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    sd = {}
    nbytes = 0
    for e in entries:
        name, dtype, rep, shape = e
        off, ln = specmod.save_box(e, world, rank) if saving else specmod.load_box(e, world, rank)
        local = torch.empty(ln, dtype=DTYPES[dtype])
        local.fill_(1.0 + rank if saving else 0.0)  # touch every page before the baseline RSS
        nbytes += local.numel() * local.element_size()
        if saving:
            placements = [Replicate()] if rep else [Shard(0)]
        else:
            placements = [Shard(0)] if rep else [Shard(len(shape) - 1)]
        stride = torch.empty(shape, dtype=torch.uint8, device="meta").stride()
        sd[name] = DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(shape),
                                      stride=stride)
    return sd, nbytes


def gather_max(dist, x):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, x)
    return out


def dcp_save(args):
    import torch.distributed.checkpoint as dcp
    dist, rank, world = init_dist()
    sd, held = make_state(specmod.read_spec(args.spec), world, rank, True)
    path = os.path.join(args.dir, "ckpt")
    base = rss_now()
    dist.barrier()
    t0 = time.perf_counter()
    writer = dcp.FileSystemWriter(path, single_file_per_rank=True, sync_files=True, thread_count=args.threads)
    dcp.save(sd, storage_writer=writer)
    dt = time.perf_counter() - t0
    secs = gather_max(dist, dt)
    peaks = gather_max(dist, rss_peak())
    bases = gather_max(dist, base)
    helds = gather_max(dist, held)
    if rank == 0:
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        result({"mode": "dcp-save", "threads": args.threads, "seconds": max(secs), "bytes_on_disk": size,
                "rank_seconds": secs, "rss_peak": peaks, "rss_base": bases, "state_bytes": helds})
    dist.destroy_process_group()


def dcp_load(args):
    import torch.distributed.checkpoint as dcp
    dist, rank, world = init_dist()
    sd, held = make_state(specmod.read_spec(args.spec), world, rank, False)
    path = os.path.join(args.dir, "ckpt")
    base = rss_now()
    dist.barrier()
    t0 = time.perf_counter()
    dcp.load(sd, storage_reader=dcp.FileSystemReader(path))
    dt = time.perf_counter() - t0
    # Saving rank r filled its rows with 1 + r; a replicated tensor was written by one of the ranks: any of those
    # values is right, but never the 0.0 the destination started with.
    bad = sum(int((v.to_local() == 0).any()) for v in sd.values() if v.to_local().numel())
    secs = gather_max(dist, dt)
    peaks = gather_max(dist, rss_peak())
    bases = gather_max(dist, base)
    helds = gather_max(dist, held)
    bads = gather_max(dist, bad)
    if rank == 0:
        result({"mode": "dcp-load", "seconds": max(secs), "bytes": sum(helds), "bad": sum(bads), "rank_seconds": secs,
                "rss_peak": peaks, "rss_base": bases, "state_bytes": helds})
    dist.destroy_process_group()


def dcp_async(args):
    import torch.distributed.checkpoint as dcp
    dist, rank, world = init_dist()
    sd, held = make_state(specmod.read_spec(args.spec), world, rank, True)
    path = os.path.join(args.dir, "ckpt")
    # A separate gloo group for the checkpoint, as DCP's documentation recommends for async_save.
    ckpt_pg = dist.new_group(backend="gloo")

    # One stager for both saves: DCP's DefaultStager (CPU options: no pinned or shared memory, which need CUDA)
    # caches the staged storages, so that the second save is DCP's steady state, as the second distckpt save is
    # distckpt's. (FileSystemWriter's cache_staged_state_dict pins memory, which needs a GPU.)
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False, use_async_staging=False,
                                          use_non_blocking_copy=False))

    def one(where):
        writer = dcp.FileSystemWriter(where, single_file_per_rank=True, sync_files=True, thread_count=args.threads)
        dist.barrier()
        t0 = time.perf_counter()
        fut = dcp.async_save(sd, storage_writer=writer, process_group=ckpt_pg, async_stager=stager)
        stall = time.perf_counter() - t0
        if hasattr(fut, "upload_completion"):  # AsyncSaveResponse (zero-overhead staging)
            fut.staging_completion.result()
            stall = time.perf_counter() - t0
            fut = fut.upload_completion
        fut.result()
        return stall, time.perf_counter() - t0

    base = rss_now()
    first_stall, first_total = one(path + "-first")
    stall, total = one(path)
    stager.close()
    first_stalls = gather_max(dist, first_stall)
    first_totals = gather_max(dist, first_total)
    stalls = gather_max(dist, stall)
    totals = gather_max(dist, total)
    peaks = gather_max(dist, rss_peak())
    bases = gather_max(dist, base)
    helds = gather_max(dist, held)
    if rank == 0:
        result({"mode": "dcp-async", "threads": args.threads, "stall": max(stalls), "total": max(totals),
                "first_stall": max(first_stalls), "first_total": max(first_totals),
                "rank_stall": stalls, "rss_peak": peaks, "rss_base": bases, "state_bytes": helds})
    dist.destroy_process_group()


# ---- safetensors --------------------------------------------------------------------------------------------------

def st_save(args):
    from safetensors.torch import save_file
    entries = specmod.read_spec(args.spec)
    sd = {}
    for name, dtype, _, shape in entries:
        sd[name] = torch.empty(shape, dtype=DTYPES[dtype]).fill_(1.0)
    path = os.path.join(args.dir, "model.safetensors")
    base = rss_now()
    t0 = time.perf_counter()
    save_file(sd, path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    dt = time.perf_counter() - t0
    result({"mode": "st-save", "seconds": dt, "bytes": os.path.getsize(path), "rss_peak": [rss_peak()],
            "rss_base": [base]})


def st_load(args):
    from safetensors.torch import load_file
    path = os.path.join(args.dir, "model.safetensors")
    t0 = time.perf_counter()
    sd = load_file(path)
    # load_file may hand back tensors over a lazily read mapping: touch every byte so the figure is a full read.
    s = 0.0
    for v in sd.values():
        s += float(v.reshape(-1).view(torch.uint8)[::4096].sum()) if v.numel() else 0.0
    dt = time.perf_counter() - t0
    result({"mode": "st-load", "seconds": dt, "bytes": os.path.getsize(path), "rss_peak": [rss_peak()]})


def st_view(args):
    from safetensors import safe_open
    if args.cold:
        drop_file_cache(args.file)
    t0 = time.perf_counter()
    with safe_open(args.file, framework="pt") as f:
        name = next(iter(f.keys()))
        t = f.get_tensor(name)
        first = float(t.view(-1)[0])
        t_first = time.perf_counter() - t0
        total = float(t.sum())
        t_full = time.perf_counter() - t0
    result({"mode": "st-view", "first": t_first, "full": t_full, "bytes": t.numel() * 4, "check": first + total})


def st_model(args):
    """(g): a whole model loaded as a server does before serving, by safetensors' own loader. With the default mmap
    backend load_file returns tensors over a lazy mapping, so the figure includes reading one byte of every page of
    every tensor (as model_bench.rs does after its loads): until then nothing has been read. The pread backend reads
    every tensor into memory in load_file; the same touch follows (it finds the bytes resident)."""
    from safetensors.torch import load_file
    if args.cold:
        drop_file_cache(args.file)
    t0 = time.perf_counter()
    sd = load_file(args.file, backend=args.backend)
    check = 0
    nbytes = 0
    for v in sd.values():
        b = v.reshape(-1).view(torch.uint8)
        nbytes += b.numel()
        check += int(b[::4096].sum(dtype=torch.int64)) if b.numel() else 0
    dt = time.perf_counter() - t0
    result({"mode": "st-model", "backend": args.backend, "seconds": dt, "bytes": nbytes, "check": check,
            "cold": args.cold})


def st_make_view_file(args):
    from safetensors.torch import save_file
    n = (args.gib << 30) // 4
    t = (torch.arange(n, dtype=torch.int64) % 1024).to(torch.float32).reshape(n // 1024, 1024)
    save_file({"weight": t}, args.file)
    fd = os.open(args.file, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    result({"mode": "st-make-view-file", "bytes": os.path.getsize(args.file)})


# ---- metadata scale (DCP planning + pickle) ------------------------------------------------------------------------

def plan_scale_layout(ranks, tensors):
    """bench/plan_scale's layout (MakePlans there) as DCP SavePlans: the same tensors, boxes and bytes entries."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import (BytesIOWriteData, SavePlan, TensorWriteData, WriteItem,
                                                      WriteItemType)
    props = {k: TensorProperties(dtype=v) for k, v in DTYPES.items()}
    plans = []
    for r in range(ranks):
        items = []
        for i in range(tensors):
            layer = "model.layers.%d." % (i // 10)
            width = 1024 << (i % 3)
            k = i % 10
            if k in (0, 2, 4, 6):
                rows = 1 + i % 5
                name, dt, shape = layer + "mlp.proj_%d.weight" % k, "BF16", (rows * ranks, width)
                off, size, kind = (rows * r, 0), (rows, width), WriteItemType.SHARD
            elif k == 8:
                name, dt, shape = layer + "attn.o_proj.weight", "BF16", (width, 4 * ranks)
                off, size, kind = (0, 4 * r), (width, 4), WriteItemType.SHARD
            else:
                name, dt, shape = layer + "norm_%d.weight" % k, "F32", (width,)
                off, size, kind = (0,), (width,), WriteItemType.TENSOR
            items.append(WriteItem(
                index=MetadataIndex(name, torch.Size(off)), type=kind,
                tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(offsets=torch.Size(off),
                                                                       sizes=torch.Size(size)),
                                            properties=props[dt], size=torch.Size(shape))))
        items.append(WriteItem(index=MetadataIndex("rng_state.%d" % r), type=WriteItemType.BYTE_IO,
                               bytes_io_data=BytesIOWriteData(nbytes=5056)))
        items.append(WriteItem(index=MetadataIndex("trainer_state"), type=WriteItemType.BYTE_IO,
                               bytes_io_data=BytesIOWriteData(nbytes=1 << 20)))
        plans.append(SavePlan(items))
    return plans


def dcp_plan(args):
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    t0 = time.perf_counter()
    plans = plan_scale_layout(args.ranks, args.tensors)
    build = time.perf_counter() - t0
    planner = DefaultSavePlanner(flatten_state_dict=False)
    t0 = time.perf_counter()
    global_plan, metadata = planner.create_global_plan(plans)
    plan_s = time.perf_counter() - t0
    chunks = sum(len(v.chunks) for v in metadata.state_dict_metadata.values() if hasattr(v, "chunks"))
    # What FileSystemWriter.finish stores: where every written item lives.
    storage = {}
    for r, p in enumerate(global_plan):
        off = 0
        for item in p.items:
            n = item.tensor_storage_size() or (item.bytes_io_data.nbytes if item.bytes_io_data else 0)
            storage[item.index] = _StorageInfo(relative_path="__%d_0.distcp" % r, offset=off, length=n)
            off += n
    metadata.storage_data = storage
    path = os.path.join(args.dir, ".metadata")
    with open(path, "wb") as f:
        pickle.dump(metadata, f)
    size = os.path.getsize(path)
    lookup = "model.layers.%d.attn.o_proj.weight" % (args.tensors // 20)
    loads = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            md = pickle.load(f)
        _ = md.state_dict_metadata[lookup].chunks
        loads.append(time.perf_counter() - t0)
        del md
    result({"mode": "dcp-plan", "build": build, "plan": plan_s, "chunks": chunks, "metadata_bytes": size,
            "open_lookup": loads})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode")
    ap.add_argument("--spec")
    ap.add_argument("--dir")
    ap.add_argument("--file")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--tensors", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gib", type=int, default=1)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--backend", default="mmap")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    {"dcp-save": dcp_save, "dcp-load": dcp_load, "dcp-async": dcp_async, "st-save": st_save, "st-load": st_load,
     "st-view": st_view, "st-model": st_model, "st-make-view-file": st_make_view_file, "dcp-plan": dcp_plan}[args.mode](args)


if __name__ == "__main__":
    main()
