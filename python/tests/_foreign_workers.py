"""Worker processes of test_foreign.py (spawned, so they live in an importable module)."""

from __future__ import annotations

import numpy as np


def hub_load_rank(rank, world, rendezvous, hub, expected_path, fanout="auto"):
    """Loads row shards of every tensor of a safetensors hub directory, read in place, and checks them; with
    fanout="always" every rank also loads the whole of every tensor, the bytes read once and fanned out."""
    import distckpt
    from _workers import split

    expected = dict(np.load(expected_path))
    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=60) as comm:
        state = {}
        for name, full in expected.items():
            lo, hi = split(full.shape[0], world, rank)
            state[name] = distckpt.Shard(
                np.zeros((hi - lo,) + full.shape[1:], full.dtype), full.shape, (lo,) + (0,) * (full.ndim - 1)
            )
        distckpt.load(state, hub, comm=comm, timeout=60)
        for name, full in expected.items():
            lo, hi = split(full.shape[0], world, rank)
            np.testing.assert_array_equal(state[name].data, full[lo:hi], err_msg=name)
        with distckpt.open(hub, comm=comm, timeout=60) as r:
            assert r.metadata.format == "safetensors"
        if fanout == "always":
            whole = {name: np.zeros_like(full) for name, full in expected.items()}
            distckpt.load(whole, hub, comm=comm, timeout=60, fanout="always")
            for name, full in expected.items():
                np.testing.assert_array_equal(whole[name], full, err_msg=name)


def dcp_save_rank(rank, world, rendezvous_file, path):
    """An FSDP2 model with Adam, two steps on CPU gloo, saved by the real torch.distributed.checkpoint."""
    import os

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{rendezvous_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 7), torch.nn.Linear(7, 2))
        model[0].to(torch.bfloat16)
        mesh = init_device_mesh("cpu", (world,))
        for m in model:
            fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optim = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(2):
            x = model[0](torch.randint(0, 11, (4,))).float()
            model[2](model[1](x)).square().mean().backward()
            optim.step()
            optim.zero_grad()
        msd, osd = get_state_dict(model, optim)
        dcp.save({"model": msd, "optim": osd, "step": 2, "note": f"{world} ranks"}, checkpoint_id=path)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def dcp_load_rank(rank, world, rendezvous, path, expected_path):
    """Loads row shards of every tensor of a DCP checkpoint, read in place by distckpt, and checks them."""
    import torch

    import distckpt
    from _workers import split

    expected = torch.load(expected_path)
    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=60) as comm:
        state = {}
        for name, full in expected.items():
            if full.ndim == 0:
                state[name] = torch.empty((), dtype=full.dtype)
                continue
            lo, hi = split(full.shape[0], world, rank)
            local = torch.empty((hi - lo,) + tuple(full.shape[1:]), dtype=full.dtype)
            state[name] = distckpt.Shard(local, tuple(full.shape), (lo,) + (0,) * (full.ndim - 1))
        distckpt.load(state, path, comm=comm, timeout=60)
        for name, full in expected.items():
            got = state[name] if full.ndim == 0 else state[name].data
            lo, hi = (0, 1) if full.ndim == 0 else split(full.shape[0], world, rank)
            want = full if full.ndim == 0 else full[lo:hi]
            assert torch.equal(got, want), name
