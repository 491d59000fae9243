"""An FSDP2 job that checkpoints every step with ``distckpt.CheckpointManager``, loses a node, and resumes on three
ranks.

    python examples/python/manager_torch_example.py [DIR]

1. Two gloo ranks on two simulated nodes (a node-local tier directory and a node id each, under DIR) shard a small
   MLP with FSDP2 (``fully_shard``) and train it with Adam. Every step, ``mgr.save(step, {"model": model, "optim":
   optim, "step": step})`` returns once each rank's shards are copied; the core writes each rank's part to its node's
   tier, replicates it to the other node, and persists every third step as an ordinary checkpoint.
2. Node 1 is lost: its rank ends and its tier is deleted.
3. The job restarts on three ranks: node 0 and two new, empty nodes. ``mgr.restore(state)`` finds the newest step
   whose every part is somewhere (node 0 holds its own part and the replica of node 1's), the new ranks get their
   bytes from node 0, and every rank reads only the rows it holds now. Model and optimizer state are compared with
   what the 2-rank job had, and training goes on.

Prints "manager torch example OK" and exits 0, or raises.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import distckpt

DIM, HIDDEN = 16, 24
STEPS, PERSIST_EVERY = 5, 3


def build(seed: int, world: int):
    """The model, every Linear and the root sharded with FSDP2 over all ranks, and its Adam optimizer."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, 5, bias=False))
    mesh = init_device_mesh("cpu", (world,))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model, optim, seed: int) -> None:
    x = torch.randn(8, DIM, generator=torch.Generator().manual_seed(seed))
    model(x).square().mean().backward()
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


def open_manager(root: str, node: int, replicas: int = 1) -> distckpt.CheckpointManager:
    # from_torch(): the manager runs its collectives on a gloo group of its own with the same ranks (made here).
    return distckpt.CheckpointManager(
        distckpt.comm.from_torch(),
        local_dir=f"{root}/node{node}",  # on a real cluster: the default, /dev/shm/distckpt-<job>
        node_id=f"node{node}",  # on a real cluster: the default, the host name
        replicas=replicas,
        persistent=f"{root}/persistent",
        persist_every=PERSIST_EVERY,
    )


def job_rank(rank: int, world: int, root: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{root}/rdzv-job", rank=rank, world_size=world)
    try:
        model, optim = build(seed=0, world=world)
        with open_manager(root, node=rank) as mgr:  # one rank per node here
            for step in range(1, STEPS + 1):
                train_step(model, optim, seed=step)
                mgr.save(step, {"model": model, "optim": optim, "step": step})
            mgr.wait_until_finished()
            if rank == 0:
                print(f"job on {world} ranks: saved steps 1..{STEPS}; newest complete step {mgr.latest_step()}")
        full = full_state(model, optim)  # collective: every rank takes part
        if rank == 0:
            torch.save(full, f"{root}/expected.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def resume_rank(rank: int, world: int, root: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{root}/rdzv-resume", rank=rank, world_size=world)
    try:
        model, optim = build(seed=99, world=world)  # other values, other shard boundaries
        train_step(model, optim, seed=1000)  # Adam's state must exist to be filled (as with DCP)
        state = {"model": model, "optim": optim, "step": 0}
        node = [0, 2, 3][rank]  # node 0 survived; nodes 2 and 3 are new (empty tiers)
        with open_manager(root, node=node) as mgr:
            result = mgr.restore(state)
            print(f"rank {rank} (node{node}): restored step {result.step} from the {result.tier} tier: "
                  f"{result.bytes_local} bytes local, {result.bytes_from_peers} from peers")  # fmt: skip
            assert result.step == STEPS and state["step"] == STEPS, result
            assert result.bytes_from_persistent == 0, result
            if rank == 0:
                print(result.report.strip())
            want_model, want_optim = torch.load(f"{root}/expected.pt", weights_only=False)
            got_model, got_optim = full_state(model, optim)
            same(got_model, want_model, "model")
            same(got_optim, want_optim, "optim")
            train_step(model, optim, seed=STEPS + 1)  # and training goes on, checkpointing as before
            mgr.save(STEPS + 1, {"model": model, "optim": optim, "step": STEPS + 1})
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(root: str) -> None:
    mp.spawn(job_rank, args=(2, root), nprocs=2)
    shutil.rmtree(f"{root}/node1")  # node 1 is lost, and its /dev/shm with it
    mp.spawn(resume_rank, args=(3, root), nprocs=3)
    # Persisted steps are ordinary checkpoints: one process without torch.distributed reads one as a plain dict.
    out = distckpt.load(None, f"{root}/persistent/step-{PERSIST_EVERY:010d}")
    assert out["step"] == PERSIST_EVERY and out["model"]["0.weight"].shape == (HIDDEN, DIM)
    print("manager torch example OK")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.makedirs(sys.argv[1], exist_ok=True)
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
