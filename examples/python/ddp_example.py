"""DDP: every rank saves, each replicated tensor is written once; load on any number of processes.

    python examples/python/ddp_example.py [DIR]

The usual DDP checkpoint is ``if rank == 0: torch.save(model.state_dict(), path)``: one rank serialises everything
while the others wait. Here:

1. Two gloo ranks (spawned with torch.multiprocessing; file:// rendezvous in DIR) train a small DDP model with
   AdamW. Every rank holds the same (replicated) parameters and optimizer state.
2. Every rank calls ``distckpt.save({"model": ddp.module, "optim": optim, "step": 3}, path,
   comm=distckpt.comm.from_torch())``. distckpt sees that all ranks hold the same tensors, writes each once, and
   splits the writing among the ranks: the ``bytes_written`` of the ranks add up to the checkpoint's ``total_bytes``
   (one copy), not twice it.
3. The checkpoint is loaded by three ranks (another DDP job) and by one plain process without torch.distributed
   into a plain ``nn.Module`` and optimizer; both compare every value with what was saved.

Prints "ddp example OK" and exits 0, or raises.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import distckpt


def build(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4))  # fmt: skip
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model, optim, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 4, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optim.step()
    optim.zero_grad()


def check(model, optim, root: str) -> None:
    want = torch.load(f"{root}/expected.pt", weights_only=True)
    for k, v in want["model"].items():
        assert torch.equal(model.state_dict()[k], v), k
    got = optim.state_dict()
    assert got["param_groups"][0]["lr"] == want["optim"]["param_groups"][0]["lr"]
    for i, s in want["optim"]["state"].items():
        for name, v in s.items():
            assert torch.equal(got["state"][i][name], v), (i, name)


def init(rank: int, world: int, rendezvous: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)


def save_rank(rank: int, world: int, root: str) -> None:
    init(rank, world, f"file://{root}/rdzv-save")
    try:
        model, optim = build(seed=0)
        ddp = DDP(model)
        for i in range(3):
            step(ddp, optim, seed=10 * i + rank)  # each rank its own batch; DDP averages the gradients
        summary = distckpt.save({"model": ddp.module, "optim": optim, "step": 3}, f"{root}/ckpt",
                                comm=distckpt.comm.from_torch())  # fmt: skip
        with open(f"{root}/written-{rank}", "w") as f:  # checked by main() once every rank is done
            print(summary.bytes_written, summary.total_bytes, file=f)
        if rank == 0:
            torch.save({"model": model.state_dict(), "optim": optim.state_dict()}, f"{root}/expected.pt")
    finally:
        dist.destroy_process_group()


def load_rank(rank: int, world: int, root: str) -> None:
    init(rank, world, f"file://{root}/rdzv-load")
    try:
        model, optim = build(seed=99)
        step(model, optim, seed=5)  # AdamW's state must exist to be filled in place
        ddp = DDP(model)
        state = {"model": ddp.module, "optim": optim, "step": 0}
        distckpt.load(state, f"{root}/ckpt", comm=distckpt.comm.from_torch())
        assert state["step"] == 3
        check(model, optim, root)
        if rank == 0:
            print(f"loaded on {world} ranks: values match")
    finally:
        dist.destroy_process_group()


def main(root: str) -> None:
    mp.spawn(save_rank, args=(2, root), nprocs=2)
    counts = [open(f"{root}/written-{rank}").read().split() for rank in range(2)]
    written, total = [int(w) for w, _ in counts], int(counts[0][1])
    print(f"bytes written per rank: {written}; sum {sum(written)}; checkpoint data: {total}")
    assert sum(written) == total, "replicated tensors must be written once"
    assert all(w > 0 for w in written), "every rank takes a share of the writing"
    mp.spawn(load_rank, args=(3, root), nprocs=3)
    # One process, no torch.distributed, no DDP wrapper: the names are the module's own ("0.weight", no "module.").
    model, optim = build(seed=7)
    step(model, optim, seed=5)
    state = {"model": model, "optim": optim, "step": 0}
    distckpt.load(state, f"{root}/ckpt")
    assert state["step"] == 3
    check(model, optim, root)
    print("loaded in one process: values match")
    print("ddp example OK")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.makedirs(sys.argv[1], exist_ok=True)
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
