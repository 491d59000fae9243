#!/usr/bin/env python3
"""Incremental checkpoints (``distckpt.save(..., base=...)``, core/format/FORMAT.md 4.1) against full saves, in one run.

The fine-tuning case of issue 41: a frozen bf16 base (--frozen-gib GiB, default 2) and 32 MiB of trainable state
(LoRA adapters in fp32 with Adam's exp_avg and exp_avg_sq), saved whole once, then --saves times (default 10) as
incremental saves, each with the previous one as its base, the trainable state changed before each. Every save is
durable (fsync) to --dir on a local disk. Reported, each as a ratio to the full save: data bytes written per save,
save time (median of the incremental saves), and the load of the last incremental checkpoint (every value compared)
against the load of the full one, with their pages evicted (posix_fadvise DONTNEED) and warm. Also the time to
flatten the last one into a self-contained copy, and what a fio-free limit of this disk is here: the full save's
bytes over its time.

    .venv/bin/python bench/incremental/incremental_bench.py [--frozen-gib 2] [--saves 10] [--dir DIR] [--out bench/results]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import distckpt
import ml_dtypes
import numpy as np

MIB = 1 << 20


def evict(*dirs: str) -> None:
    """Drops the pages of every file below dirs from the page cache (as far as the kernel lets it)."""
    for d in dirs:
        for root, _, files in os.walk(d):
            for f in files:
                fd = os.open(os.path.join(root, f), os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def write_results(out: str, name: str, text: str, result: dict) -> None:
    """Prints `text` and writes it and `result` to <out>/<today>-<name>.md and .json (bench/results/)."""
    print(text)
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, f"{datetime.date.today().isoformat()}-{name}")
    with open(stem + ".md", "w") as f:
        f.write(text)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)


def make_state(frozen_gib: float, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = int(frozen_gib * (1 << 30)) // 2
    layers = 16
    per = n // layers
    # bf16 weights with the spread of trained ones (normal, std 0.02).
    frozen = {
        f"layers.{i}.weight": (
            rng.standard_normal(per, dtype=np.float32) * 0.02
        ).astype(ml_dtypes.bfloat16)
        for i in range(layers)
    }
    trainable = (
        32 * MIB // 4 // 4
    )  # four fp32 tensors of 8 MiB: lora_A, lora_B, exp_avg, exp_avg_sq
    return {
        "model": {"frozen": frozen,
                  "lora": {"A": rng.standard_normal(trainable, dtype=np.float32),
                           "B": rng.standard_normal(trainable, dtype=np.float32)}},
        "optim": {"exp_avg": np.zeros(trainable, np.float32), "exp_avg_sq": np.zeros(trainable, np.float32)},
        "step": 0,
    }  # fmt: skip


def train_step(state: dict, step: int) -> None:
    for arr in (state["model"]["lora"]["A"], state["model"]["lora"]["B"], state["optim"]["exp_avg"],
                state["optim"]["exp_avg_sq"]):  # fmt: skip
        arr += np.float32(1e-3 * step)
    state["step"] = step


def assert_same(got: dict, want: dict) -> None:
    for k, v in want.items():
        if isinstance(v, dict):
            assert_same(got[k], v)
        elif isinstance(v, np.ndarray):
            assert np.array_equal(got[k].view(np.uint8), v.view(np.uint8)), k
        else:
            assert got[k] == v, k


def timed_load(path: str, want: dict, cold: bool, *dirs: str) -> float:
    if cold:
        evict(*dirs)
    start = time.perf_counter()
    got = distckpt.load(None, path)
    seconds = time.perf_counter() - start
    assert_same(got, want)
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--frozen-gib", type=float, default=2.0)
    ap.add_argument("--saves", type=int, default=10)
    ap.add_argument(
        "--dir",
        default=None,
        help="a directory on a local disk (default: a temporary one in /var/tmp)",
    )
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "..", "results")
    )
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="dckpt-incr-", dir=args.dir or "/var/tmp")
    try:
        state = make_state(args.frozen_gib)
        full_path = os.path.join(root, "step-0")
        t = time.perf_counter()
        full = distckpt.save(state, full_path)
        full_s = time.perf_counter() - t
        full_state = distckpt.load(None, full_path)
        rows = []
        prev = "step-0"
        for step in range(1, args.saves + 1):
            train_step(state, step)
            path = os.path.join(root, f"step-{step}")
            t = time.perf_counter()
            s = distckpt.save(state, path, base=prev)
            rows.append({"step": step, "seconds": time.perf_counter() - t, "bytes_written": s.bytes_written,
                         "bytes_reused": s.bytes_reused})  # fmt: skip
            prev = f"step-{step}"
        last = os.path.join(root, prev)
        with distckpt.open(last) as r:
            bases, chain = r.metadata.bases, r.metadata.chain_length
        load_full_cold = timed_load(full_path, full_state, True, root)
        load_incr_cold = timed_load(last, state, True, root)
        load_full_warm = min(timed_load(full_path, full_state, False) for _ in range(2))
        load_incr_warm = min(timed_load(last, state, False) for _ in range(2))
        t = time.perf_counter()
        flat = distckpt.flatten(last, os.path.join(root, "flat"))
        flatten_s = time.perf_counter() - t
    finally:
        shutil.rmtree(root, ignore_errors=True)

    incr_s = statistics.median(r["seconds"] for r in rows)
    incr_bytes = max(r["bytes_written"] for r in rows)
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(), "frozen_gib": args.frozen_gib, "saves": args.saves,
        "full": {"seconds": full_s, "bytes_written": full.bytes_written, "gb_per_s": full.bytes_written / full_s / 1e9},
        "incremental": rows, "incremental_median_seconds": incr_s, "incremental_max_bytes_written": incr_bytes,
        "bytes_ratio": incr_bytes / full.bytes_written, "time_ratio": incr_s / full_s,
        "last": {"bases": list(bases), "chain_length": chain},
        "load_seconds": {"full_cold": load_full_cold, "incremental_cold": load_incr_cold,
                         "full_warm": load_full_warm, "incremental_warm": load_incr_warm},
        "flatten": {"seconds": flatten_s, **flat},
    }  # fmt: skip
    lines = [
        f"# Incremental checkpoints, {result['date']} ({result['host']}, {result['cpus']} CPUs)",
        "",
        f"`{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        "",
        (
            f"Fine-tuning state: {args.frozen_gib:g} GiB frozen bf16 (16 tensors) + 32 MiB trainable fp32 (LoRA A/B, "
            "Adam exp_avg/exp_avg_sq); every save fsynced to a local disk."
        ),
        "",
        "| | seconds | data bytes written | ratio to the full save (bytes / time) |",
        "|---|---|---|---|",
        f"| full save | {full_s:.3f} | {full.bytes_written / MIB:.1f} MiB ({result['full']['gb_per_s']:.2f} GB/s) | 1 / 1 |",
    ]
    for r in rows:
        lines.append(f"| incremental save {r['step']} | {r['seconds']:.3f} | {r['bytes_written'] / MIB:.1f} MiB "
                     f"({r['bytes_reused'] / MIB:.0f} MiB referred to) | {r['bytes_written'] / full.bytes_written:.4f} "
                     f"/ {r['seconds'] / full_s:.3f} |")  # fmt: skip
    ls = result["load_seconds"]
    lines += [
        "",
        (
            f"Median incremental save: **{incr_s / full_s:.3f}x** the full save's time (target <= 0.1x); largest "
            f"written: **{incr_bytes / full.bytes_written:.4f}x** its bytes (target <= 0.03x)."
        ),
        f"The last one (chain {chain}) refers to {', '.join(bases)}.",
        "",
        (
            f"Load, pages evicted: full {ls['full_cold']:.3f} s, last incremental {ls['incremental_cold']:.3f} s "
            f"({ls['incremental_cold'] / ls['full_cold']:.2f}x); warm: {ls['full_warm']:.3f} s vs "
            f"{ls['incremental_warm']:.3f} s ({ls['incremental_warm'] / ls['full_warm']:.2f}x). Every value compared."
        ),
        (
            f"Flatten of the last one: {flatten_s:.3f} s for {flat['bytes_copied'] / MIB:.0f} MiB "
            f"({flat['bytes_from_bases'] / MIB:.0f} MiB from its bases)."
        ),
    ]
    write_results(args.out, "incremental-vm", "\n".join(lines) + "\n", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
