"""Prints one line per tensor of a checkpoint: name, dtype, shape and the FNV-1a 64 digest of its row-major bytes,
read through the Python package. tests/crosslang/run.sh compares it with the Rust and Go readers. On a read error
prints "ERROR <tensor>: <message>" and exits 1."""
import sys

import numpy as np

import distckpt


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main() -> int:
    path = sys.argv[1]
    failed = False
    reader = distckpt.open(path)
    for name in sorted(reader.metadata):
        entry = reader.metadata[name]
        if entry.kind != "tensor":
            continue
        try:
            data = np.ascontiguousarray(reader.read(name)).tobytes()
        except distckpt.Error as e:
            print(f"ERROR {name}: {type(e).__name__}: {e}")
            failed = True
            continue
        print(f"{name} {entry.dtype} {list(entry.shape)} {fnv1a64(data):016x}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
