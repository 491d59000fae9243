"""The safetensors header parser of the importer (interop.import_safetensors), on its own.

It needs neither numpy nor the native extension, so that the fuzz target (python/fuzz/safetensors_header_fuzz.py)
can run it alone. Every failure on bad input is a distckpt error: CorruptCheckpointError for a malformed file,
UnsupportedError for a valid one that distckpt cannot hold (a dtype it lacks, more than 8 dimensions).
"""

from __future__ import annotations

import json
from typing import Any, BinaryIO, Dict, List, Tuple

from .errors import CorruptCheckpointError, UnsupportedError

__all__ = ["MAX_HEADER", "MAX_DIMS", "ST_DTYPES", "ITEMSIZE", "parse_header"]

#: safetensors dtype -> distckpt C enum name. F4, F6_* and F8_E8M0 have no distckpt dtype.
ST_DTYPES: Dict[str, str] = {
    "BOOL": "BOOL", "U8": "U8", "I8": "I8", "U16": "U16", "I16": "I16", "U32": "U32", "I32": "I32", "U64": "U64",
    "I64": "I64", "F16": "F16", "BF16": "BF16", "F32": "F32", "F64": "F64", "C64": "C64", "F8_E4M3": "F8_E4M3FN",
    "F8_E5M2": "F8_E5M2",
}  # fmt: skip
#: Bytes per element of each safetensors dtype above (the same sizes as core/base/dtype.cc).
ITEMSIZE: Dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8, "I64": 8, "F16": 2, "BF16": 2,
    "F32": 4, "F64": 8, "C64": 8, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip
MAX_HEADER = 100_000_000  # safetensors' own limit
MAX_DIMS = 8  # core/base/box.h kMaxDims
_U64 = 1 << 64


def _is_int(x: Any) -> bool:
    return type(x) is int  # JSON true/false are bools, which isinstance(x, int) would take for 1 and 0


def _object_no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


class _DuplicateKey(Exception):
    pass


def parse_header(f: BinaryIO, size: int, path: str) -> Tuple[Dict[str, Any], int]:
    """(header, data start) of the safetensors file open as ``f`` (at its start), ``size`` bytes long.

    Every offset is checked before use: on success each tensor's dtype is one of ST_DTYPES, its shape a list of at
    most MAX_DIMS integers in [0, 2^64), and its data_offsets [begin, end] lie inside the data section with
    end - begin equal to the bytes its shape and dtype need. ``__metadata__``, if present, maps strings to strings.
    """
    head = f.read(8)
    if len(head) != 8:
        raise CorruptCheckpointError(f"'{path}' is not a safetensors file: shorter than 8 bytes")
    n = int.from_bytes(head, "little")
    if n > MAX_HEADER or 8 + n > size:
        raise CorruptCheckpointError(f"'{path}': header length {n} is invalid for a file of {size} bytes")
    raw = f.read(n)
    if len(raw) != n:
        raise CorruptCheckpointError(f"'{path}': the file ends inside its {n}-byte header")
    try:
        header = json.loads(raw, object_pairs_hook=_object_no_duplicates)
    except _DuplicateKey as e:
        raise CorruptCheckpointError(f"'{path}': the header has the key {str(e)[:200]!r} twice") from None
    except RecursionError:
        raise CorruptCheckpointError(f"'{path}': the header is nested too deeply") from None
    except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CorruptCheckpointError(f"'{path}': the header is not JSON ({str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"'{path}': the header is not a JSON object")
    data_size = size - 8 - n
    for name, info in header.items():
        shown = repr(name[:200])
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise CorruptCheckpointError(f"'{path}': __metadata__ must map strings to strings")
            continue
        if not isinstance(info, dict):
            raise CorruptCheckpointError(f"'{path}': tensor {shown} is not described by a JSON object")
        try:
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        except KeyError:
            raise CorruptCheckpointError(f"'{path}': tensor {shown} lacks dtype, shape or data_offsets") from None
        if not isinstance(dtype, str):
            raise CorruptCheckpointError(f"'{path}': tensor {shown} has a dtype that is not a string")
        if dtype not in ST_DTYPES:
            raise UnsupportedError(
                f"'{path}': tensor {shown} has dtype {dtype[:50]!r}, which distckpt does not support"
            )
        if not (isinstance(shape, list) and all(_is_int(d) and 0 <= d < _U64 for d in shape)):
            raise CorruptCheckpointError(f"'{path}': tensor {shown} has an invalid shape")
        if len(shape) > MAX_DIMS:
            raise UnsupportedError(
                f"'{path}': tensor {shown} has {len(shape)} dimensions; distckpt supports at most {MAX_DIMS}"
            )
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise CorruptCheckpointError(f"'{path}': tensor {shown} has invalid data_offsets")
        begin, end = offsets
        if not (_is_int(begin) and _is_int(end) and 0 <= begin <= end <= data_size):
            raise CorruptCheckpointError(f"'{path}': tensor {shown} has data_offsets outside the file")
        nbytes = ITEMSIZE[dtype]
        for d in shape:
            nbytes *= d
        if end - begin != nbytes:
            raise CorruptCheckpointError(
                f"'{path}': tensor {shown} spans {end - begin} bytes; its shape and dtype need {nbytes}"
            )
    return header, 8 + n
