"""Array adapters: numpy, torch, JAX, DLPack and buffer-protocol arrays <-> the host memory the C core reads and fills.

Saving takes each array's memory as it is whenever it is host-resident and C-contiguous (zero copy); otherwise it
makes one contiguous host copy (device memory, strided views, big-endian data). Loading fills numpy arrays and CPU
torch tensors in place, straight from disk when their layout and dtype match the checkpoint, and through one
temporary buffer otherwise (device tensors, strided views, a different dtype: values are then converted as numpy's
``astype`` or torch's ``copy_`` would). JAX arrays are immutable: loading builds a new array with the target's
sharding, and the caller's container gets the new array.

torch and JAX are never imported here: a value can only be a torch tensor or a JAX array if its library is already
in ``sys.modules``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _dtypes
from .errors import InvalidArgumentError, UnsupportedError
from .sharding import Shard

Shape = Tuple[int, ...]


@dataclass
class Piece:
    """The box [offsets, offsets + lengths) of a tensor, held row-major in ``data`` (any dtype of the right size)."""

    offsets: Shape
    lengths: Shape
    data: np.ndarray


@dataclass
class SourceTensor:
    code: int
    shape: Shape
    pieces: List[Piece]


#: What ``TargetTensor.finish`` returns when the target was filled in place.
SAME = object()


@dataclass
class TargetTensor:
    pieces: List[Piece]
    #: Runs after the load: copies temporaries back, or builds the new value. Returns SAME or the new value.
    finish: Optional[Callable[[], Any]] = None


def bytes_view(a: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 view (what the extension hands to the C ABI)."""
    return a.reshape(-1).view(np.uint8)


# ---- Library detection (no imports) -----------------------------------------------------------------------------


def _torch() -> Any:
    return sys.modules.get("torch")


def _jax() -> Any:
    return sys.modules.get("jax")


def is_torch_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_jax_array(x: Any) -> bool:
    jax = _jax()
    return jax is not None and isinstance(x, jax.Array)


def is_jax_shape_dtype(x: Any) -> bool:
    jax = _jax()
    return jax is not None and isinstance(x, jax.ShapeDtypeStruct)


def is_shard_list(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(s, Shard) for s in x)


def is_array(x: Any) -> bool:
    """True for every value distckpt stores as a tensor entry (rather than as an object)."""
    if isinstance(x, (np.ndarray, Shard, memoryview)):
        return True
    if isinstance(x, np.generic):
        return _dtypes.code_of(x.dtype) is not None
    if is_torch_tensor(x) or is_jax_array(x) or is_shard_list(x):
        return True
    return hasattr(x, "__dlpack__") and not isinstance(x, (bytes, bytearray, str))


def is_load_target(x: Any) -> bool:
    """Arrays, plus descriptions of arrays to create (jax.ShapeDtypeStruct)."""
    return is_array(x) or is_jax_shape_dtype(x)


def normalize_index(index: Sequence[slice], shape: Shape) -> Tuple[Shape, Shape]:
    """A tuple of unit-step slices (as JAX and DTensor describe shards) -> (offsets, lengths)."""
    offsets, lengths = [], []
    for s, n in zip(index, shape):
        start, stop, step = s.indices(n)
        if step != 1:
            raise UnsupportedError(f"shard index {index} has a step; only contiguous shards are supported")
        offsets.append(start)
        lengths.append(max(0, stop - start))
    return tuple(offsets), tuple(lengths)


# ---- torch ------------------------------------------------------------------------------------------------------

_TORCH_NAMES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16", "uint32": "U32",
    "int32": "I32", "uint64": "U64", "int64": "I64", "float16": "F16", "bfloat16": "BF16", "float32": "F32",
    "float64": "F64", "complex64": "C64", "complex128": "C128", "float8_e4m3fn": "F8_E4M3FN",
    "float8_e5m2": "F8_E5M2",
}  # fmt: skip


def torch_code(dtype: Any, what: str) -> int:
    name = str(dtype).rsplit(".", 1)[-1]
    c_name = _TORCH_NAMES.get(name)
    if c_name is None:
        raise UnsupportedError(f"{what}: torch dtype {dtype} has no distckpt dtype")
    return _dtypes.CODES[c_name]


def torch_dtype(code: int) -> Any:
    torch = _torch()
    for name, c_name in _TORCH_NAMES.items():
        if _dtypes.CODES[c_name] == code:
            return getattr(torch, name)
    raise UnsupportedError(f"dtype {_dtypes.name(code)} has no torch dtype")


def _torch_raw_numpy(t: Any) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's bytes, for any dtype (bf16/fp8 included): shares its memory."""
    torch = _torch()
    raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
    if raw is None:  # complex128: numpy knows it
        return t.numpy()
    return (t if t.dtype == raw else t.view(raw)).numpy()


def _torch_plain(t: Any, what: str) -> Any:
    torch = _torch()
    if t.layout != torch.strided:
        raise UnsupportedError(f"{what}: {t.layout} tensors are not supported; convert to dense first")
    return t.detach()


def _torch_source(t: Any, what: str) -> Tuple[int, np.ndarray]:
    code = torch_code(t.dtype, what)
    t = _torch_plain(t, what)
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return code, _torch_raw_numpy(t)


def _torch_target(t: Any, code: int, offsets: Shape, name: str) -> TargetTensor:
    torch = _torch()
    what = f"'{name}'"
    t_code = torch_code(t.dtype, what)
    plain = _torch_plain(t, what)
    lengths = tuple(int(d) for d in plain.shape)
    if (
        plain.device.type == "cpu"
        and plain.is_contiguous()
        and t_code == code
        and not plain.is_conj()
        and not plain.is_neg()
    ):
        return TargetTensor([Piece(offsets, lengths, _torch_raw_numpy(plain))])
    tmp = torch.empty(lengths, dtype=torch_dtype(code))

    def finish() -> Any:
        with torch.no_grad():
            plain.copy_(tmp)
        return SAME

    return TargetTensor([Piece(offsets, lengths, _torch_raw_numpy(tmp))], finish)


# ---- numpy, DLPack and the buffer protocol -------------------------------------------------------------------------


def _numpy_of(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (np.generic, memoryview)):
        return np.asarray(x)
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError, ValueError):
            pass
        try:
            return np.from_dlpack(x, device="cpu")  # numpy >= 2.1: asks the producer for a host copy
        except (BufferError, TypeError, RuntimeError, ValueError):
            pass
    return np.asarray(x)


def _c_contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` itself when C-contiguous, else a C-ordered copy (np.ascontiguousarray would turn 0-d into 1-d)."""
    return a if a.flags.c_contiguous else a.copy(order="C")


def _host_source(x: Any, what: str) -> Tuple[int, np.ndarray]:
    """(code, C-contiguous native-endian host array) for a dense array of any supported kind."""
    if is_torch_tensor(x):
        return _torch_source(x, what)
    a = _numpy_of(x)
    code = _dtypes.code_of(a.dtype)
    if code is None:
        raise UnsupportedError(f"{what}: numpy dtype {a.dtype} has no distckpt dtype")
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return code, _c_contiguous(a)


def _numpy_target(a: np.ndarray, code: int, offsets: Shape, name: str) -> TargetTensor:
    a_code = _dtypes.code_of(a.dtype)
    lengths = tuple(int(d) for d in a.shape)
    if a.flags.writeable and a.flags.c_contiguous and a.dtype.isnative and a_code == code:
        return TargetTensor([Piece(offsets, lengths, a)])
    if not a.flags.writeable:
        raise InvalidArgumentError(f"cannot load '{name}' into a read-only array")
    tmp = np.empty(lengths, dtype=_dtypes.raw_dtype(code))

    def finish() -> Any:
        src = tmp.view(_dtypes.numpy_dtype(code, entry=name))
        np.copyto(a, src, casting="unsafe")
        return SAME

    return TargetTensor([Piece(offsets, lengths, tmp)], finish)


def _scalar_target(x: np.generic, code: int, name: str) -> TargetTensor:
    tmp = np.empty((), dtype=_dtypes.raw_dtype(code))

    def finish() -> Any:
        return tmp.view(_dtypes.numpy_dtype(code, entry=name)).astype(x.dtype)[()]

    return TargetTensor([Piece((), (), tmp)], finish)


# ---- JAX --------------------------------------------------------------------------------------------------------


def _jax_source(x: Any, what: str) -> SourceTensor:
    code = _dtypes.code_of(np.dtype(x.dtype))
    if code is None:
        raise UnsupportedError(f"{what}: JAX dtype {x.dtype} has no distckpt dtype")
    shape = tuple(int(d) for d in x.shape)
    pieces = []
    for s in x.addressable_shards:
        if s.replica_id != 0:  # another device holds the same box: it is written once
            continue
        offsets, lengths = normalize_index(s.index, shape)
        pieces.append(Piece(offsets, lengths, _c_contiguous(np.asarray(s.data))))
    return SourceTensor(code, shape, pieces)


def _jax_target(x: Any, code: int, shape: Shape, name: str) -> TargetTensor:
    jax = _jax()
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    dtype = np.dtype(x.dtype)
    boxes: Dict[Tuple[Shape, Shape], Piece] = {}
    for index in sharding.addressable_devices_indices_map(shape).values():
        key = normalize_index(index, shape)
        if key not in boxes:
            boxes[key] = Piece(key[0], key[1], np.empty(key[1], dtype=_dtypes.raw_dtype(code)))

    def finish() -> Any:
        stored = _dtypes.numpy_dtype(code, entry=name)
        host = {k: p.data.view(stored).astype(dtype, copy=False) for k, p in boxes.items()}
        return jax.make_array_from_callback(shape, sharding, lambda index: host[normalize_index(index, shape)])

    return TargetTensor(list(boxes.values()), finish)


# ---- Dispatch -----------------------------------------------------------------------------------------------------


def _torch_sharded(x: Any) -> Optional[List[Shard]]:
    """Shards of a DTensor or ShardedTensor; None for a plain tensor."""
    if not is_torch_tensor(x):
        return None
    from . import torch as dtorch  # noqa: PLC0415  (imports torch.distributed only when a tensor exists)

    return dtorch.to_shards(x) if dtorch.is_sharded(x) else None


def source_tensor(x: Any, name: str) -> SourceTensor:
    """Describes an array leaf for saving: dtype, global shape and this rank's pieces."""
    what = f"'{name}'"
    if is_jax_array(x):
        return _jax_source(x, what)
    torch_shards = _torch_sharded(x)
    if torch_shards is not None:
        code = torch_code(x.dtype, what)
        return SourceTensor(code, tuple(int(d) for d in x.shape), _shard_pieces(torch_shards, code, what))
    if isinstance(x, Shard) or is_shard_list(x):
        shards = [x] if isinstance(x, Shard) else list(x)
        shape = shards[0].global_shape
        if any(s.global_shape != shape for s in shards):
            raise InvalidArgumentError(f"{what}: shards disagree on the global shape: {[s.global_shape for s in shards]}")
        code, _ = _host_source(shards[0].data, what)
        return SourceTensor(code, shape, _shard_pieces(shards, code, what))
    code, a = _host_source(x, what)
    return SourceTensor(code, a.shape, [Piece((0,) * a.ndim, a.shape, a)])


def _shard_pieces(shards: Sequence[Shard], code: int, what: str) -> List[Piece]:
    pieces = []
    for s in shards:
        c, a = _host_source(s.data, what)
        if c != code:
            raise InvalidArgumentError(
                f"{what}: shards disagree on the dtype: {_dtypes.name(c)} and {_dtypes.name(code)}"
            )
        pieces.append(Piece(s.offsets, a.shape, a))
    return pieces


def target_tensor(x: Any, code: int, shape: Shape, name: str) -> TargetTensor:
    """Describes a load target (an array, shard(s), or a jax.ShapeDtypeStruct) for the stored tensor ``name``."""
    if is_jax_array(x) or is_jax_shape_dtype(x):
        _check_shape(name, tuple(int(d) for d in x.shape), shape)
        return _jax_target(x, code, shape, name)
    torch_shards = _torch_sharded(x)
    if torch_shards is not None:
        _check_shape(name, tuple(int(d) for d in x.shape), shape)
        return _merge(_local_target(s.data, code, s.offsets, name) for s in torch_shards)
    if isinstance(x, Shard) or is_shard_list(x):
        shards = [x] if isinstance(x, Shard) else list(x)
        for s in shards:
            _check_shape(name, s.global_shape, shape)
        return _merge(_local_target(s.data, code, s.offsets, name) for s in shards)
    if isinstance(x, np.generic):
        _check_shape(name, (), shape)
        return _scalar_target(x, code, name)
    lengths = tuple(int(d) for d in getattr(x, "shape", np.shape(x)))
    _check_shape(name, lengths, shape)
    return _local_target(x, code, (0,) * len(shape), name)


def _local_target(x: Any, code: int, offsets: Shape, name: str) -> TargetTensor:
    if is_torch_tensor(x):
        return _torch_target(x, code, offsets, name)
    if isinstance(x, np.ndarray):
        return _numpy_target(x, code, offsets, name)
    if isinstance(x, memoryview):
        return _numpy_target(np.asarray(x), code, offsets, name)
    raise UnsupportedError(
        f"cannot load '{name}' in place into {type(x).__module__}.{type(x).__name__}; "
        "pass numpy arrays, torch tensors or JAX arrays"
    )


def _merge(targets: Any) -> TargetTensor:
    pieces: List[Piece] = []
    finishers = []
    for t in targets:
        pieces.extend(t.pieces)
        if t.finish is not None:
            finishers.append(t.finish)

    def finish() -> Any:
        for f in finishers:
            f()
        return SAME

    return TargetTensor(pieces, finish if finishers else None)


def _check_shape(name: str, target: Shape, stored: Shape) -> None:
    if tuple(target) != tuple(stored):
        raise InvalidArgumentError(
            f"'{name}': the target's global shape {tuple(target)} differs from the checkpoint's {tuple(stored)}"
        )
