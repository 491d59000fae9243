"""Element types: distckpt dtype codes <-> numpy dtypes (bf16 and fp8 through ml_dtypes when it is installed)."""

from __future__ import annotations

import sys
from typing import Dict, Optional

import numpy as np

from . import _native
from .errors import UnsupportedError

if sys.byteorder != "little":  # every dtype is stored little-endian and the core copies bytes as they are
    raise ImportError("distckpt supports little-endian hosts only")

CODES: Dict[str, int] = dict(_native.DTYPES)  # C enum names ("F32", "F8_E4M3FN") -> codes

# numpy dtypes that need no extra package.
_NUMPY: Dict[int, np.dtype] = {
    CODES["BOOL"]: np.dtype(np.bool_),
    CODES["U8"]: np.dtype(np.uint8),
    CODES["I8"]: np.dtype(np.int8),
    CODES["U16"]: np.dtype(np.uint16),
    CODES["I16"]: np.dtype(np.int16),
    CODES["U32"]: np.dtype(np.uint32),
    CODES["I32"]: np.dtype(np.int32),
    CODES["U64"]: np.dtype(np.uint64),
    CODES["I64"]: np.dtype(np.int64),
    CODES["F16"]: np.dtype(np.float16),
    CODES["F32"]: np.dtype(np.float32),
    CODES["F64"]: np.dtype(np.float64),
    CODES["C64"]: np.dtype(np.complex64),
    CODES["C128"]: np.dtype(np.complex128),
}
# Types numpy lacks: the ml_dtypes name for each.
_ML_DTYPES: Dict[int, str] = {
    CODES["BF16"]: "bfloat16",
    CODES["F8_E4M3FN"]: "float8_e4m3fn",
    CODES["F8_E5M2"]: "float8_e5m2",
}
_CODE_OF_NUMPY: Dict[np.dtype, int] = {dt: code for code, dt in _NUMPY.items()}
_CODE_OF_ML_NAME: Dict[str, int] = {name: code for code, name in _ML_DTYPES.items()}
# Unsigned integers of each width, to move bytes whose type numpy does not know.
_RAW: Dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: np.dtype(np.uint64),
    16: np.dtype("V16"),
}


def name(code: int) -> str:
    """The canonical (safetensors-style) name of a code: "F32", "BF16", "F8_E4M3"."""
    n = _native.dtype_name(code)
    if n is None:
        raise UnsupportedError(f"unknown dtype code {code}")
    return n


def code_of_name(dtype_name: str) -> int:
    """The code of a canonical name (``EntryMetadata.dtype``: "F32", "BF16", "F8_E4M3") or a C enum name."""
    code = CODES.get(dtype_name)
    if code is None:
        code = next((c for c in CODES.values() if name(c) == dtype_name), None)
    if code is None:
        raise UnsupportedError(f"unknown dtype {dtype_name!r}")
    return code


def itemsize(code: int) -> int:
    return int(_native.dtype_size(code))


def code_of(dtype: np.dtype) -> Optional[int]:
    """The code of a numpy dtype (native or little-endian), or None if distckpt cannot store it."""
    dtype = np.dtype(dtype)
    if dtype.byteorder == ">":
        dtype = dtype.newbyteorder("=")
    code = _CODE_OF_NUMPY.get(dtype)
    if code is None and dtype.names is None:
        # ml_dtypes' types (kind 'V' or 'f'); matched by name so that ml_dtypes need not be imported here.
        code = _CODE_OF_ML_NAME.get(dtype.name)
        if code is not None and dtype.itemsize != itemsize(code):
            code = None
    return code


def _ml_dtypes():
    try:
        import ml_dtypes  # noqa: PLC0415
    except ImportError:
        return None
    return ml_dtypes


def numpy_dtype(code: int, *, entry: str = "") -> np.dtype:
    """The numpy dtype for a code. BF16 and FP8 need ml_dtypes; without it this raises UnsupportedError."""
    dt = _NUMPY.get(code)
    if dt is not None:
        return dt
    ml_name = _ML_DTYPES.get(code)
    if ml_name is None:
        raise UnsupportedError(f"unknown dtype code {code}")
    ml = _ml_dtypes()
    if ml is None:
        what = f"entry '{entry}' is {name(code)}" if entry else f"{name(code)} arrays"
        raise UnsupportedError(
            f"{what}: numpy has no such dtype; `pip install ml_dtypes` to read it as numpy "
            "(torch targets and raw reads work without it)"
        )
    return np.dtype(getattr(ml, ml_name))


def has_numpy_dtype(code: int) -> bool:
    return code in _NUMPY or (_ML_DTYPES.get(code) is not None and _ml_dtypes() is not None)


def raw_dtype(code: int) -> np.dtype:
    """An integer dtype of the same width: moves the bytes of any code without knowing its numeric type."""
    return _RAW[itemsize(code)]
