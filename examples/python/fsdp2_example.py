"""FSDP2 without torch.distributed.checkpoint: ``distckpt.save`` / ``distckpt.load`` take the model and optimizer.

    python examples/python/fsdp2_example.py [DIR]

1. Two gloo ranks (spawned here with torch.multiprocessing; a file:// rendezvous in DIR) shard a small MLP with FSDP2
   (``fully_shard``) and train it two steps with Adam. Every parameter and every optimizer state tensor is a DTensor
   holding this rank's rows.
2. ``distckpt.save({"model": model, "optim": optim, "step": 2}, path, comm=distckpt.comm.from_torch())``: each rank
   writes its own shards, one collective commit. No ``get_state_dict``, no DCP.
3. Three ranks (another number of ranks: other shard boundaries) build the same model with other initial values,
   take one step so that Adam has state to fill, and ``distckpt.load`` the checkpoint into it: each rank reads only
   the rows it holds now, in place, then ``load_state_dict`` is called on the model and the optimizer.
4. Every rank gathers the full model and optimizer state and compares it with what the 2-rank job saved; one process
   without torch.distributed reads the checkpoint as a plain nested dict.

Prints "fsdp2 example OK" and exits 0, or raises.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import distckpt

DIM, HIDDEN = 16, 24


def build(seed: int, world: int):
    """The model, every Linear and the root sharded with FSDP2 over all ranks, and its Adam optimizer."""
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
    """Model and optimizer state as whole plain tensors (gathered), for the checks only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

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


def save_rank(rank: int, world: int, root: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{root}/rdzv-save", rank=rank, world_size=world)
    try:
        model, optim = build(seed=0, world=world)
        train(model, optim, steps=2, seed=1)
        assert type(next(model.parameters())).__name__ == "DTensor"
        summary = distckpt.save({"model": model, "optim": optim, "step": 2}, f"{root}/ckpt",
                                comm=distckpt.comm.from_torch())  # fmt: skip
        written = [None] * world
        dist.all_gather_object(written, summary.bytes_written)
        if rank == 0:
            print(f"saved on {world} ranks: bytes written per rank {written} of {summary.total_bytes}")
        full = full_state(model, optim)  # collective: every rank takes part
        if rank == 0:
            torch.save(full, f"{root}/expected.pt")
        # The last collective before the process exits holds no tensors Python made: torch's gloo thread releases
        # the all_gather's tensors (taking the GIL) after the call returns, and if that happens while the
        # interpreter shuts down the process aborts ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


def load_rank(rank: int, world: int, root: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{root}/rdzv-load", rank=rank, world_size=world)
    try:
        model, optim = build(seed=99, world=world)  # other values, other shard boundaries
        train(model, optim, steps=1, seed=3)  # Adam's state must exist to be filled (as with DCP)
        state = {"model": model, "optim": optim, "step": 0}
        distckpt.load(state, f"{root}/ckpt", comm=distckpt.comm.from_torch())
        assert state["step"] == 2, state["step"]
        want_model, want_optim = torch.load(f"{root}/expected.pt", weights_only=False)
        got_model, got_optim = full_state(model, optim)
        same(got_model, want_model, "model")
        same(got_optim, want_optim, "optim")
        train(model, optim, steps=1, seed=4)  # and training goes on
        if rank == 0:
            print(f"load on {world} ranks: model and optimizer state match")
    finally:
        dist.destroy_process_group()


def main(root: str) -> None:
    mp.spawn(save_rank, args=(2, root), nprocs=2)
    mp.spawn(load_rank, args=(3, root), nprocs=3)
    out = distckpt.load(None, f"{root}/ckpt")  # one process, no torch.distributed: numpy arrays and values
    assert out["step"] == 2 and out["model"]["0.weight"].shape == (HIDDEN, DIM)
    assert out["optim"]["state"][0]["exp_avg"].shape == (HIDDEN, DIM)
    print("fsdp2 example OK")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.makedirs(sys.argv[1], exist_ok=True)
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
