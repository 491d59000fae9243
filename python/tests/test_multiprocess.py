"""Several processes over the Gloo communicator: 3 ranks save, 2 ranks load with different shardings.

Workers are spawned (multiprocessing "spawn") and talk over loopback with a file:// rendezvous in the test's
temporary directory. Every wait is bounded, so a failure cannot hang pytest.
"""

from __future__ import annotations


import numpy as np
import pytest

import _workers
import distckpt

DEADLINE = 180  # seconds for a whole group of workers


def run_ranks(fn, world, *args):
    _workers.spawn(_workers.run, world, lambda rank, results: (fn, rank, (world, *args), results), DEADLINE)


def test_three_ranks_save_two_ranks_load_resharded(tmp_path):
    path, async_path = str(tmp_path / "ckpt"), str(tmp_path / "ckpt_async")
    run_ranks(_workers.save_rank, 3, f"file://{tmp_path}/rdv_save", path, async_path)
    run_ranks(_workers.load_rank, 2, f"file://{tmp_path}/rdv_load", path)
    ex = _workers.expected()
    # The async save holds the values from before each rank scribbled over its arrays.
    for p in (path, async_path):
        out = distckpt.load(None, p)
        np.testing.assert_array_equal(out["model"]["w"], ex["w"])
        np.testing.assert_array_equal(out["model"]["bias"], ex["bias"])
        np.testing.assert_array_equal(out["model"]["emb"], ex["emb"])
        np.testing.assert_array_equal(out["model"]["f16"], ex["f16"])
    with distckpt.open(path) as r:
        assert len(r.metadata["model.w"].chunks) == 3  # one row slab per saving rank
        assert len(r.metadata["model.bias"].chunks) == 1  # the replica, written once


def test_fanout_always_loads_the_replicas_exactly(tmp_path):
    # Every rank needs the replicated bias and the whole f16: with fanout="always" those bytes are read by one rank
    # each and exchanged over Gloo; load_rank checks every value.
    path, async_path = str(tmp_path / "ckpt"), str(tmp_path / "ckpt_async")
    run_ranks(_workers.save_rank, 3, f"file://{tmp_path}/rdv_save", path, async_path)
    run_ranks(_workers.load_rank, 2, f"file://{tmp_path}/rdv_load", path, "always")
    with pytest.raises(distckpt.InvalidArgumentError, match="fanout"):
        distckpt.load(None, path, fanout="sometimes")


def test_a_rank_that_fails_before_saving_aborts_the_others_at_once(tmp_path):
    run_ranks(_workers.local_error_save, 3, f"file://{tmp_path}/rdv", str(tmp_path / "ckpt"))
    with pytest.raises(distckpt.NotFoundError):
        distckpt.open(tmp_path / "ckpt")


def test_a_rank_that_never_saves_fails_the_others_in_time(tmp_path):
    run_ranks(_workers.absent_rank_save, 3, f"file://{tmp_path}/rdv", str(tmp_path / "ckpt"))
    with pytest.raises(distckpt.NotFoundError):
        distckpt.open(tmp_path / "ckpt")
