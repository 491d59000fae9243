"""Checks an installed distckpt the way a user's program would use it, from outside the source tree.

Run by tests/packaging/venvs.sh with a fresh venv's interpreter, in isolated mode (``python -I``: no PYTHONPATH, no
user site, not even this script's directory on sys.path) and from a directory outside the checkout:

    python -I check_install.py CHECKOUT WORKDIR [--gloo-optional]

It imports nothing from the checkout. Prints one "ok   ..." or "FAIL ..." line per check (a traceback after a
failure) and exits non-zero if any failed:

1. distckpt and its extension module are imported from the venv, not from CHECKOUT;
2. the native libraries it loaded (the extension, and libdistckpt.so where the package has one) are mapped from the
   venv, not from the system's copies, and Gloo is not loaded yet;
3. 3 ranks save a sharded state over Gloo (processes, file:// rendezvous on loopback); each has the Gloo plugin
   (libdistckpt_gloo.so) and the gloo, hiredis, ibverbs and libnl it vendors mapped from the venv;
4. 2 ranks load it with other shardings, and every value is checked;
5. export_safetensors writes it as safetensors files, which the real ``safetensors`` package reads back exactly.

With ``--gloo-optional`` (a system the Gloo plugin may not run on: tests/packaging/debian11.sh), steps 3 and 4 run in
this one process without a communicator (the whole state saved, then each of 2 ranks' parts loaded resharded), and a
Gloo group of one either forms or fails with the plugin's clear error: DCKPT_EUNSUPPORTED naming the plugin's file,
why the dynamic loader refused it, and the alternatives.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import sys
import time
import traceback
from pathlib import Path

import numpy as np

DEADLINE = 180  # seconds for one group of ranks
NATIVE = re.compile(r"distckpt|gloo|hiredis|ibverbs|libnl")  # the files that must come from the venv


def state_values():
    """The global arrays of the checkpoint: every rank derives its pieces from these."""
    rng = np.random.default_rng(25)
    return {
        "layers.w": rng.standard_normal((12, 10)).astype(np.float32),
        "layers.emb": rng.integers(-(2**40), 2**40, (9, 16)).astype(np.int64),
        "layers.norm": np.linspace(-1, 1, 7),
        "head": rng.standard_normal((6, 5)).astype(np.float16),
    }


def part(n, parts, k):
    """The slice of part k when n is cut into `parts` nearly equal parts."""
    cuts = np.linspace(0, n, parts + 1).round().astype(int)
    return slice(int(cuts[k]), int(cuts[k + 1]))


def imported_from_venv(checkout):
    import distckpt
    import distckpt._distckpt as native

    prefix = Path(sys.prefix).resolve()
    assert prefix != Path(sys.base_prefix).resolve(), f"{sys.executable} is not a venv's interpreter"
    for module in (distckpt, native):
        where = Path(module.__file__).resolve()
        assert prefix in where.parents, f"{module.__name__} is imported from {where}, outside the venv {prefix}"
        assert checkout not in where.parents, f"{module.__name__} is imported from the checkout: {where}"
    return Path(native.__file__).resolve()


def native_from_venv(gloo=False):
    """Names the native files mapped in this process; each must be a file of the venv. With `gloo`, the Gloo plugin and
    libgloo must be among them; without, nothing of Gloo (it is loaded on the first Gloo communicator only)."""
    prefix = Path(sys.prefix).resolve()
    with open("/proc/self/maps") as maps:
        files = {Path(fields[5].strip()) for fields in (line.split(None, 5) for line in maps) if len(fields) == 6}
    ours = sorted(f for f in files if ".so" in f.name and NATIVE.search(f.name))
    outside = [str(f) for f in ours if prefix not in f.resolve().parents]
    assert not outside, f"mapped from outside the venv {prefix}: {outside}"
    if gloo:
        assert any(f.name == "libdistckpt_gloo.so" for f in ours), f"the Gloo plugin is not mapped: {ours}"
        assert any(f.name.startswith("libgloo") for f in ours), f"no gloo mapped: {ours}"
    else:
        assert not any("gloo" in f.name for f in ours), f"Gloo is mapped before any Gloo communicator: {ours}"
    return [str(f.relative_to(prefix)) for f in ours]


def save_rank(rank, world, rendezvous, path):
    import distckpt

    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=60) as comm:
        native_from_venv(gloo=True)
        save_part(rank, world, comm, path)


def save_part(rank, world, comm, path):
    """Saves this rank's part of the state (the whole state when world is 1)."""
    import distckpt

    v = state_values()
    rows, cols, head = part(12, world, rank), part(16, world, rank), part(6, world, rank)
    state = {
        "layers": {
            "w": distckpt.Shard(v["layers.w"][rows], (12, 10), (rows.start, 0)),  # row slabs
            "emb": distckpt.Shard(v["layers.emb"][:, cols], (9, 16), (0, cols.start)),  # column slabs
            "norm": v["layers.norm"],  # replicated on every rank: written once
        },
        "head": distckpt.Shard(v["head"][head], (6, 5), (head.start, 0)),
        "step": 1000,
    }
    distckpt.save(state, path, comm=comm, timeout=60)


def load_rank(rank, world, rendezvous, path):
    import distckpt

    with distckpt.comm.gloo(rank, world, rendezvous=rendezvous, timeout=60) as comm:
        load_part(rank, world, comm, path)


def load_part(rank, world, comm, path):
    """Loads this rank's part of the resharded state and checks every value."""
    import distckpt

    v = state_values()
    cols, rows = part(10, world, rank), part(9, world, rank)
    w = np.zeros((12, cols.stop - cols.start), np.float32)
    emb = np.full((rows.stop - rows.start, 16), -1, np.int64)
    head = np.zeros((6, 5), np.float32)  # whole, converted from f16
    state = {
        "layers": {
            "w": distckpt.Shard(w, (12, 10), (0, cols.start)),  # column slabs now
            "emb": distckpt.Shard(emb, (9, 16), (rows.start, 0)),  # row slabs now
            "norm": np.zeros(7),
        },
        "head": head,
        "step": None,
    }
    distckpt.load(state, path, comm=comm, timeout=60)
    np.testing.assert_array_equal(w, v["layers.w"][:, cols])
    np.testing.assert_array_equal(emb, v["layers.emb"][rows])
    np.testing.assert_array_equal(state["layers"]["norm"], v["layers.norm"])
    np.testing.assert_array_equal(head, v["head"].astype(np.float32))
    assert state["step"] == 1000, state["step"]


def _rank_main(fn, rank, args):
    try:
        imported_from_venv(Path(args[-1]))  # the ranks too
        fn(rank, *args[:-1])
    except BaseException:  # noqa: BLE001 - the traceback goes to stderr, the exit code to the parent
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def run_ranks(fn, world, *args):
    """Runs fn(rank, world, *args) in `world` spawned processes; fails unless every one exits 0 within DEADLINE."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(fn, rank, (world, *args))) for rank in range(world)]
    for p in procs:
        p.start()
    end = time.monotonic() + DEADLINE
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    assert not hung and codes == [0] * world, f"{fn.__name__}: exit codes {codes}, running after {DEADLINE} s: {hung}"


def load_parts(world, path):
    for rank in range(world):
        load_part(rank, world, None, path)


def gloo_or_clear_error(rendezvous):
    import distckpt

    try:
        with distckpt.comm.gloo(0, 1, rendezvous=rendezvous, timeout=30):
            return "it forms"
    except distckpt.errors.UnsupportedError as e:
        message = str(e)
        for want in ("libdistckpt_gloo.so", "DCKPT_GLOO_PLUGIN", "external communicator"):
            assert want in message, f"{want!r} is not in the error: {message}"
        # The dynamic loader's own reason, e.g. "version `GLIBC_2.33' not found".
        assert re.search(r"not found|cannot open|wrong ELF", message), message
        if re.search(r"version `GLIBC(XX)?_", message):  # the plugin is there, the system older: said so
            assert "needs a newer C or C++ runtime than this system has" in message, message
        return "refused: " + re.search(r"tried [^)]*\)", message).group(0)


def export_read_back(path, out_dir):
    import distckpt
    from safetensors import safe_open
    from safetensors.numpy import load_file

    files = distckpt.export_safetensors(path, out_dir, max_shard_size="1KB")  # several files: the index matters
    v = state_values()
    index = json.loads((Path(out_dir) / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(v), index["weight_map"]  # the step is a bytes entry: skipped
    got = {}
    for name in sorted(set(index["weight_map"].values())):
        got.update(load_file(str(Path(out_dir) / name)))
        with safe_open(str(Path(out_dir) / name), framework="np") as f:
            assert f.metadata().get("format") == "pt", f.metadata()
    assert set(got) == set(v), sorted(got)
    for name, value in v.items():
        assert got[name].dtype == value.dtype, (name, got[name].dtype, value.dtype)
        np.testing.assert_array_equal(got[name], value)
    return f"{len(files)} files"


def main():
    checkout, work = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    path = str(work / "ckpt")
    failed = 0

    def step(what, fn, *args):
        nonlocal failed
        try:
            detail = fn(*args)
        except BaseException:  # noqa: BLE001 - reported, counted, and the next check runs
            failed += 1
            print(f"FAIL {what}", flush=True)
            traceback.print_exc(file=sys.stdout)
            sys.stdout.flush()
            return
        print(f"ok   {what}" + (f" ({detail})" if detail else ""), flush=True)

    step("distckpt is imported from the venv, not the checkout", imported_from_venv, checkout)
    step("its native libraries are mapped from the venv, and nothing of Gloo yet", native_from_venv)
    if "--gloo-optional" in sys.argv[3:]:
        step("a Gloo group of one forms, or fails naming the plugin, the reason and the alternatives", gloo_or_clear_error,
             f"file://{work}/rdv_one")
        step("one process saves the whole state", save_part, 0, 1, None, path)
        step("2 ranks' parts load resharded one after the other, every value checked", load_parts, 2, path)
    else:
        step("3 ranks save a sharded state over Gloo, the plugin and gloo mapped from the venv", run_ranks, save_rank,
             3, f"file://{work}/rdv_save", path, checkout)
        step("2 ranks load it resharded, every value checked", run_ranks, load_rank, 2, f"file://{work}/rdv_load",
             path, checkout)
    step("export_safetensors, read back by the safetensors package", export_read_back, path, str(work / "st"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
