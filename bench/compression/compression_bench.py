#!/usr/bin/env python3
"""Compressed checkpoints (``distckpt.save(..., compression="zstd")``, core/format/FORMAT.md 4.2) against raw ones, in
one run, on the states of issue 41:

- dense bf16 weights shaped like TinyLlama-1.1B's (hidden 2048, GQA k/v of 256, MLP 5632, vocabulary 32000; as many
  layers as --weights-gib holds), drawn as trained weights are spread (normal, std 0.02; norms near 1): synthetic,
  no trained model can be fetched here;
- fp32 Adam state for them (exp_avg normal with std 1e-4, exp_avg_sq its square plus noise), --adam-gib in all.

For each: the stored size against the raw size and against the `zstd` program (same level) on the same byte-grouped
bytes, whole tensors at once; durable save throughput (fsync) with and without compression against fio's sequential
write of the same disk; load throughput with pages evicted and warm. Then a --s3-mib slice of the weights from a
loopback moto server through a proxy that is a 1 Gbit/s link (python/tests/_s3_faults.py, rate=125e6 B/s): raw and
compressed loads. Every load's values are compared with the saved ones.

    .venv/bin/python bench/compression/compression_bench.py [--weights-gib 1] [--adam-gib 0.5] [--s3-mib 256]
        [--level 1] [--repeat 3] [--dir DIR] [--out bench/results]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import distckpt
import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(
    0, os.path.join(HERE, "..", "..", "python", "tests")
)  # the tests' moto server and link proxy
sys.path.insert(0, os.path.join(HERE, "..", "incremental"))
from incremental_bench import evict, write_results

MIB = 1 << 20
HIDDEN, KV, MLP, VOCAB = 2048, 256, 5632, 32000


def weights(gib: float, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(
            ml_dtypes.bfloat16
        )

    def norm() -> np.ndarray:
        return (1 + rng.standard_normal(HIDDEN, dtype=np.float32) * 0.05).astype(
            ml_dtypes.bfloat16
        )

    per_layer = 2 * (HIDDEN * HIDDEN + HIDDEN * KV) + 3 * HIDDEN * MLP + 2 * HIDDEN
    layers = max(1, round((gib * (1 << 30) / 2 - 2 * VOCAB * HIDDEN) / per_layer))
    state = {
        "embed_tokens": w(VOCAB, HIDDEN),
        "lm_head": w(VOCAB, HIDDEN),
        "norm": norm(),
    }
    for i in range(layers):
        state[f"layers.{i}"] = {
            "q_proj": w(HIDDEN, HIDDEN), "k_proj": w(KV, HIDDEN), "v_proj": w(KV, HIDDEN), "o_proj": w(HIDDEN, HIDDEN),
            "gate_proj": w(MLP, HIDDEN), "up_proj": w(MLP, HIDDEN), "down_proj": w(HIDDEN, MLP),
            "input_layernorm": norm(), "post_attention_layernorm": norm(),
        }  # fmt: skip
    return state


def adam(gib: float, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    n = int(gib * (1 << 30)) // 8  # two fp32 tensors
    per = n // 8
    out = {}
    for i in range(8):
        g = rng.standard_normal(per, dtype=np.float32) * np.float32(1e-4)
        out[f"exp_avg.{i}"] = g
        out[f"exp_avg_sq.{i}"] = g * g + np.abs(
            rng.standard_normal(per, dtype=np.float32)
        ) * np.float32(1e-10)
    return out


def leaves(state: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def nbytes(state: dict) -> int:
    return sum(a.nbytes for a in leaves(state).values())


def grouped(a: np.ndarray) -> bytes:
    """The tensor's bytes grouped by position in the element (FORMAT.md 4.2), over the whole tensor."""
    w = a.dtype.itemsize
    raw = np.ascontiguousarray(a).view(np.uint8).reshape(-1, w)
    return raw.T.tobytes() if w in (2, 4, 8) else raw.tobytes()


def zstd_program(state: dict, level: int, group: bool) -> dict:
    """Bytes and seconds of `zstd -<level>` (one thread) over every tensor's (grouped) bytes, one tensor at a time."""
    size, seconds = 0, 0.0
    for a in leaves(state).values():
        data = grouped(a) if group else np.ascontiguousarray(a).view(np.uint8).tobytes()
        t = time.perf_counter()
        out = subprocess.run(["zstd", f"-{level}" if level > 0 else f"--fast={-level}", "-c", "-q"], input=data,
                             stdout=subprocess.PIPE, check=True).stdout  # fmt: skip
        seconds += time.perf_counter() - t
        size += len(out)
    return {"bytes": size, "seconds": seconds}


def same(got: dict, want: dict) -> None:
    g, w = leaves(got), leaves(want)
    for k, v in w.items():
        assert np.array_equal(np.asarray(g[k]).view(np.uint8), v.view(np.uint8)), k


def fio_write(directory: str, mib: int) -> float | None:
    """fio's sequential write of mib MiB with a final fsync, in GB/s (None without fio)."""
    if not shutil.which("fio"):
        return None
    out = subprocess.run(["fio", "--name=limit", f"--directory={directory}", "--rw=write", "--bs=1M",
                          f"--size={mib}M", "--numjobs=1", "--end_fsync=1", "--output-format=json"],
                         stdout=subprocess.PIPE, check=True, text=True).stdout  # fmt: skip
    job = json.loads(out[out.index("{") :])["jobs"][0]["write"]
    for f in os.listdir(directory):
        if f.startswith("limit"):
            os.remove(os.path.join(directory, f))
    return job["bw_bytes"] / 1e9


def measure(
    name: str, state: dict, root: str, level: int, zstd_level: int, repeat: int
) -> dict:
    total = nbytes(state)
    saves = {"raw": [], "zstd": []}
    stored = {}
    for i in range(repeat):  # interleaved, so both see the same disk
        for kind in ("raw", "zstd"):
            path = os.path.join(root, f"{name}-{kind}-{i}")
            t = time.perf_counter()
            s = distckpt.save(
                state,
                path,
                compression=None if kind == "raw" else "zstd",
                compression_level=level,
            )
            saves[kind].append(time.perf_counter() - t)
            stored[kind] = s.bytes_written
    loads = {
        f"{kind} {temp}": [] for kind in ("raw", "zstd") for temp in ("cold", "warm")
    }
    for i in range(repeat):
        for kind in ("raw", "zstd"):
            path = os.path.join(root, f"{name}-{kind}-0")
            for temp in ("cold", "warm"):
                if temp == "cold":
                    evict(path)
                t = time.perf_counter()
                got = distckpt.load(None, path)
                loads[f"{kind} {temp}"].append(time.perf_counter() - t)
                if i == 0:
                    same(got, state)
                del got
    for i in range(repeat):
        for kind in ("raw", "zstd"):
            shutil.rmtree(os.path.join(root, f"{name}-{kind}-{i}"), ignore_errors=True)
    program = zstd_program(state, zstd_level, group=True)
    plain = zstd_program(state, zstd_level, group=False)
    med = {k: statistics.median(v) for k, v in {**saves, **loads}.items()}
    return {
        "bytes": total, "stored": stored, "ratio": stored["zstd"] / total,
        "zstd_program_grouped": program, "zstd_program_plain": plain,
        "vs_zstd_program": stored["zstd"] / program["bytes"],
        "save_seconds": saves, "load_seconds": loads, "median": med,
        "save_gb_s": {k: total / med[k] / 1e9 for k in ("raw", "zstd")},
        "load_gb_s": {k: total / med[k] / 1e9 for k in loads},
    }  # fmt: skip


def s3_loads(state: dict, level: int, repeat: int, rate: float) -> dict:
    import _s3_faults
    import _s3_server

    server = _s3_server.MotoServer()
    try:
        os.environ.update(server.env())
        server.client().create_bucket(Bucket="bench")
        direct = distckpt.storage.S3Storage(server.endpoint)
        for kind in ("raw", "zstd"):
            distckpt.save(state, f"s3://bench/{kind}", storage=direct, compression=None if kind == "raw" else "zstd",
                          compression_level=level)  # fmt: skip
        out = {"raw": [], "zstd": []}
        with _s3_faults.FaultProxy(server.endpoint, rate=rate) as proxy:
            slow = distckpt.storage.S3Storage(proxy.endpoint)
            for i in range(repeat):
                for kind in ("raw", "zstd"):
                    t = time.perf_counter()
                    got = distckpt.load(None, f"s3://bench/{kind}", storage=slow)
                    out[kind].append(time.perf_counter() - t)
                    if i == 0:
                        same(got, state)
        return {"rate_bytes_per_s": rate, "bytes": nbytes(state), "seconds": out,
                "median": {k: statistics.median(v) for k, v in out.items()}}  # fmt: skip
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--weights-gib", type=float, default=1.0)
    ap.add_argument("--adam-gib", type=float, default=0.5)
    ap.add_argument("--s3-mib", type=int, default=256, help="0: no S3 part")
    ap.add_argument(
        "--level",
        type=int,
        default=0,
        help="distckpt's compression_level (0: entropy coding only)",
    )
    ap.add_argument(
        "--zstd-level",
        type=int,
        default=1,
        help="the `zstd` program's level compared with",
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--dir",
        default=None,
        help="a directory on a local disk (default: a temporary one in /var/tmp)",
    )
    ap.add_argument("--out", default=os.path.join(HERE, "..", "results"))
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="dckpt-zstd-", dir=args.dir or "/var/tmp")
    try:
        fio = fio_write(root, int(args.weights_gib * 1024))
        w = weights(args.weights_gib)
        results = {
            "weights": measure(
                "weights", w, root, args.level, args.zstd_level, args.repeat
            )
        }
        s3 = None
        if args.s3_mib:
            part, size = {}, 0
            for k, v in leaves(w).items():
                if size + v.nbytes > args.s3_mib * MIB and part:
                    break
                part[k], size = v, size + v.nbytes
            s3 = s3_loads(part, args.level, args.repeat, 125e6)
        del w
        results["adam"] = measure(
            "adam", adam(args.adam_gib), root, args.level, args.zstd_level, args.repeat
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)

    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "host": platform.node(),
        "cpus": os.cpu_count(), "level": args.level, "zstd_level": args.zstd_level, "repeat": args.repeat,
        "fio_write_gb_s": fio, **results,
        "s3": s3,
    }  # fmt: skip
    lines = [
        f"# Compressed checkpoints, {result['date']} ({result['host']}, {result['cpus']} CPUs)",
        "",
        f"`{' '.join([os.path.basename(sys.executable)] + sys.argv)}`",
        "",
        f"compression level {args.level} ({'entropy coding only' if args.level == 0 else 'zstd with match finding'}); "
        f"medians of {args.repeat}; every save fsynced to a local disk"
        + (
            f" (fio sequential write with fsync: {fio:.2f} GB/s)."
            if fio
            else " (fio not installed)."
        ),
        "",
        (
            f"| state | raw | stored | ratio | `zstd -{args.zstd_level}` on the grouped bytes | ours / zstd | "
            f"`zstd -{args.zstd_level}` ungrouped |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in (
        ("weights", "bf16 weights (TinyLlama-like)"),
        ("adam", "fp32 Adam exp_avg/exp_avg_sq"),
    ):
        r = results[name]
        lines.append(
            f"| {label} | {r['bytes'] / MIB:.0f} MiB | {r['stored']['zstd'] / MIB:.0f} MiB | **{r['ratio']:.3f}** | "
            f"{r['zstd_program_grouped']['bytes'] / MIB:.0f} MiB | **{r['vs_zstd_program']:.3f}** | "
            f"{r['zstd_program_plain']['bytes'] / r['bytes']:.3f} of raw |"
        )
    header = ("| state | save raw | save zstd | zstd / raw | load cold raw | load cold zstd | cold zstd / raw | "
              "load warm raw | load warm zstd | warm zstd / raw |")  # fmt: skip
    lines += ["", header, "|---|---|---|---|---|---|---|---|---|---|"]
    for name in ("weights", "adam"):
        g = results[name]["save_gb_s"]
        ld = results[name]["load_gb_s"]
        lines.append(
            f"| {name} | {g['raw']:.2f} GB/s | {g['zstd']:.2f} GB/s | **{g['zstd'] / g['raw']:.2f}** | "
            f"{ld['raw cold']:.2f} GB/s | {ld['zstd cold']:.2f} GB/s | **{ld['zstd cold'] / ld['raw cold']:.2f}** | "
            f"{ld['raw warm']:.2f} GB/s | {ld['zstd warm']:.2f} GB/s | **{ld['zstd warm'] / ld['raw warm']:.2f}** |"
        )
    if s3:
        m = s3["median"]
        line = (f"S3 (moto on loopback behind a 1 Gbit/s link), {s3['bytes'] / MIB:.0f} MiB of the weights: load raw "
                f"{m['raw']:.2f} s, compressed {m['zstd']:.2f} s (**{m['raw'] / m['zstd']:.2f}x** faster).")  # fmt: skip
        lines += ["", line]
    write_results(args.out, "compression-vm", "\n".join(lines) + "\n", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
