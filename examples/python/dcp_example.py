"""torch.distributed.checkpoint (DCP) with distckpt as its storage layer.

    python examples/python/dcp_example.py [DIR]

DCP's API stays (``dcp.save``, ``dcp.async_save``, ``dcp.load``, ``get_state_dict`` / ``set_state_dict``); only the
storage changes: ``storage_writer=distckpt.torch.StorageWriter(path)`` and
``storage_reader=distckpt.torch.StorageReader(path)`` instead of DCP's ``FileSystemWriter`` / ``FileSystemReader``.

1. Two gloo ranks (spawned here with torch.multiprocessing; file:// rendezvous in DIR) shard a small MLP with FSDP2
   and train it with Adam; ``dcp.save`` writes model, optimizer and two plain values through StorageWriter.
2. ``dcp.async_save`` writes a second checkpoint in the background, its collectives on a gloo group of its own (as
   DCP advises), while training goes on.
3. One process (a 1-rank job) loads the first checkpoint into a fresh FSDP2 model with ``dcp.load`` +
   ``set_state_dict`` and compares every value with the full state the 2-rank job had; it loads the async one too.
4. The checkpoint is an ordinary distckpt checkpoint: ``distckpt.load(None, path)`` reads it without torch.distributed
   (and the Rust, Go and C readers can). A key missing from it shows how DCP reports errors: CheckpointException.

Prints "dcp example OK" and exits 0, or raises.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

import distckpt
import distckpt.torch

DIM, HIDDEN = 16, 24


def build(seed: int, world: int):
    """An FSDP2 model (every Linear and the root sharded over all ranks) and its Adam optimizer."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                torch.nn.GELU(), torch.nn.Linear(HIDDEN, 5, bias=False))  # fmt: skip
    mesh = init_device_mesh("cpu", (world,))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train(model, optim, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        model(torch.randn(8, DIM, generator=g)).square().mean().backward()
        optim.step()
        optim.zero_grad()


def full_state(model, optim):
    """Model and optimizer state as whole plain tensors (gathered on every rank), for the checks only."""
    return get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True))


def same(a, b, where: str) -> None:
    if isinstance(b, dict):
        assert set(a) == set(b), (where, sorted(map(str, a)), sorted(map(str, b)))
        for k in b:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}.{i}")
    elif isinstance(b, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, (where, a, b)


def init(rank: int, world: int, rendezvous: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)


def save_rank(rank: int, world: int, root: str) -> None:
    init(rank, world, f"file://{root}/rdzv-save")
    try:
        model, optim = build(seed=0, world=world)
        train(model, optim, steps=2, seed=1)
        msd, osd = get_state_dict(model, optim)  # DTensors: this rank's shards
        state = {"model": msd, "optim": osd, "step": 2, "run": {"name": "demo", "lr": 1e-2}}
        writer = distckpt.torch.StorageWriter(f"{root}/ckpt")
        dcp.save(state, storage_writer=writer)
        print(f"rank {rank}: dcp.save wrote {writer.summary.bytes_written} of {writer.summary.total_bytes} bytes")
        full = full_state(model, optim)
        if rank == 0:
            torch.save(full, f"{root}/expected.pt")

        # async_save: DCP copies the state to host memory and writes it in the background while training goes on.
        # The save's collectives (DCP's and distckpt's) run on a group of their own, so they never interleave with
        # the training's collectives on the default group.
        group = dist.new_group(backend="gloo")
        writer = distckpt.torch.StorageWriter(f"{root}/ckpt-async", process_group=group)
        future = dcp.async_save(state, storage_writer=writer, process_group=group)
        train(model, optim, steps=1, seed=2)
        future.result()  # the async checkpoint holds the state as it was when async_save was called
        # DCP's own collectives (all_gather_object, ...) end the save; torch's gloo thread may release their tensors
        # during interpreter shutdown, which aborts the process. A barrier holds no tensors made in Python. (distckpt's
        # own collectives need nothing of the kind: distckpt holds their tensors until torch lets go.)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def load_one_rank(rank: int, root: str) -> None:
    init(rank, 1, f"file://{root}/rdzv-load")
    try:
        for name, expected in (("ckpt", "expected.pt"), ("ckpt-async", "expected.pt")):
            model, optim = build(seed=99, world=1)  # other values, another number of ranks
            train(model, optim, steps=1, seed=3)  # so the optimizer has state to overwrite
            msd, osd = get_state_dict(model, optim)
            state = {"model": msd, "optim": osd, "step": -1, "run": {"name": "", "lr": 0.0}}  # DCP fills leaves
            dcp.load(state, storage_reader=distckpt.torch.StorageReader(f"{root}/{name}"))
            set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
            assert state["step"] == 2 and state["run"] == {"name": "demo", "lr": 1e-2}, state["run"]
            want_model, want_optim = torch.load(f"{root}/{expected}", weights_only=False)
            got_model, got_optim = full_state(model, optim)
            same(got_model, want_model, f"{name}: model")
            same(got_optim, want_optim, f"{name}: optim")
            print(f"{name}: loaded on 1 rank, model and optimizer state match")

        # Errors: DCP runs the storage layer on every rank and wraps what any rank raised in CheckpointException,
        # which derives from BaseException (not Exception): catch it by name.
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            dcp.load({"no_such_key": torch.zeros(3)}, storage_reader=distckpt.torch.StorageReader(f"{root}/ckpt"))
        except CheckpointException as e:
            assert not isinstance(e, Exception)
            print("a missing key raises CheckpointException:", str(e).splitlines()[0][:100])
        else:
            raise AssertionError("expected CheckpointException")
    finally:
        dist.destroy_process_group()


def main(root: str) -> None:
    mp.spawn(save_rank, args=(2, root), nprocs=2)
    mp.spawn(load_one_rank, args=(root,), nprocs=1)

    # An ordinary distckpt checkpoint: DCP's names, the nesting of the state dict, objects stored as JSON.
    out = distckpt.load(None, f"{root}/ckpt")
    assert out["step"] == 2 and out["run"] == {"name": "demo", "lr": 1e-2}
    assert out["model"]["0.weight"].shape == (HIDDEN, DIM)
    with distckpt.open(f"{root}/ckpt") as r:
        names = sorted(r.metadata)
        assert "model.0.weight" in names and "optim.state.0.weight.exp_avg" in names, names
    print(f"{len(names)} entries, e.g. {names[:3]}")
    print("dcp example OK")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.makedirs(sys.argv[1], exist_ok=True)
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
