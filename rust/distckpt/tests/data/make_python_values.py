"""Writes tests/data/python_values: a checkpoint saved by distckpt's Python package, for the Rust tests of
Checkpoint::value, Checkpoint::structure_json and json::Value (tests/values.rs).

    python rust/distckpt/tests/data/make_python_values.py      # with the repository's Python package importable

Every kind of non-array leaf the Python encoder knows (python/distckpt/_tree.py): plain JSON scalars, strings with
escapes and characters beyond the BMP, lists, the tagged forms $tuple, $dict, $bytes, $float and $complex, integers
at and beyond 64 bits, one pickled object (allow_pickle=True), and array leaves inside dicts, lists and tuples plus a
numpy scalar, so the structure document has every node kind. The output is committed; the tests check the values
listed here, so change both together.
"""

import os
import shutil
import sys

import numpy as np

import distckpt

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_values")

state = {
    "model": {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "layers": [np.ones(2, dtype=np.float32), np.full(2, -1.0, dtype=np.float32)],
    },
    "pair": (np.arange(3, dtype=np.int32), "label"),
    "scale": np.float64(0.5),
    "step": 100,
    "lr": 0.001,
    "done": True,
    "nothing": None,
    "name": "run-é 🚀",
    "escapes": 'quote " backslash \\ tab \t newline \n control \x01 nul \x00 smile 😀',
    "flags": [True, None, 1.5, "x"],
    "shape": (2, 3),
    "nested": ((1, 2), [3, (4,)]),
    "cfg": [{1: "one", "$k": [1, 2], (1, 2): "tuple key"}, {"a": {"b": [1]}}],
    "blob": b"\x00\x01\xff",
    "nan": float("nan"),
    "ninf": float("-inf"),
    "z": complex(1.5, -2),
    "zinf": complex(float("inf"), float("nan")),
    "big": 2**64 + 1,
    "neg": -(2**63),
    "u64max": 2**64 - 1,
    "obj": {1, 2},
}

if os.path.exists(OUT):
    shutil.rmtree(OUT)
distckpt.save(state, OUT, allow_pickle=True, user_metadata={"framework": "numpy"})
print(f"wrote {OUT} with distckpt {getattr(distckpt, '__version__', '?')} (python {sys.version.split()[0]})")
