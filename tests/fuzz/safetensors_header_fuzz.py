"""Fuzz target (atheris) for the safetensors importer's header parser, distckpt._safetensors_header.parse_header.

Run by scripts/fuzz.sh; python/tests/test_fuzz_regressions.py replays tests/fuzz/regressions/safetensors_header/.
Property: on any bytes the parser either raises a distckpt error (CorruptCheckpointError, UnsupportedError...) or
returns a header whose every tensor has a known dtype, a shape of at most 8 dimensions in [0, 2^64), and data offsets
inside the file that span exactly shape * itemsize bytes. Anything else (KeyError, TypeError, OverflowError,
RecursionError, MemoryError, a broken property) is a finding.

The first input byte chooses the file: bit 0 clear, the rest as it is; set, the rest is the JSON header, framed with
its correct length and followed by 16 * (second byte) zero bytes of data, so that mutations reach the JSON checks.
"""

from __future__ import annotations

import io
import json
import struct
import sys
from pathlib import Path
from typing import Dict

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

st = _harness.module("_safetensors_header")
errors = _harness.module("errors")


def frame(data: bytes) -> bytes:
    if not data or not data[0] & 1:
        return data[1:]
    pad = 16 * data[1] if len(data) > 1 else 0
    header = data[2:]
    return struct.pack("<Q", len(header)) + header + bytes(pad)


def TestOneInput(data: bytes) -> None:  # noqa: N802 - atheris' name
    file = frame(data)
    try:
        header, start = st.parse_header(io.BytesIO(file), len(file), "fuzz.safetensors")
    except errors.Error:
        return
    assert isinstance(header, dict) and 8 <= start <= len(file)
    data_size = len(file) - start
    for name, info in header.items():
        if name == "__metadata__":
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in info.items())
            continue
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        assert dtype in st.ST_DTYPES, dtype
        assert len(shape) <= st.MAX_DIMS and all(type(d) is int and 0 <= d < 2**64 for d in shape), shape
        assert type(begin) is int and type(end) is int and 0 <= begin <= end <= data_size
        n = st.ITEMSIZE[dtype]
        for d in shape:
            n *= d
        assert end - begin == n


def make_seeds() -> Dict[str, bytes]:
    """Files as the safetensors library writes them (sorted keys, 8-byte aligned header padded with spaces)."""

    def write(tensors: Dict[str, tuple], metadata: Dict[str, str] = None) -> bytes:
        header: Dict[str, object] = {}
        if metadata is not None:
            header["__metadata__"] = metadata
        offset = 0
        for name, (dtype, shape) in sorted(tensors.items()):
            n = st.ITEMSIZE[dtype]
            for d in shape:
                n *= d
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw + bytes(offset)

    files = {
        "model": write({"embed.weight": ("BF16", (16, 8)), "lm_head.bias": ("F32", (16,)), "step": ("I64", ())},
                       {"format": "pt"}),
        "all-dtypes": write({f"t_{d}": (d, (2, 3)) for d in st.ST_DTYPES}),
        "empty": write({}),
        "zero-size": write({"z": ("F16", (0, 4)), "s": ("U8", (1, 1, 1, 1, 1, 1, 1, 1))}),
    }
    seeds = {f"{k}.safetensors": b"\x00" + v for k, v in files.items()}
    for k, v in files.items():  # framed form: header only
        n = struct.unpack("<Q", v[:8])[0]
        seeds[f"{k}.header"] = b"\x01" + bytes([min(255, (len(v) - 8 - n + 15) // 16)]) + v[8 : 8 + n]
    return seeds


if __name__ == "__main__":
    _harness.main(TestOneInput, make_seeds)
