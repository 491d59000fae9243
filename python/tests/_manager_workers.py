"""Ranks of a job that checkpoints every step with distckpt.CheckpointManager, for test_manager.py.

Several nodes are simulated on this machine: node ``n`` is the ranks ``n * ranks_per_node ...``, with the local tier
``<root>/node<n>`` and node_id ``node<n>``. Each rank has two Gloo communicators over loopback: one that belongs to the
manager (its collectives run on the manager's background thread) and one for the test's own barriers.

The state of step ``s`` on rank ``r`` of ``world``: ``model.w``, a row-sharded float32 matrix whose values depend on
the step (so each rank's rows depend on the rank too), ``model.bias``, replicated on every rank, ``big`` (optional,
row-sharded, to make background work take a while), and non-array values (``step``, ``meta``).
"""

from __future__ import annotations

import dataclasses
import os
import traceback

import numpy as np

from _workers import split

ROWS, COLS = 12, 8


def w_global(step):
    return np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS) + 1000 * step


def bias(step):
    return np.full(5, step, np.int64)


def big_global(step, rows):
    return np.full((rows, 1024), step, np.float32) + np.arange(rows, dtype=np.float32)[:, None]


def state_for(step, rank, world, big_rows=0):
    import distckpt

    r0, r1 = split(ROWS, world, rank)
    state = {
        "model": {
            "w": distckpt.Shard(w_global(step)[r0:r1].copy(), (ROWS, COLS), (r0, 0)),
            "bias": bias(step),
        },
        "step": step,
        "meta": {"tag": f"step {step}", "world": world},
    }
    if big_rows:
        b0, b1 = split(big_rows, world, rank)
        state["big"] = distckpt.Shard(big_global(step, big_rows)[b0:b1].copy(), (big_rows, 1024), (b0, 0))
    return state


def template(rank, world, big_rows=0):
    """What a restarted rank passes to restore: its own rows (of this world size), zeros."""
    import distckpt

    r0, r1 = split(ROWS, world, rank)
    state = {
        "model": {
            "w": distckpt.Shard(np.zeros((r1 - r0, COLS), np.float32), (ROWS, COLS), (r0, 0)),
            "bias": np.zeros(5, np.int64),
        },
        "step": 0,
        "meta": {"tag": "", "world": 0},
    }
    if big_rows:
        b0, b1 = split(big_rows, world, rank)
        state["big"] = distckpt.Shard(np.zeros((b1 - b0, 1024), np.float32), (big_rows, 1024), (b0, 0))
    return state


def check(state, step, rank, world, saved_world, big_rows=0):
    """Every value of a restored state is step ``step``'s, saved by ``saved_world`` ranks."""
    r0, r1 = split(ROWS, world, rank)
    np.testing.assert_array_equal(state["model"]["w"].data, w_global(step)[r0:r1])
    np.testing.assert_array_equal(state["model"]["bias"], bias(step))
    assert state["step"] == step, state["step"]
    assert state["meta"] == {"tag": f"step {step}", "world": saved_world}, state["meta"]
    if big_rows:
        b0, b1 = split(big_rows, world, rank)
        np.testing.assert_array_equal(state["big"].data, big_global(step, big_rows)[b0:b1])


def node_of(rank, cfg):
    return rank // cfg["ranks_per_node"]


def open_job(rank, world, cfg, **overrides):
    """(the test's communicator, the manager) of this rank."""
    import distckpt

    node = node_of(rank, cfg)
    test_comm = distckpt.comm.gloo(rank, world, rendezvous=cfg["rdv"], prefix="test", timeout=60)
    comm = distckpt.comm.gloo(rank, world, rendezvous=cfg["rdv"], prefix="manager", timeout=60)
    options = dict(
        local_dir=f"{cfg['root']}/node{node}",
        node_id=f"node{node}",
        replicas=cfg.get("replicas", 1),
        persistent=cfg.get("persistent"),
        persist_every=cfg.get("persist_every", 0),
        keep_local=cfg.get("keep_local", 2),
        local_budget_bytes=cfg.get("local_budget_bytes", 0),
        timeout=60,
    )
    options.update(overrides)
    return test_comm, comm, distckpt.CheckpointManager(comm, **options)


def local_file_bytes(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except FileNotFoundError:  # removed by the background thread meanwhile
                pass
    return total


# ---- Jobs: each returns what the parent checks (picklable), or raises --------------------------------------------


def save_job(rank, world, cfg):
    """Saves cfg["steps"], waits for every step to be complete, then dies without closing anything (cfg["crash"]),
    as a node does when it is lost, or closes cleanly."""
    test_comm, comm, mgr = open_job(rank, world, cfg)
    big = cfg.get("big_rows", 0)
    sizes = []
    for step in cfg["steps"]:
        mgr.save(step, state_for(step, rank, world, big), persist=step in cfg.get("persist_steps", ()))
        if cfg.get("measure"):
            sizes.append(local_file_bytes(f"{cfg['root']}/node{node_of(rank, cfg)}"))
    mgr.wait_until_finished()
    latest = mgr.latest_step()
    if cfg.get("measure"):
        sizes.append(local_file_bytes(f"{cfg['root']}/node{node_of(rank, cfg)}"))
    test_comm.barrier(timeout=60)
    if not cfg.get("crash"):
        mgr.close()
        comm.close()
        test_comm.close()
    return {"latest": latest, "sizes": sizes}


def restore_job(rank, world, cfg):
    """A fresh rank: restores into a zero template (with fallback=False first where cfg says so), checks every
    value against the step restored, and saves the steps of cfg["then_save"]."""
    import distckpt

    test_comm, comm, mgr = open_job(rank, world, cfg)
    big = cfg.get("big_rows", 0)
    out = {}
    with mgr:
        if cfg.get("no_fallback_first"):
            state = template(rank, world, big)
            try:
                mgr.restore(state, fallback=False)
            except distckpt.NotFoundError as e:
                out["no_fallback_error"] = str(e)
                out["no_fallback_report"] = mgr.restore_report()
            else:
                raise AssertionError("restore(fallback=False) found a step although parts are lost on every tier")
            assert state["step"] == 0 and not state["model"]["bias"].any(), "a failed restore changed the state"
        state = template(rank, world, big)
        result = mgr.restore(state, fallback=cfg.get("fallback", True))
        assert result.found, result.report
        assert result.state is state
        check(state, result.step, rank, world, cfg["saved_world"], big)
        out.update(
            step=result.step,
            tier=result.tier,
            bytes_local=result.bytes_local,
            bytes_from_peers=result.bytes_from_peers,
            bytes_from_persistent=result.bytes_from_persistent,
            copies_made=result.copies_made,
            report=result.report,
        )
        for step in cfg.get("then_save", ()):  # the job goes on, checkpointing as before
            mgr.save(step, state_for(step, rank, world, big))
        mgr.wait_until_finished()
    comm.close()
    test_comm.barrier(timeout=60)
    test_comm.close()
    return out


def open_and_save_steps(rank, world, cfg, **overrides):
    """Opens the job (open_job), saves cfg["steps"] (cfg["big_rows"] rows of "big") until every one is complete, and
    meets the other ranks; returns (the test's communicator, the manager's, the manager, the next step)."""
    test_comm, comm, mgr = open_job(rank, world, cfg, **overrides)
    for step in cfg["steps"]:
        mgr.save(step, state_for(step, rank, world, cfg["big_rows"]))
    mgr.wait_until_finished()
    test_comm.barrier(timeout=60)
    return test_comm, comm, mgr, cfg["steps"][-1] + 1


def exit_after_save_job(rank, world, cfg):
    """Saves cfg["steps"] completely, then one more step (a large state, persisted) and ends at once with os._exit on
    the ranks of cfg["exit_ranks"], nothing closed: with cfg["exit_when"] == "staged" as soon as save() returns
    (the background thread is writing and replicating the step), with "complete" as soon as the step is complete in
    the local tiers (the background thread is persisting it). The other ranks wait for the step, which may fail,
    their peers being gone."""
    import time

    import distckpt

    test_comm, comm, mgr, last = open_and_save_steps(rank, world, cfg)
    big = cfg["big_rows"]
    state = state_for(last, rank, world, big)
    if rank in cfg["exit_ranks"]:
        report({"exited": True})  # before the save: nothing may delay the exit after it
        try:
            mgr.save(last, state, persist=True)
            if cfg["exit_when"] == "complete":
                deadline = time.monotonic() + 60
                while mgr.latest_step() != last and time.monotonic() < deadline:
                    time.sleep(0.001)
        finally:
            os._exit(0)
    mgr.save(last, state, persist=True)
    try:
        mgr.wait_until_finished(timeout=90)
        outcome = "complete"
    except distckpt.Error as e:
        outcome = f"{type(e).__name__}: {e}"
    return {"exited": False, "outcome": outcome}


def kill_job(rank, world, cfg):
    """Saves cfg["steps"] completely; then the ranks in cfg["kill"] get their fault (the environment the core reads
    once: DCKPT_TEST_MANAGER_FAULTS, DCKPT_TEST_MANAGER_KILL_AT; set before the first manager of the process) and every
    rank saves step cfg["steps"][-1] + 1 (persisted where cfg["persist_every"] says): a faulted rank dies by SIGKILL in
    the background work, the others learn that their peer is gone (or the step completed first)."""
    import distckpt

    os.environ.update(cfg.get("kill", {}).get(rank, {}))
    test_comm, comm, mgr, last = open_and_save_steps(
        rank, world, cfg, exchange_round_bytes=cfg.get("exchange_round_bytes", 0)
    )
    try:
        mgr.save(last, state_for(last, rank, world, cfg["big_rows"]))
        mgr.wait_until_finished(timeout=90)
        outcome = "complete"
    except distckpt.Error as e:
        outcome = f"{type(e).__name__}: {e}"
    return {"outcome": outcome}


def restore_kill_job(rank, world, cfg):
    """A fresh rank restores as restore_job does, the ranks in cfg["kill"] with their fault (they die by SIGKILL in the
    restore); returns how the restore ended on the others."""
    import distckpt

    os.environ.update(cfg.get("kill", {}).get(rank, {}))
    test_comm, comm, mgr = open_job(rank, world, cfg)
    state = template(rank, world, cfg.get("big_rows", 0))
    try:
        result = mgr.restore(state)
        outcome = f"restored step {result.step} from {result.tier}"
    except distckpt.Error as e:
        outcome = f"{type(e).__name__}: {e}"
    return {"outcome": outcome}


def stats_job(rank, world, cfg):
    """2 ranks. cfg["wait_for"] None: each step is saved and waited for, so no save ever waits. "steps in flight" or
    "budget": rank 1 saves nothing until rank 0's save is seen waiting (mgr.stats() from another thread), so that
    rank 0's steps cannot complete meanwhile: rank 0 saves steps 1 and 2 and its 3rd save must wait for the steps in
    flight, or (with a local budget that holds one step in flight, not two) its 2nd save must wait for the budget."""
    import threading
    import time

    os.environ.update(cfg.get("env", {}))  # read by the core when the first manager of the process starts
    test_comm, comm, mgr = open_job(rank, world, cfg)
    big = cfg.get("big_rows", 0)
    steps = cfg["steps"]
    wait_for = cfg.get("wait_for")
    seen = {}
    if wait_for is None:
        for step in steps:
            mgr.save(step, state_for(step, rank, world, big))
            mgr.wait_until_finished()
    elif rank == 0:
        for step in steps[:-1]:
            mgr.save(step, state_for(step, rank, world, big))
        errors = []

        def last_save():
            try:
                mgr.save(steps[-1], state_for(steps[-1], rank, world, big))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        saver = threading.Thread(target=last_save)
        saver.start()
        field = "saves_waited_for_budget" if wait_for == "budget" else "saves_waited"
        deadline = time.monotonic() + 60
        while getattr(mgr.stats(), field) == 0 and saver.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen = dataclasses.asdict(mgr.stats())
        test_comm.barrier(timeout=60)  # now rank 1 saves, and rank 0's steps can complete
        saver.join(timeout=120)
        assert not saver.is_alive() and not errors, errors or "rank 0's last save never returned"
        mgr.wait_until_finished()
    else:
        test_comm.barrier(timeout=60)
        for step in steps:
            mgr.save(step, state_for(step, rank, world, big))
        mgr.wait_until_finished()
    stats = dataclasses.asdict(mgr.stats())
    node_dir = f"{cfg['root']}/node{node_of(rank, cfg)}"
    mgr.close()
    comm.close()
    test_comm.close()
    return {"while_waiting": seen, "stats": stats, "node_dir": node_dir}


def budget_too_small_job(rank, world, cfg):
    """A budget smaller than one step: the save is refused with InvalidArgumentError on every rank."""
    import distckpt

    test_comm, comm, mgr = open_job(rank, world, cfg)
    try:
        mgr.save(1, state_for(1, rank, world, cfg["big_rows"]))
        mgr.wait_until_finished()
    except distckpt.InvalidArgumentError as e:
        message = str(e)
    else:
        raise AssertionError("a step larger than local_budget_bytes was accepted")
    return {"error": message}


# ---- The runner -----------------------------------------------------------------------------------------------------


_results = None  # the runner's queue, for report()
_rank = None


def report(payload):
    """Sends this rank's result now (the runner sends nothing after): for a rank about to end itself."""
    global _results
    _results.put((_rank, None, payload))
    _results.close()
    _results.join_thread()  # the report must leave before the process does
    _results = None


def run(fn, rank, world, cfg, results):
    """Runs ``fn(rank, world, cfg)`` and reports (rank, error text or None, what it returned), unless it reported
    itself. With cfg["crash"] the process then ends with os._exit, as a lost node's processes do: no atexit handler
    closes the manager."""
    global _results, _rank
    _results, _rank = results, rank
    try:
        payload = fn(rank, world, cfg)
        if _results is not None:
            results.put((rank, None, payload))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        if _results is not None:
            results.put((rank, traceback.format_exc(), None))
    if cfg.get("crash"):
        results.close()
        results.join_thread()
        os._exit(0)
