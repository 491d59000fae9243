"""Worker processes for the DCP plugin tests: torch.distributed over gloo on CPU, FSDP2 (fully_shard) models, and
torch.distributed.checkpoint with distckpt's StorageWriter / StorageReader. Spawned, so they live in a module."""

from __future__ import annotations

import os

DIM, HIDDEN, LAYERS = 16, 24, 3


def _init(rank, world, rendezvous):
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)


def _model(seed):
    import torch

    torch.manual_seed(seed)
    layers = []
    for i in range(LAYERS):
        layers += [torch.nn.Linear(DIM if i == 0 else HIDDEN, HIDDEN), torch.nn.GELU()]
    layers.append(torch.nn.Linear(HIDDEN, 5, bias=False))
    return torch.nn.Sequential(*layers)


def _fsdp(seed, world):
    """An FSDP2 model (every Linear and the root sharded over all ranks) and its Adam optimizer."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _model(seed)
    mesh = init_device_mesh("cpu", (world,))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optim


def _train(model, optim, steps, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, DIM, generator=g)
        model(x).square().mean().backward()
        optim.step()
        optim.zero_grad()


def _full(model, optim):
    """The whole model and optimizer state as plain tensors (gathered; every rank gets it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True))


def save_fsdp_rank(rank, world, rendezvous, path, async_path, expected_file):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import distckpt.torch

    _init(rank, world, rendezvous)
    try:
        model, optim = _fsdp(seed=0, world=world)
        _train(model, optim, steps=2, seed=1)
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd, "step": 2, "note": "fsdp2"}
        dcp.save(state, storage_writer=distckpt.torch.StorageWriter(path))
        full = _full(model, optim)
        if rank == 0:
            torch.save({"model": full[0], "optim": full[1]}, expected_file)
        # async_save: DCP stages to host, then writes in the background while training goes on, so the save's
        # collectives (DCP's and distckpt's) run on a group of their own, as DCP advises.
        group = dist.new_group(backend="gloo")
        writer = distckpt.torch.StorageWriter(async_path, process_group=group)
        future = dcp.async_save(state, storage_writer=writer, process_group=group)
        _train(model, optim, steps=1, seed=2)
        future.result()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def load_fsdp_rank(rank, world, rendezvous, path, expected_file):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import distckpt.torch

    _init(rank, world, rendezvous)
    try:
        model, optim = _fsdp(seed=99, world=world)  # other initial values, another number of ranks
        _train(model, optim, steps=1, seed=3)  # so the optimizer has state to overwrite
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd, "step": -1, "note": ""}
        dcp.load(state, storage_reader=distckpt.torch.StorageReader(path))
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        assert state["step"] == 2 and state["note"] == "fsdp2", (state["step"], state["note"])
        got = _full(model, optim)
        ex = torch.load(expected_file, weights_only=False)
        _assert_equal(got[0], ex["model"], "model")
        _assert_equal(got[1], ex["optim"], "optim")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _assert_equal(got, ex, where):
    import torch

    if isinstance(ex, dict):
        assert isinstance(got, dict) and set(got) == set(ex), (where, sorted(map(str, got)), sorted(map(str, ex)))
        for k in ex:
            _assert_equal(got[k], ex[k], f"{where}.{k}")
    elif isinstance(ex, (list, tuple)):
        assert len(got) == len(ex), where
        for i, (a, b) in enumerate(zip(got, ex)):
            _assert_equal(a, b, f"{where}.{i}")
    elif isinstance(ex, torch.Tensor):
        assert torch.equal(got.cpu(), ex.cpu()), where
    else:
        assert got == ex, (where, got, ex)
