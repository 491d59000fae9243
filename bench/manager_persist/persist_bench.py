#!/usr/bin/env python3
"""The checkpoint manager's persistent tier (docs/manager.md, "Persisting smaller") in one run: the same steps
persisted to S3 raw, compressed (``persist_compression="zstd"``), incremental (``persist_incremental=True``) and both.

S3 is a loopback moto server behind a proxy that is a 1 Gbit/s link (python/tests/_s3_faults.py, rate=125e6 B/s).
Two states:
- the fine-tuning case of issue 41 (bench/incremental: a frozen bf16 base of --frozen-gib and 32 MiB of fp32 LoRA
  adapters with Adam's state, changed every step), --steps steps each persisted;
- dense bf16 weights shaped like TinyLlama's (bench/compression, --dense-gib), every value changed every step (so
  nothing is reused: compression alone), --steps steps.
For each mode: the bytes written to S3 per persisted step (the manager's ``bytes_persisted``, after the first step
and for the first), and the time from ``save`` to the step being persisted (``wait_until_finished``), median over
the steps after the first; ratios to raw; and the time the manager spent persisting alone (``persist_seconds``: the
step's part is first written to the local tier, which every mode does alike). The last persisted step of each mode is
loaded back and compared.

    .venv/bin/python bench/manager_persist/persist_bench.py [--frozen-gib 0.25] [--dense-gib 0.125] [--steps 5]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import distckpt
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(
    0, os.path.join(HERE, "..", "..", "python", "tests")
)  # the tests' moto server and link proxy
sys.path.insert(0, os.path.join(HERE, "..", "incremental"))
sys.path.insert(0, os.path.join(HERE, "..", "compression"))
from compression_bench import weights
from incremental_bench import assert_same, make_state, train_step, write_results

MIB = 1 << 20
MODES = {
    "raw": {},
    "zstd": {"persist_compression": "zstd"},
    "incremental": {"persist_incremental": True},
    "incremental+zstd": {"persist_incremental": True, "persist_compression": "zstd"},
}


def perturb(state: dict, step: int) -> None:
    """Every value of the dense state changes (a training step of all weights)."""
    for v in state.values():
        if isinstance(v, dict):
            perturb(v, step)
        elif isinstance(v, np.ndarray):
            flat = v.reshape(-1).view(np.uint16)
            flat ^= np.uint16(1)  # the lowest mantissa bit of every bf16 value flips


def run_mode(
    name: str, state: dict, advance, steps: int, url: str, storage, local: str
) -> dict:
    seconds, persisted, persisting = [], [], []
    with distckpt.CheckpointManager(local_dir=local, replicas=0, persistent=url, persistent_storage=storage,
                                    persist_every=1, keep_local=1, keep_persistent=2, **MODES[name]) as mgr:  # fmt: skip
        before, before_s = 0, 0.0
        for step in range(1, steps + 1):
            advance(state, step)
            t = time.perf_counter()
            mgr.save(step, state)
            mgr.wait_until_finished()
            seconds.append(time.perf_counter() - t)
            stats = mgr.stats()
            persisted.append(stats.bytes_persisted - before)
            persisting.append(stats.persist_seconds - before_s)
            before, before_s = stats.bytes_persisted, stats.persist_seconds
    got = distckpt.load(None, f"{url}/step-{steps:010d}", storage=storage)
    assert_same(got, state)
    return {"seconds": seconds, "bytes": persisted, "first_bytes": persisted[0],
            "bytes_per_step": statistics.median(persisted[1:]), "seconds_per_step": statistics.median(seconds[1:]),
            "first_seconds": seconds[0], "persisting": persisting,
            "persisting_per_step": statistics.median(persisting[1:])}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frozen-gib", type=float, default=0.25)
    ap.add_argument("--dense-gib", type=float, default=0.125)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--rate", type=float, default=125e6, help="the link's bytes per second"
    )
    ap.add_argument("--out", default=os.path.join(HERE, "..", "results"))
    args = ap.parse_args()

    import _s3_faults
    import _s3_server

    root = tempfile.mkdtemp(prefix="dckpt-persist-", dir="/var/tmp")
    server = _s3_server.MotoServer()
    results: dict = {}
    try:
        os.environ.update(server.env())
        server.client().create_bucket(Bucket="bench")
        with _s3_faults.FaultProxy(server.endpoint, rate=args.rate) as proxy:
            link = distckpt.storage.S3Storage(proxy.endpoint)
            for case, build, advance in (
                ("fine-tuning", lambda: make_state(args.frozen_gib), train_step),
                ("dense", lambda: weights(args.dense_gib), perturb),
            ):
                results[case] = {}
                for mode in MODES:
                    state = build()
                    local = os.path.join(root, f"{case}-{mode}")
                    results[case][mode] = run_mode(mode, state, advance, args.steps, f"s3://bench/{case}-{mode}",
                                                   link, local)  # fmt: skip
                    shutil.rmtree(local, ignore_errors=True)
                    del state
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)

    result = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "host": platform.node(),
              "cpus": os.cpu_count(), "rate_bytes_per_s": args.rate, "steps": args.steps,
              "frozen_gib": args.frozen_gib, "dense_gib": args.dense_gib, **results}  # fmt: skip
    lines = [
        f"# The manager's persistent tier on S3, {result['date']} ({result['host']}, {result['cpus']} CPUs)",
        "",
        f"`{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        "",
        (
            f"moto on loopback behind a {args.rate * 8 / 1e9:.1f} Gbit/s link; {args.steps} steps, each persisted "
            "(persist_every=1); per step after the first: medians; ratios to raw."
        ),
        "",
        (
            "| state | mode | first step written | written per step | / raw | save to persisted per step | / raw | "
            "persisting alone | / raw |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, modes in results.items():
        raw = modes["raw"]
        for mode, r in modes.items():
            lines.append(
                f"| {case} | {mode} | {r['first_bytes'] / MIB:.1f} MiB | {r['bytes_per_step'] / MIB:.2f} MiB | "
                f"**{r['bytes_per_step'] / raw['bytes_per_step']:.3f}** | {r['seconds_per_step']:.2f} s | "
                f"**{r['seconds_per_step'] / raw['seconds_per_step']:.3f}** | {r['persisting_per_step']:.2f} s | "
                f"**{r['persisting_per_step'] / raw['persisting_per_step']:.3f}** |"
            )
    write_results(args.out, "manager-persist-vm", "\n".join(lines) + "\n", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
