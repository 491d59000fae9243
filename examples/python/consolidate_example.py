"""Consolidating a sharded checkpoint into one file for inference, and importing a torch.save file back.

    python examples/python/consolidate_example.py [DIR]

1. Two "ranks" (two Shards per tensor, saved from one process here; a real job passes ``comm=``) save a small
   transformer-like state dict: the linear weights split by rows, plus optimizer state, a step and a learning rate.
2. ``consolidate`` writes it as ONE ``torch.save`` file (``model.pt``), streamed through 1 MiB of buffers, which
   plain ``torch.load(weights_only=True)`` reads; every value is compared with the full tensors.
3. ``consolidate`` writes the tensors as ONE ``model.safetensors`` (what inference servers load).
4. ``import_torch_save`` turns ``model.pt`` into a distckpt checkpoint again, and it is compared with the original.

Prints what it wrote, "torch.load matches", "round trip matches", and exits non-zero if anything differs.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file

import distckpt
from distckpt.consolidate import consolidate, import_torch_save


def full_state() -> dict:
    torch.manual_seed(0)
    layers = [{"attn": {"weight": torch.randn(64, 32), "bias": torch.randn(64)},
               "mlp": {"weight": torch.randn(128, 64)}} for _ in range(2)]  # fmt: skip
    return {
        "model": {"embed": torch.randn(100, 32).to(torch.bfloat16), "layers": layers},
        "optimizer": {"state": {0: {"exp_avg": torch.zeros(100, 32), "step": 10}}, "param_groups": [{"lr": 1e-3}]},
        "step": 10,
    }


def sharded(state: dict, rank: int, world: int) -> dict:
    """What rank ``rank`` of ``world`` holds: each 2-d tensor split by rows, the rest replicated."""

    def cut(x):
        if isinstance(x, dict):
            return {k: cut(v) for k, v in x.items()}
        if isinstance(x, list):
            return [cut(v) for v in x]
        if isinstance(x, torch.Tensor) and x.dim() == 2:
            rows = x.shape[0] // world
            lo = rank * rows
            hi = x.shape[0] if rank == world - 1 else lo + rows
            return distckpt.Shard(x[lo:hi], tuple(x.shape), (lo, 0))
        return x

    return cut(state)


def same(a, b, where: str = "") -> bool:
    if isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(b, dict):
        return isinstance(a, dict) and list(a) == list(b) and all(same(a[k], b[k], f"{where}.{k}") for k in b)
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="distckpt-consolidate-")
    os.makedirs(root, exist_ok=True)
    full = full_state()
    ckpt = os.path.join(root, "ckpt")
    # Two ranks' pieces, saved as one checkpoint (in a real job each rank passes its own and comm=...).
    pieces = [sharded(full, r, 2) for r in range(2)]

    def merge(a, b):
        if isinstance(a, dict):
            return {k: merge(a[k], b[k]) for k in a}
        if isinstance(a, list):
            return [merge(x, y) for x, y in zip(a, b)]
        return [a, b] if isinstance(a, distckpt.Shard) else a

    distckpt.save(merge(*pieces), ckpt, overwrite=True)
    with distckpt.open(ckpt) as r:
        print(f"saved {ckpt}: {len(r.metadata)} entries, model.embed in {r.metadata['model.embed'].num_chunks} chunks")

    pt = os.path.join(root, "model.pt")
    s = consolidate(ckpt, pt, max_memory="1MiB", overwrite=True)
    print(f"wrote {s.path}: {s.num_tensors} tensors, {s.num_values} values, {s.bytes} bytes")
    if not same(torch.load(pt, weights_only=True), full):
        print("torch.load differs from the state dict")
        return 1
    print("torch.load matches the full state dict")

    st = os.path.join(root, "model.safetensors")
    s = consolidate(ckpt, st, overwrite=True)
    print(f"wrote {s.path}: {s.num_tensors} tensors (left out: {', '.join(s.skipped)})")
    weights = load_file(st)
    if not torch.equal(weights["model.layers.1.mlp.weight"], full["model"]["layers"][1]["mlp"]["weight"]):
        print("safetensors differs")
        return 1

    back = os.path.join(root, "imported")
    summary = import_torch_save(pt, back, overwrite=True)
    print(f"imported {pt} -> {summary.path}: {summary.num_entries} entries")
    loaded = distckpt.load(None, back)
    with distckpt.open(ckpt) as r:
        for name in r.metadata:
            with distckpt.open(back) as b:
                x, y = r.read(name), b.read(name)
            if isinstance(x, np.ndarray) and not (x.dtype == y.dtype and np.array_equal(x, y)):
                print(f"round trip differs at {name}")
                return 1
            if not isinstance(x, np.ndarray) and x != y:
                print(f"round trip differs at {name}")
                return 1
    if loaded["step"] != 10:
        return 1
    print("round trip matches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
