"""distckpt.CheckpointManager: a checkpoint every step, in tiers (docs/manager.md).

The multi-rank cases run real processes (multiprocessing "spawn") over Gloo on loopback, with several nodes simulated
on this machine (a local tier directory and a node_id per node, _manager_workers.py). A node is lost by ending its
processes with os._exit (nothing closed) and deleting its local directory; restores run in a fresh group of
processes. Local tiers live under pytest's tmp_path, never /dev/shm.

DCKPT_TEST_MANAGER_LONG=1 adds longer runs (many steps, larger states).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest

import _manager_workers as mw
import _workers
import distckpt

DEADLINE = 180  # seconds for a whole group of workers
LONG = os.environ.get("DCKPT_TEST_MANAGER_LONG") == "1"


def run_job(fn, world, cfg, killed=()):
    """Runs ``fn`` on ``world`` spawned ranks; returns what each returned, by rank. Fails with every rank's error. The
    ranks in ``killed`` must die by SIGKILL (the fault cfg["kill"] gives them)."""
    return _workers.spawn(mw.run, world, lambda rank, results: (fn, rank, world, cfg, results), DEADLINE, killed)


def job(root, **cfg):
    """A job's configuration: its local tiers and persistent directory under ``root``, a fresh rendezvous."""
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)  # local_dir is made with mkdir, not mkdir -p (the persistent dir is)
    return {
        "root": str(root),
        "rdv": f"file://{root.parent}/rdv-{uuid.uuid4().hex}",
        "persistent": str(root / "persistent"),
        "ranks_per_node": 2,
        **cfg,
    }


def step_dir(step):
    return f"step-{step:010d}"


def part_files(node_dir, step, rank):
    """The files of part ``rank`` of ``step`` held in a node's local tier (its own part, or a replica)."""
    part = pathlib.Path(node_dir) / step_dir(step) / f"part-{rank:05d}"
    return sorted(p for p in part.rglob("*") if p.is_file())


def flip_a_bit(node_dir, step, rank, entry="model.w#0"):
    """Flips one bit in the data of ``entry`` (a tensor entry of the part: piece k of tensor T is "T#k") of part
    ``rank`` of ``step`` in ``node_dir``, where every restore reads; returns the data file."""
    part = pathlib.Path(node_dir) / step_dir(step) / f"part-{rank:05d}"
    with distckpt.open(part) as r:
        chunk = r.metadata[entry].chunks[0]
    path = part / chunk.file
    with open(path, "r+b") as f:
        f.seek(chunk.file_offset)
        b = f.read(1)
        f.seek(chunk.file_offset)
        f.write(bytes([b[0] ^ 0x10]))
    return path


# ---- Single process (comm=None): the API -------------------------------------------------------------------------


def test_a_part_is_an_ordinary_checkpoint_every_client_opens(tmp_path):
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0) as mgr:
        mgr.save(3, {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "step": 3})
    part = tmp_path / "local" / step_dir(3) / "part-00000"
    with distckpt.open(part) as r:
        r.verify()
        assert "w#0" in r.metadata and r.metadata["w#0"].shape == (3, 4)
        assert r.user_metadata["dckpt.part"] == "rank=0 ranks=1 step=3"
        assert (r["w#0"][:] == np.arange(12, dtype=np.float32).reshape(3, 4)).all()


def test_one_process_saves_every_step_and_restores_the_newest(tmp_path):
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0) as mgr:
        assert mgr.latest_step() is None
        for step in (1, 2, 3):
            mgr.save(step, mw.state_for(step, 0, 1))
        mgr.wait_until_finished()
        assert mgr.latest_step() == 3
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0) as mgr:
        state = mw.template(0, 1)
        result = mgr.restore(state)
        assert (result.found, result.step, result.tier) == (True, 3, "local"), result
        assert result.bytes_local > 0 and result.bytes_from_peers == 0 and result.bytes_from_persistent == 0
        assert result.state is state and result.report
        mw.check(state, 3, 0, 1, saved_world=1)
        assert mgr.restore_report() == result.report
    # keep_local=2 (the default): the two newest steps are in the local tier.
    assert sorted(p.name for p in (tmp_path / "local").glob("step-*")) == [step_dir(2), step_dir(3)]


def test_restore_with_nothing_saved_leaves_the_state_alone(tmp_path):
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0) as mgr:
        state = mw.template(0, 1)
        result = mgr.restore(state)
    assert not result.found and result.step is None and result.tier == "none", result
    assert state["step"] == 0 and state["meta"] == {"tag": "", "world": 0}
    assert not state["model"]["w"].data.any()


def test_persist_writes_an_ordinary_checkpoint(tmp_path):
    persistent = tmp_path / "persistent"
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, persistent=persistent,
                                    persist_every=2) as mgr:  # fmt: skip
        for step in range(1, 6):
            mgr.save(step, mw.state_for(step, 0, 1), persist=step == 5)
    assert sorted(p.name for p in persistent.iterdir()) == [step_dir(2), step_dir(4), step_dir(5)]
    out = distckpt.load(None, persistent / step_dir(5))
    np.testing.assert_array_equal(out["model"]["w"], mw.w_global(5))
    assert out["step"] == 5 and out["meta"] == {"tag": "step 5", "world": 1}


def test_restore_falls_back_to_persistent_when_the_local_tier_is_gone(tmp_path):
    persistent = tmp_path / "persistent"
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, persistent=persistent) as mgr:
        mgr.save(7, mw.state_for(7, 0, 1), persist=True)
    shutil.rmtree(tmp_path / "local")
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, persistent=persistent) as mgr:
        state = mw.template(0, 1)
        result = mgr.restore(state)
        assert (result.step, result.tier) == (7, "persistent"), result
        assert result.bytes_from_persistent > 0 and result.bytes_local == 0
        mw.check(state, 7, 0, 1, saved_world=1)
        nothing = mgr.restore(mw.template(0, 1), use_persistent=False)
        assert not nothing.found, nothing


def test_keep_persistent_removes_older_steps_with_their_data(tmp_path):
    persistent = tmp_path / "persistent"
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, persistent=persistent,
                                    keep_persistent=1) as mgr:  # fmt: skip
        for step in (1, 2, 3):
            mgr.save(step, {"x": np.full(1 << 18, step, np.float32)}, persist=True)  # 1 MiB
    assert sorted(p.name for p in persistent.iterdir()) == [step_dir(3)], sorted(persistent.rglob("*"))
    assert mw.local_file_bytes(persistent) >= 1 << 20  # the newest step keeps its data
    assert (distckpt.load(None, persistent / step_dir(3))["x"] == 3).all()


def test_a_missing_persistent_directory_is_made(tmp_path):
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, persistent=tmp_path / "p") as mgr:
        mgr.save(1, mw.state_for(1, 0, 1), persist=True)
    assert distckpt.load(None, tmp_path / "p" / step_dir(1))["step"] == 1


def test_persistent_storage_object(tmp_path):
    store = distckpt.MemoryStorage()
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, persistent="job",
                                    persistent_storage=store) as mgr:  # fmt: skip
        mgr.save(3, mw.state_for(3, 0, 1), persist=True)
    assert distckpt.listdir("job", storage=store) == [step_dir(3)]
    assert distckpt.load(None, f"job/{step_dir(3)}", storage=store)["step"] == 3
    shutil.rmtree(tmp_path / "local")
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, persistent="job",
                                    persistent_storage=store) as mgr:  # fmt: skip
        state = mw.template(0, 1)
        assert mgr.restore(state).tier == "persistent"
        mw.check(state, 3, 0, 1, saved_world=1)


def test_persistent_on_s3(tmp_path, s3_env):
    url = f"s3://{s3_env}/job"
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, persistent=url) as mgr:
        mgr.save(4, mw.state_for(4, 0, 1, big_rows=16), persist=True)
    assert distckpt.load(None, f"{url}/{step_dir(4)}")["step"] == 4
    shutil.rmtree(tmp_path / "local")
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, persistent=url) as mgr:
        state = mw.template(0, 1, big_rows=16)
        result = mgr.restore(state)
    assert (result.step, result.tier) == (4, "persistent"), result
    mw.check(state, 4, 0, 1, saved_world=1, big_rows=16)


def test_persisted_steps_on_s3_are_compressed_and_refer_to_the_previous_one(tmp_path, s3_env):
    url = f"s3://{s3_env}/smaller"
    frozen = (np.arange(1 << 18, dtype=np.float32) % 64) * 0.25  # 1 MiB the same at every step; compressible
    options = dict(local_dir=tmp_path / "local", replicas=0, persistent=url, persist_every=1, keep_persistent=2,
                   persist_compression="zstd", persist_incremental=True)  # fmt: skip
    with distckpt.CheckpointManager(**options) as mgr:
        for step in range(1, 5):
            mgr.save(step, {"frozen": frozen, "w": np.full(1024, step, np.float32), "step": step})
        mgr.wait_until_finished()
        stats = mgr.stats()
    assert stats.bytes_persist_reused == 3 * frozen.nbytes
    assert 0 < stats.bytes_persisted < frozen.nbytes  # step 1's frozen compressed, then only "w" and "step"
    assert stats.persist_seconds > 0
    # keep_persistent=2 keeps steps 3 and 4, and step 1, which both refer to.
    assert distckpt.listdir(url) == [step_dir(1), step_dir(3), step_dir(4)]
    with distckpt.open(f"{url}/{step_dir(4)}") as r:
        assert r.metadata.bases == (step_dir(1),)
        assert r.metadata.bytes_in_bases == frozen.nbytes
    with distckpt.open(f"{url}/{step_dir(1)}") as r:
        assert r.metadata.stored_bytes < r.metadata.total_bytes
    out = distckpt.load(None, f"{url}/{step_dir(4)}")
    assert out["step"] == 4 and (out["frozen"] == frozen).all() and (out["w"] == 4).all()
    with pytest.raises(ValueError, match="compression"):
        distckpt.CheckpointManager(local_dir=tmp_path / "other", replicas=0, persist_compression="lz4")


def test_pieces_that_do_not_tile_a_tensor_are_refused_when_saved(tmp_path):
    half = {"w": distckpt.Shard(np.ones((2, 6), np.float32), (4, 6), (0, 0))}  # rows 2..4 are nobody's
    with pytest.raises(distckpt.InvalidArgumentError, match="tile"):
        distckpt.save(half, tmp_path / "plain")  # what distckpt.save says
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0) as mgr:
        with pytest.raises(distckpt.InvalidArgumentError, match="tile"):
            mgr.save(1, half)
            mgr.wait_until_finished()


def test_a_step_larger_than_the_budget_is_refused(tmp_path):
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, local_budget_bytes=16 << 10) as mgr:
        with pytest.raises(distckpt.InvalidArgumentError):
            mgr.save(1, mw.state_for(1, 0, 1, big_rows=64))  # 256 KiB
            mgr.wait_until_finished()


def test_the_budget_caps_the_local_tier(tmp_path):
    # 256 KiB a step; the budget holds keep_local=2 steps, one in flight and its staging (the core's rule).
    budget = 1300 << 10
    steps = 60 if LONG else 12
    local = tmp_path / "local"
    with distckpt.CheckpointManager(local_dir=local, replicas=0, local_budget_bytes=budget) as mgr:
        for step in range(1, steps + 1):
            mgr.save(step, mw.state_for(step, 0, 1, big_rows=64))
            assert mw.local_file_bytes(local) <= budget, step
        mgr.wait_until_finished()
        assert mgr.latest_step() == steps
        assert mw.local_file_bytes(local) <= budget
    with distckpt.CheckpointManager(local_dir=local, replicas=0) as mgr:
        state = mw.template(0, 1, big_rows=64)
        assert mgr.restore(state).step == steps
        mw.check(state, steps, 0, 1, saved_world=1, big_rows=64)


def test_the_budget_drops_older_steps(tmp_path):
    # distckpt.h: past the budget a save waits for steps in flight, and the node keeps fewer than keep_local complete
    # steps (as many as fit beside one in flight). Each step is about a fifth of the budget; keep_local asks for 10.
    budget = 1 << 20
    local = tmp_path / "local"
    with distckpt.CheckpointManager(local_dir=local, replicas=0, keep_local=10, local_budget_bytes=budget) as mgr:
        for step in range(1, 9):
            mgr.save(step, {"x": np.full(48 << 10, step, np.float32)})  # 192 KiB
            assert mw.local_file_bytes(local) <= budget, step
        mgr.wait_until_finished()
        assert mgr.latest_step() == 8
    kept = sorted(p.name for p in local.iterdir() if p.name.startswith("step-"))
    assert 1 <= len(kept) < 8 and kept[-1] == "step-0000000008", kept


def test_steps_must_grow(tmp_path):
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0) as mgr:
        mgr.save(5, mw.state_for(5, 0, 1))
        with pytest.raises(distckpt.Error):
            mgr.save(5, mw.state_for(5, 0, 1))
        with pytest.raises(distckpt.InvalidArgumentError):
            mgr.save(-1, mw.state_for(5, 0, 1))


def test_arguments_are_checked(tmp_path):
    with pytest.raises(distckpt.InvalidArgumentError, match="persistent"):
        distckpt.CheckpointManager(local_dir=tmp_path, replicas=0, persistent_storage=distckpt.MemoryStorage())
    with pytest.raises(distckpt.InvalidArgumentError, match="replicas"):
        distckpt.CheckpointManager(local_dir=tmp_path, replicas=-1)
    # One process is one node: a replica on another node cannot be placed.
    with pytest.raises(distckpt.InvalidArgumentError):
        distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=1)


def test_a_closed_manager_says_so(tmp_path):
    mgr = distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0)
    mgr.save(1, mw.state_for(1, 0, 1))
    mgr.close()
    mgr.close()  # twice is fine
    assert mgr.closed
    with pytest.raises(distckpt.errors.StateError, match="closed"):
        mgr.save(2, mw.state_for(2, 0, 1))
    with pytest.raises(distckpt.errors.StateError, match="closed"):
        mgr.latest_step()


def test_the_manager_owns_its_communicator_until_closed(tmp_path):
    comm = distckpt.comm.gloo(0, 1, rendezvous=f"file://{tmp_path}/rdv", timeout=30)
    mgr = distckpt.CheckpointManager(comm, local_dir=tmp_path / "local", replicas=0)
    mgr.save(1, mw.state_for(1, 0, 1))
    with pytest.raises(distckpt.errors.StateError, match="in use"):
        comm.close()
    mgr.close()
    comm.close()


def test_values_other_than_json_are_refused_when_saved(tmp_path):
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0) as mgr:
        with pytest.raises(distckpt.PickleNotAllowedError):
            mgr.save(1, {"x": np.ones(3), "f": object()})


def test_a_stored_value_larger_than_max_object_bytes(tmp_path):
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0) as mgr:
        mgr.save(1, {"x": np.ones(3), "history": list(range(3000))})
        with pytest.raises(distckpt.errors.BufferTooSmallError, match="history.*max_object_bytes"):
            mgr.restore({"x": np.zeros(3), "history": []}, max_object_bytes=100)
        state = {"x": np.zeros(3), "history": []}
        mgr.restore(state, max_object_bytes=1 << 16)
        assert state["history"] == list(range(3000))


def test_torch_and_jax_leaves(tmp_path):
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    saved = {"t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "j": jnp.arange(4.0), "n": 3}
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0) as mgr:
        mgr.save(1, saved)
        state = {"t": torch.zeros(2, 3, dtype=torch.bfloat16), "j": jax.ShapeDtypeStruct((4,), jnp.float32), "n": 0}
        result = mgr.restore(state)
    assert result.state is state
    assert torch.equal(state["t"], saved["t"])
    assert isinstance(state["j"], jax.Array) and (np.asarray(state["j"]) == np.arange(4.0)).all()
    assert state["n"] == 3


# ---- Several ranks on several simulated nodes ---------------------------------------------------------------------

STEPS = 200 if LONG else 20
GOLDEN_BIG = 1024 if LONG else 0  # rows of 4 KiB in the state of the golden job: 1 MiB per rank a step when LONG


@pytest.fixture(scope="module")
def twenty_steps(tmp_path_factory):
    """A 4-rank job on 2 nodes saved steps 1..STEPS (persisting every 10th) and then died (os._exit). Tests copy it."""
    root = tmp_path_factory.mktemp("job20") / "job"
    cfg = job(root, steps=list(range(1, STEPS + 1)), persist_every=10, crash=True, big_rows=GOLDEN_BIG)
    out = run_job(mw.save_job, 4, cfg)
    assert all(o["latest"] == STEPS for o in out.values()), out
    return root


def copy_job(golden, tmp_path):
    root = tmp_path / "job"
    shutil.copytree(golden, root)
    return root


def test_tiers_shows_each_nodes_parts_and_replicas(twenty_steps, tmp_path):
    """`python -m distckpt tiers` on the two nodes' tiers of the golden job: the two newest steps, complete, each
    node holding its ranks' parts and the replicas of the other node's, so either node alone could restore them."""
    root = copy_job(twenty_steps, tmp_path)
    for node, own in (("node0", {0, 1}), ("node1", {2, 3})):
        p = subprocess.run([sys.executable, "-m", "distckpt", "tiers", "--json", root / node], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert [s["step"] for s in doc["steps"]] == [STEPS - 1, STEPS] and doc["other"] == [], doc
        runs = set()
        for s in doc["steps"]:
            assert s["complete"] and s["restorable_here"] and not s["abandoned"], (node, s)
            assert sorted(m["rank"] for m in s["markers"]) == sorted(own), (node, s)
            assert [(p["rank"], p["ranks"], p["state"], p["replica"]) for p in s["parts"]] == [
                (r, 4, "complete", r not in own) for r in range(4)
            ], (node, s)
            runs |= {p["run"] for p in s["parts"]} | {m["run"] for m in s["markers"]} | {s["restorable_run"]}
        assert len(runs) == 1 and "" not in runs, runs  # one run wrote all of it
        p = subprocess.run([sys.executable, "-m", "distckpt", "tiers", "--prune-abandoned", root / node],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert p.returncode == 0 and p.stdout == f"nothing abandoned in {root / node}\n", p.stdout + p.stderr


def test_a_node_lost_after_a_step_is_restored_from_its_peers(twenty_steps, tmp_path):
    root = copy_job(twenty_steps, tmp_path)
    shutil.rmtree(root / "node1")  # node 1 (ranks 2 and 3) is gone, with its /dev/shm
    out = run_job(mw.restore_job, 4, job(root, saved_world=4, big_rows=GOLDEN_BIG))
    for rank, o in out.items():
        assert o["step"] == STEPS, (rank, o)
        assert o["bytes_from_persistent"] == 0, (rank, o)
    for rank in (2, 3):  # the ranks that lost their node's tier got every byte from node 0's replicas
        assert out[rank]["bytes_from_peers"] > 0 and out[rank]["tier"] == "peer", out[rank]
    for rank in (0, 1):
        assert out[rank]["bytes_local"] > 0, out[rank]
    # Node 1's parts and its replicas of node 0's are made again on the replacement, the same count on every rank.
    assert {o["copies_made"] for o in out.values()} == {4}, out


def test_a_second_node_lost_right_after_a_restore_is_survived(twenty_steps, tmp_path):
    root = copy_job(twenty_steps, tmp_path)
    shutil.rmtree(root / "node1")
    first = run_job(mw.restore_job, 4, job(root, saved_world=4, big_rows=GOLDEN_BIG))
    assert all(o["copies_made"] > 0 for o in first.values()), first
    shutil.rmtree(root / "node0")  # before any new step: only the copies made after the restore remain
    out = run_job(mw.restore_job, 4, job(root, saved_world=4, big_rows=GOLDEN_BIG))
    for rank, o in out.items():
        assert o["step"] == STEPS and o["bytes_from_persistent"] == 0 and o["tier"] != "persistent", (rank, o)
    for rank in (0, 1):
        assert out[rank]["bytes_from_peers"] > 0, out[rank]


def test_restore_on_three_ranks_from_a_four_rank_job(twenty_steps, tmp_path):
    root = copy_job(twenty_steps, tmp_path)
    # Ranks 0 and 1 on node 0, rank 2 on node 1: 4 row slabs saved, 3 loaded (mw.check compares each rank's rows).
    out = run_job(mw.restore_job, 3, job(root, saved_world=4, big_rows=GOLDEN_BIG))
    assert {o["step"] for o in out.values()} == {STEPS}, out
    assert all(o["bytes_from_persistent"] == 0 for o in out.values()), out


def test_a_job_resumed_on_three_ranks_goes_on_checkpointing(twenty_steps, tmp_path):
    root = copy_job(twenty_steps, tmp_path)
    more = [STEPS + 1, STEPS + 2, STEPS + 3]
    run_job(mw.restore_job, 3, job(root, saved_world=4, big_rows=GOLDEN_BIG, then_save=more))
    # The 4-rank job's steps are gone from the tiers once the 3-rank job has completed newer ones.
    for node in ("node0", "node1"):
        assert sorted(p.name for p in (root / node).glob("step-*")) == [step_dir(s) for s in more[-2:]], node
    out = run_job(mw.restore_job, 3, job(root, saved_world=3, big_rows=GOLDEN_BIG))
    assert {(o["step"], o["tier"]) for o in out.values()} == {(more[-1], "local")}, out


def test_a_persisted_step_is_an_ordinary_checkpoint(twenty_steps):
    persistent = twenty_steps / "persistent"
    assert sorted(p.name for p in persistent.iterdir()) == [step_dir(s) for s in range(10, STEPS + 1, 10)]
    for step in (10, STEPS):
        out = distckpt.load(None, persistent / step_dir(step))  # one process; the job had 4 ranks
        np.testing.assert_array_equal(out["model"]["w"], mw.w_global(step))
        np.testing.assert_array_equal(out["model"]["bias"], mw.bias(step))
        assert out["step"] == step and out["meta"] == {"tag": f"step {step}", "world": 4}
        if GOLDEN_BIG:
            np.testing.assert_array_equal(out["big"], mw.big_global(step, GOLDEN_BIG))
        with distckpt.open(persistent / step_dir(step)) as r:
            r.verify()


def test_a_flipped_bit_in_a_local_part_is_served_by_its_replica(twenty_steps, tmp_path):
    root = copy_job(twenty_steps, tmp_path)
    flip_a_bit(root / "node0", STEPS, 0)  # rank 0's own part on node 0; its replica on node 1 is intact
    out = run_job(mw.restore_job, 4, job(root, saved_world=4, big_rows=GOLDEN_BIG))
    assert {o["step"] for o in out.values()} == {STEPS}, out
    assert all(o["bytes_from_persistent"] == 0 for o in out.values()), out
    for o in out.values():  # every rank's report names the copy it skipped, and where part 0 came from
        assert re.search(r"skipped the copy of rank 0's part on node 'node0'", o["report"]), o["report"]
    assert out[0]["tier"] == "peer" and out[0]["bytes_from_peers"] > 0, out[0]


def test_a_flipped_bit_in_a_part_and_its_replica_sends_restore_to_persistent_storage(twenty_steps, tmp_path):
    root = copy_job(twenty_steps, tmp_path)
    flip_a_bit(root / "node1", STEPS, 2)  # rank 2's part on its own node
    flip_a_bit(root / "node0", STEPS, 2)  # and its replica
    out = run_job(mw.restore_job, 4, job(root, saved_world=4, big_rows=GOLDEN_BIG))
    for o in out.values():
        assert (o["step"], o["tier"]) == (STEPS, "persistent"), o  # the step was persisted (persist_every=10)
        assert o["bytes_from_persistent"] > 0, o
        for node in ("node0", "node1"):
            assert f"skipped the copy of rank 2's part on node '{node}'" in o["report"], o["report"]


def test_two_nodes_lost_with_one_replica(tmp_path):
    root = tmp_path / "job"
    # 3 nodes of one rank each; steps 1..5 saved, 2 and 4 persisted.
    cfg = job(root, ranks_per_node=1, steps=[1, 2, 3, 4, 5], persist_every=2, crash=True)
    run_job(mw.save_job, 3, cfg)
    shutil.rmtree(root / "node1")
    shutil.rmtree(root / "node2")
    out = run_job(mw.restore_job, 3, job(root, ranks_per_node=1, saved_world=3, no_fallback_first=True))
    for rank, o in out.items():
        assert re.search(r"parts of rank\(s\) [\d, ]+ of 3 are on no live node", o["no_fallback_error"]), o
        assert o["step"] == 4 and o["tier"] == "persistent", (rank, o)


@pytest.mark.parametrize("exit_when, exit_ranks", [("staged", [2]), ("complete", [0])])
def test_exit_while_the_background_thread_works(tmp_path, exit_when, exit_ranks):
    # "staged": rank 2 ends as soon as save() returns, while its part is written and replicated; "complete": rank 0
    # (which commits persisted steps) ends as soon as the step is complete in the local tiers, while it is persisted.
    root = tmp_path / "job"
    big = 16384 if LONG else 4096  # rows of 4 KiB: 16 or 4 MiB per rank a step
    cfg = job(root, steps=[1, 2, 3], big_rows=big, persist_every=1, exit_ranks=exit_ranks, exit_when=exit_when)
    out = run_job(mw.exit_after_save_job, 4, cfg)
    # The persistent directory holds committed checkpoints that load, and whatever else is there is no checkpoint.
    persistent = root / "persistent"
    committed = []
    for p in sorted(persistent.iterdir()):
        if distckpt.storage_stat(p).kind == "checkpoint":
            step = int(p.name.split("-")[1])
            got = distckpt.load(None, p)
            np.testing.assert_array_equal(got["big"], mw.big_global(step, big))
            assert got["step"] == step
            committed.append(step)
        else:  # an unfinished persist: not a checkpoint to any reader
            with pytest.raises(distckpt.Error):
                distckpt.load(None, p)
    assert committed[:3] == [1, 2, 3], committed
    for o in out.values():  # the ranks that lived on learnt that their peer was gone (or the step completed first)
        assert o.get("exited") or o["outcome"] == "complete" or o["outcome"].startswith("PeerError"), o
    # A fresh job restores the newest step complete in the local tiers: 3, or 4 where its background work got that
    # far before the rank ended (always, when it ended after the step was complete).
    res = run_job(mw.restore_job, 4, job(root, saved_world=4, big_rows=big))
    steps = {o["step"] for o in res.values()}
    want = {4} if exit_when == "complete" else {3, 4}
    assert len(steps) == 1 and steps <= want, (res, out)
    assert all(o["bytes_from_persistent"] == 0 for o in res.values()), res


def test_the_budget_caps_every_nodes_tier(tmp_path):
    root = tmp_path / "job"
    big = 256  # rows of 4 KiB: 64 of them (256 KiB) per rank a step, and a replica of another rank's part
    # keep_local=2 steps of a part and a replica each, one in flight and its staging: 7 parts' worth (the core's rule).
    budget = 2 << 20
    steps = list(range(1, (100 if LONG else 10) + 1))
    cfg = job(root, steps=steps, big_rows=big, local_budget_bytes=budget, measure=True)
    out = run_job(mw.save_job, 4, cfg)
    for rank, o in out.items():
        assert o["latest"] == steps[-1], o
        assert max(o["sizes"]) <= budget * 2, (rank, o["sizes"])  # 2 ranks a node
    too_small = job(tmp_path / "small", big_rows=big, local_budget_bytes=budget // 4)
    for o in run_job(mw.budget_too_small_job, 4, too_small).values():
        assert "local_budget_bytes" in o["error"], o


# ---- Kill -9: a rank dies by SIGKILL at an exact point (the core's test-only fault settings) ------------------------

KILL_BIG = 4096  # rows of 4 KiB: 4 MiB per rank a step, so that the fault strikes with the step's bytes in flight


def persisted_steps(persistent):
    """The steps persisted under their own names (each loads with every value right). Anything else in the directory
    must be what ``scan_leftovers`` calls a leftover: an unfinished persist never takes a step's name."""
    leftovers = {left.name: left.kind for left in distckpt.scan_leftovers(persistent)}
    committed = []
    for p in sorted(pathlib.Path(persistent).iterdir()):
        if re.fullmatch(r"step-\d{10}", p.name):
            step = int(p.name[len("step-") :])
            got = distckpt.load(None, p)
            np.testing.assert_array_equal(got["big"], mw.big_global(step, KILL_BIG))
            assert got["step"] == step
            committed.append(step)
        else:
            assert p.name in leftovers, (p.name, leftovers)
    return committed


def test_kill_9_while_receiving_a_replica_restores_the_step_before(tmp_path):
    # Rank 0 keeps the replica of rank 2's part (node 1 -> node 0); it is killed 1 MiB into writing that replica of
    # step 4, with rank 2 still sending (rounds of 256 KiB). Step 4 has parts and half a replica, no completion.
    root = tmp_path / "job"
    fault = {"DCKPT_TEST_MANAGER_FAULTS": "write:step-0000000004/part-00002.dckpt-staging:after=1MiB:kill"}
    cfg = job(root, steps=[1, 2, 3], big_rows=KILL_BIG, kill={0: fault}, exchange_round_bytes=256 << 10)
    out = run_job(mw.kill_job, 4, cfg, killed=[0])
    assert all(o["outcome"].startswith("PeerError") for o in out.values()), out
    assert list((root / "node0" / step_dir(4)).glob("part-00002.dckpt-staging*")), "the replica was not half-written"
    res = run_job(mw.restore_job, 4, job(root, saved_world=4, big_rows=KILL_BIG))
    for rank, o in res.items():  # never step 4, though every part of it is on disk; every value checked
        assert (o["step"], o["bytes_from_persistent"]) == (3, 0), (rank, o)


@pytest.mark.parametrize(
    "killed, fault",
    [
        (1, "write:persistent/step-0000000004.dckpt-staging:after=1MiB:kill"),  # copying its part's data
        (0, "rename:persistent/step-0000000004.dckpt-staging:nth=1:kill"),  # committing the merged step
    ],
)
def test_kill_9_while_persisting_leaves_no_persisted_step_that_looks_complete(tmp_path, killed, fault):
    root = tmp_path / "job"
    cfg = job(
        root, steps=[1, 2, 3], big_rows=KILL_BIG, persist_every=1, kill={killed: {"DCKPT_TEST_MANAGER_FAULTS": fault}}
    )
    run_job(mw.kill_job, 4, cfg, killed=[killed])
    assert persisted_steps(root / "persistent") == [1, 2, 3]
    # (the fault matches step 4's persist only: the rank's death by it says the persist had begun; rank 0 removes the
    # staging directory when it learns of a failure, and leaves it when it is the one killed)
    # Step 4 was complete in the local tiers before it was persisted: restored from there.
    res = run_job(mw.restore_job, 4, job(root, saved_world=4, big_rows=KILL_BIG))
    for rank, o in res.items():
        assert (o["step"], o["bytes_from_persistent"]) == (4, 0), (rank, o)
    # With every node lost, the newest persisted step that is whole: 3, never the half-persisted 4.
    shutil.rmtree(root / "node0")
    shutil.rmtree(root / "node1")
    res = run_job(mw.restore_job, 4, job(root, saved_world=4, big_rows=KILL_BIG))
    for rank, o in res.items():
        assert (o["step"], o["tier"]) == (3, "persistent") and o["bytes_from_persistent"] > 0, (rank, o)


def test_kill_9_during_a_restore_then_a_fresh_group_restores_exactly(tmp_path):
    root = tmp_path / "job"
    run_job(mw.save_job, 4, job(root, steps=[1, 2, 3], big_rows=KILL_BIG, crash=True))
    shutil.rmtree(root / "node1")  # ranks 2 and 3 restore from node 0's replicas
    # Rank 2 dies once it has fetched and loaded its bytes from its peers, before the ranks agree (restore.cc's
    # "fetch+load" phase).
    kill = {2: {"DCKPT_TEST_MANAGER_KILL_AT": "fetch+load@restore of step 3"}}
    out = run_job(mw.restore_kill_job, 4, job(root, saved_world=4, big_rows=KILL_BIG, kill=kill), killed=[2])
    assert all(not o["outcome"].startswith("restored") for o in out.values()), out  # the group could not finish
    res = run_job(mw.restore_job, 4, job(root, saved_world=4, big_rows=KILL_BIG))
    for rank, o in res.items():
        assert (o["step"], o["bytes_from_persistent"]) == (3, 0), (rank, o)
    for rank in (2, 3):
        assert res[rank]["bytes_from_peers"] > 0 and res[rank]["tier"] == "peer", res[rank]
    for node in ("node0", "node1"):  # the killed restore left nothing behind once the next one ran
        assert not list((root / node).glob("restore-*")), sorted(p.name for p in (root / node).iterdir())


# ---- Back-pressure counters ---------------------------------------------------------------------------------------


def part_dir_bytes(node_dir, step, rank):
    return sum(p.stat().st_size for p in part_files(node_dir, step, rank))


def test_stats_of_a_loop_that_never_waits(tmp_path):
    root = tmp_path / "job"
    out = run_job(mw.stats_job, 2, job(root, ranks_per_node=1, steps=[1, 2, 3, 4], big_rows=64))
    for rank, o in out.items():
        st = o["stats"]
        assert (st["steps_saved"], st["steps_completed"], st["steps_failed"]) == (4, 4, 0), (rank, st)
        assert (st["saves_waited"], st["saves_waited_for_budget"], st["wait_seconds"]) == (0, 0, 0.0), (rank, st)
        # Every step's part and the replica of the other rank's have the same size: the last step's, on disk.
        assert st["bytes_written"] == 4 * part_dir_bytes(o["node_dir"], 4, rank) > 0, (rank, st)
        assert st["bytes_replicated"] == 4 * part_dir_bytes(o["node_dir"], 4, 1 - rank) > 0, (rank, st)


@pytest.mark.parametrize("wait_for", ["steps in flight", "budget"])
def test_stats_count_a_save_that_waits(tmp_path, wait_for):
    root = tmp_path / "job"
    big = 1024  # rows of 4 KiB: 2 MiB per rank a step
    cfg = job(root, ranks_per_node=1, big_rows=big, wait_for=wait_for, steps=[1, 2, 3])
    if wait_for == "budget":
        # A step takes its 2 MiB of staging plus two parts of ~2 MiB (its own, a replica) on each side of the budget
        # check: one step in flight fits in 11 MiB beside the one kept, two do not.
        # The wait must begin while step 1's part is still being written (its staging counts until then): its syncs
        # stall, or a fast host wrote it before the second save looked (1 run in 7 here did).
        cfg.update(steps=[1, 2], local_budget_bytes=11 << 20,
                   env={"DCKPT_TEST_MANAGER_FAULTS": "sync:step-0000000001/:every:stall=300ms"})  # fmt: skip
    out = run_job(mw.stats_job, 2, cfg)
    seen, st = out[0]["while_waiting"], out[0]["stats"]
    assert seen["saves_waited"] == 1, seen  # counted as the wait began, while rank 1 had not saved
    assert seen["saves_waited_for_budget"] == (1 if wait_for == "budget" else 0), seen
    assert st["saves_waited"] == 1 and st["wait_seconds"] > 0 and st["max_wait_seconds"] == st["wait_seconds"], st
    assert st["steps_completed"] == len(cfg["steps"]) and st["steps_failed"] == 0, st


def test_stats_and_threads_in_one_process(tmp_path):
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, threads=1,
                                    background_priority="idle") as mgr:  # fmt: skip
        assert mgr.stats() == distckpt.ManagerStats(0, 0, 0, 0, 0, 0.0, 0.0, 0, 0)
        mgr.save(1, {"w": np.arange(4096, dtype=np.float32)})
        mgr.wait_until_finished()
        st = mgr.stats()
    assert (st.steps_saved, st.steps_completed, st.bytes_replicated, st.saves_waited) == (1, 1, 0, 0), st
    assert st.bytes_written == part_dir_bytes(tmp_path / "local", 1, 0), st
    with pytest.raises(distckpt.errors.StateError, match="closed"):
        mgr.stats()
    for bad in ({"threads": -1}, {"background_priority": "high"}):
        with pytest.raises(distckpt.InvalidArgumentError, match=next(iter(bad))):
            distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, **bad)


# ---- The examples of docs/manager.md, run as a user runs them --------------------------------------------------------

REPO = pathlib.Path(__file__).resolve().parents[2]
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(distckpt.__file__)))


def _run_example(name, tmp_path, ok):
    script = REPO / "examples" / "python" / name
    if not script.is_file():
        pytest.skip(f"not run from a checkout: {script} is missing")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [_PACKAGE_DIR, os.environ.get("PYTHONPATH")] if p)}
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.pop("XLA_FLAGS", None)  # the examples set their own device counts
    p = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert p.returncode == 0, f"{name} exited with {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert ok in p.stdout, p.stdout
    return p.stdout


def test_the_fsdp2_example(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch has no torch.distributed with gloo")
    pytest.importorskip("torch.distributed.fsdp")
    out = _run_example("manager_torch_example.py", tmp_path, "manager torch example OK")
    assert "from the peer tier" in out, out  # the ranks on new nodes received node 0's bytes


def test_the_jax_example(tmp_path):
    pytest.importorskip("jax")
    out = _run_example("manager_jax_example.py", tmp_path, "manager jax example OK")
    assert f"restored step {6} from the local tier" in out, out


# ---- Device memory, through the core's device pipeline with its host copy engine (tests/_fake_cuda.py) -------------


@pytest.mark.parametrize("device_snapshot", [False, True])
def test_device_arrays_are_saved_and_restored_in_place(tmp_path, device_snapshot):
    from conftest import run_python

    out = run_python(f"""
        import numpy as np, distckpt
        from _fake_cuda import FakeCudaArray
        local = {str(tmp_path / "local")!r}
        w = np.arange(24, dtype=np.float32).reshape(4, 6)
        halves = [distckpt.Shard(FakeCudaArray(w[:2].copy()), (4, 6), (0, 0)),
                  distckpt.Shard(FakeCudaArray(w[2:].copy()), (4, 6), (2, 0))]
        state = {{"w": FakeCudaArray(w), "rows": halves, "step": 1}}
        with distckpt.CheckpointManager(local_dir=local, replicas=0, device_snapshot={device_snapshot}) as mgr:
            mgr.save(1, state)
            w[...] = -1  # the step was copied before save() returned
            state["step"] = 2
            mgr.save(2, state)
        got = np.zeros((4, 6), np.float32)
        rows = np.zeros((1, 6), np.float32)
        target = {{"w": FakeCudaArray(got), "rows": distckpt.Shard(FakeCudaArray(rows), (4, 6), (1, 0)), "step": 0}}
        with distckpt.CheckpointManager(local_dir=local, replicas=0) as mgr:
            result = mgr.restore(target)
        assert result.step == 2 and target["step"] == 2, result
        assert (got == -1).all(), got
        assert (rows == np.arange(6, 12)).all(), rows
        print("device ok")
    """)
    assert "device ok" in out


@pytest.mark.parametrize("device_snapshot", [False, True])
def test_torch_cuda_tensors_on_a_gpu(tmp_path, device_snapshot):
    from conftest import torch_cuda

    torch = torch_cuda()  # skips without a GPU
    dev = torch.device("cuda", 0)
    w = torch.arange(1 << 22, dtype=torch.float32, device=dev).reshape(2048, 2048)  # 16 MiB
    b = torch.randn(4096, device=dev).to(torch.bfloat16)
    b1 = b.clone()
    persistent = tmp_path / "persistent"
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0, persistent=persistent,
                                    device_snapshot=device_snapshot) as mgr:  # fmt: skip
        mgr.save(1, {"w": w, "b": b, "step": 1}, persist=True)
        w.add_(1)  # kernels right after save() returns: step 1 keeps the values it had
        b.mul_(2)
        mgr.save(2, {"w": w, "b": b, "step": 2})
    target = {"w": torch.zeros(2048, 2048, device=dev), "b": torch.zeros(4096, dtype=torch.bfloat16, device=dev),
              "step": 0}  # fmt: skip
    with distckpt.CheckpointManager(local_dir=tmp_path / "local", replicas=0) as mgr:
        result = mgr.restore(target)
    assert (result.step, target["step"]) == (2, 2), result
    assert torch.equal(target["w"], w) and torch.equal(target["b"], b)
    step1 = {"w": torch.zeros(2048, 2048, device=dev), "b": torch.zeros(4096, dtype=torch.bfloat16, device=dev)}
    distckpt.load(step1, persistent / step_dir(1))
    assert torch.equal(step1["w"], w - 1) and torch.equal(step1["b"], b1)


def test_the_default_replicas_fit_a_job_of_one_node(tmp_path):
    """A job of one node gets 0 replicas by default (the restore report says so); one replica asked for explicitly
    is refused before local_dir is created."""
    with distckpt.CheckpointManager(local_dir=str(tmp_path / "tier"), node_id="only") as mgr:
        mgr.save(1, {"w": np.arange(8, dtype=np.float32)})
        mgr.wait_until_finished()
        state = {"w": np.zeros(8, np.float32)}
        result = mgr.restore(state)
        assert result.step == 1 and np.array_equal(state["w"], np.arange(8, dtype=np.float32))
        assert "replicas: 0 (the default: the job has one node" in result.report, result.report
    with pytest.raises(distckpt.InvalidArgumentError, match="nothing was created"):
        distckpt.CheckpointManager(local_dir=str(tmp_path / "new" / "tier"), node_id="only", replicas=1)
    assert not (tmp_path / "new").exists()
