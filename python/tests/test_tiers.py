"""``python -m distckpt tiers``: what a checkpoint manager's node-local tier holds, and the prune of what is abandoned
there (docs/manager.md, "Looking at a tier"), on tiers real CheckpointManagers wrote. test_cli_agreement.py checks
that the Go CLI prints the same; test_manager.py looks at the tiers of a job on two simulated nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import distckpt

OK, USAGE, FAILURE, NOT_FOUND = 0, 2, 3, 4


def tiers(*args):
    p = subprocess.run([sys.executable, "-m", "distckpt", "tiers", *map(str, args)], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    return p


def tiers_json(*args):
    p = tiers("--json", *args)
    assert p.returncode == OK, p.stderr
    return json.loads(p.stdout)


def step_dir(step):
    return f"step-{step:010d}"


def save_steps(tier, steps):
    """One run of a one-rank job: a CheckpointManager of its own saves ``steps`` (keep_local 2)."""
    with distckpt.CheckpointManager(local_dir=str(tier), node_id="n0") as mgr:
        for step in steps:
            mgr.save(step, {"w": np.full((32, 32), step, np.float32)})
        mgr.wait_until_finished()


def dead_staging(step_path, rank, nonce):
    """A replica's staging directory whose writer, a process of this host, has exited."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    d = step_path / f"part-{rank:05d}.dckpt-staging-{nonce}"
    d.mkdir()
    (d / "STAGING").write_text(f"distckpt staging directory (not committed)\nhost: {os.uname().nodename}\n"
                               f"pid: {child.stdout.strip()}\nstarted_utc: 2026-11-28T10:00:00Z\n"
                               f"final_path: {step_path}/part-{rank:05d}\n")  # fmt: skip
    (d / "data-00000.bin").write_bytes(b"x" * 3000)
    return d


def test_a_restored_jobs_step_below_an_earlier_runs_is_left_alone(tmp_path):
    """Run A saved steps 1..3; run B, restored from step 1's state, has written its step 2 but not yet marked it (its
    replicas on the way). Run A's newer step 3 does not make it abandoned, and the prune leaves it; a staging
    directory of an exited writer goes."""
    tier = tmp_path / "tier"
    save_steps(tier, [1, 2, 3])  # run A: steps 2 and 3 kept
    (tier / step_dir(2)).rename(tmp_path / "run-a-step-2")
    save_steps(tier, [2])  # run B
    (tier / step_dir(2) / "complete-00000").unlink()
    dead = dead_staging(tier / step_dir(3), 1, "00000000000000bb")

    doc = tiers_json(tier)
    assert doc["schema_version"] == 1 and doc["dir"] == str(tier) and doc["other"] == [], doc
    s2, s3 = doc["steps"]
    run_a, run_b = s3["markers"][0]["run"], s2["parts"][0]["run"]
    assert run_a and run_b and run_a != run_b, doc
    assert (s2["step"], s2["complete"], s2["abandoned"], s2["restorable_here"]) == (2, False, False, False), s2
    assert s2["parts"][0]["replica"] is None and s2["parts"][0]["state"] == "complete", s2
    assert (s3["step"], s3["complete"], s3["abandoned"], s3["restorable_here"]) == (3, True, False, True), s3
    assert s3["restorable_run"] == run_a and s3["markers"] == [{"rank": 0, "run": run_a}], s3
    own, staging = s3["parts"]
    assert own == {"name": "part-00000", "rank": 0, "ranks": 1, "replica": False, "run": run_a,
                   "bytes": own["bytes"], "state": "complete", "why": ""}, own  # fmt: skip
    assert own["bytes"] >= 32 * 32 * 4, own
    assert staging["name"] == dead.name and staging["rank"] == 1 and staging["replica"] is True, staging
    assert staging["state"] == "abandoned" and "has exited" in staging["why"] and staging["bytes"] >= 3000, staging

    text = tiers(tier)
    assert text.returncode == OK, text.stderr
    assert "step 2: not complete\n" in text.stdout, text.stdout
    assert f"step 3: complete, restorable from this node alone (run {run_a})\n" in text.stdout, text.stdout
    assert "abandoned: writer pid" in text.stdout and " copy " in text.stdout, text.stdout

    dry = tiers("--prune-abandoned", "--dry-run", "--json", tier)
    assert dry.returncode == OK, dry.stderr
    assert json.loads(dry.stdout) == {"schema_version": 1, "dir": str(tier), "dry_run": True, "removed": [str(dead)]}
    assert dead.is_dir()
    pruned = tiers("--prune-abandoned", tier)
    assert pruned.returncode == OK and pruned.stdout == f"removed {dead}\n", pruned.stdout + pruned.stderr
    assert not dead.exists()
    assert (tier / step_dir(2) / "part-00000" / "metadata.dckpt").is_file()
    assert tiers("--prune-abandoned", tier).stdout == f"nothing abandoned in {tier}\n"

    # Once run B marks a newer step complete, its unmarked step 2 is what its manager would have removed.
    (tier / step_dir(4)).mkdir()
    (tier / step_dir(4) / "complete-00000").write_text(run_b)
    assert tiers_json(tier)["steps"][0]["abandoned"] is True
    pruned = tiers("--prune-abandoned", tier)
    assert pruned.stdout == f"removed {tier / step_dir(2) / 'part-00000'}\n", pruned.stdout + pruned.stderr
    assert not (tier / step_dir(2)).exists()


def test_what_is_not_a_tier_is_refused(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("x")
    for args in ((plain,), ("--prune-abandoned", plain)):
        p = tiers(*args)
        assert p.returncode == FAILURE and "not a checkpoint manager's local tier" in p.stderr, p
        assert str(plain) in p.stderr, p.stderr
    assert (plain / "notes.txt").read_text() == "x"
    p = tiers(tmp_path / "missing")
    assert p.returncode == NOT_FOUND and str(tmp_path / "missing") in p.stderr, p
    p = tiers("--dry-run", plain)
    assert p.returncode == USAGE and "--dry-run goes with --prune-abandoned" in p.stderr, p


@pytest.mark.parametrize("count", [0, 1023, 1024, 4608, 5 << 20])
def test_sizes_print_as_the_go_cli_prints_them(count):
    from distckpt.__main__ import _iec_bytes

    want = {0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 4608: "4.5 KiB", 5 << 20: "5.0 MiB"}
    assert _iec_bytes(count) == want[count]
