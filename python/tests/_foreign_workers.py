"""Worker processes of test_foreign.py (spawned, so they live in an importable module)."""

from __future__ import annotations

import numpy as np


def hub_load_rank(rank, world, rendezvous, hub, expected_path):
    """Loads row shards of every tensor of a safetensors hub directory, read in place, and checks them."""
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
