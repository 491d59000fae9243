"""Array adapters: numpy, torch, JAX, CuPy, DLPack and buffer-protocol arrays <-> the memory the C core reads and fills.

Host arrays: saving takes each array's memory as it is whenever it is C-contiguous (zero copy); otherwise it makes
one contiguous host copy (strided views, big-endian data). Loading fills numpy arrays and CPU torch tensors in place,
straight from disk when their layout and dtype match the checkpoint, and through one temporary buffer otherwise
(strided views, a different dtype: values are then converted as numpy's ``astype`` or torch's ``copy_`` would).

CUDA arrays (torch CUDA tensors and DTensor/ShardedTensor local shards on CUDA, CuPy arrays, any object with
``__cuda_array_interface__``, JAX arrays on NVIDIA GPUs) are recognised before any host conversion and go to the core
as device pieces (``dckpt_state_add_piece_ex`` with ``DCKPT_MEMORY_CUDA``): a pointer, the device ordinal and the
stream the data is ordered on. Python never copies them to the host; the core stages them through its pinned
buffers. A non-contiguous torch tensor (or a conjugate/negative view) gets one device-side copy first. Loading fills
CUDA torch tensors and writable ``__cuda_array_interface__`` arrays in place (through one temporary device buffer and
a device-side ``copy_`` when the layout or dtype differ). See "GPU arrays" in python/README.md for streams.

JAX arrays are immutable: loading builds a new array with the target's sharding, and the caller's container gets the
new array. For JAX arrays on GPU that is still a host hop: the shards are read into host memory and ``jax`` puts them
on the devices (JAX alone offers no way to fill a device buffer it does not own).

torch, JAX and CuPy are never imported here: a value can only be one of their arrays if its library is already in
``sys.modules``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _dtypes, _native
from .errors import InvalidArgumentError, UnsupportedError
from .sharding import Shard

Shape = Tuple[int, ...]


@dataclass
class DeviceBuffer:
    """C-contiguous CUDA device memory: ``nbytes`` at ``ptr`` on device ``device``, ordered on ``stream``.

    ``stream`` is the C ABI's stream handle as an integer: 0 (NULL) is the legacy default stream, 2 the per-thread
    default stream (``CU_STREAM_PER_THREAD``), anything else a ``CUstream``. ``owner`` holds the memory (the tensor or
    array, or a temporary made for the call); the native State keeps it alive until the save or load is over.
    """

    ptr: int
    nbytes: int
    device: int
    stream: int
    owner: Any


@dataclass
class Piece:
    """The box [offsets, offsets + lengths) of a tensor, held row-major in ``data``: a host array (any dtype of the
    right size) or a ``DeviceBuffer``."""

    offsets: Shape
    lengths: Shape
    data: Union[np.ndarray, DeviceBuffer]


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


def add_piece(state: Any, name: str, piece: Piece, writable: bool) -> None:
    """Adds ``piece`` to a native State: host memory as a held buffer, device memory as a CUDA piece."""
    d = piece.data
    if isinstance(d, DeviceBuffer):
        state.add_device_piece(name, list(piece.offsets), list(piece.lengths), d.ptr, d.nbytes, d.device, d.stream,
                               d.owner)  # fmt: skip
    else:
        state.add_piece(name, list(piece.offsets), list(piece.lengths), bytes_view(d), writable)


# ---- Library detection (no imports) -----------------------------------------------------------------------------


def _torch() -> Any:
    return sys.modules.get("torch")


def _jax() -> Any:
    return sys.modules.get("jax")


def _cupy() -> Any:
    return sys.modules.get("cupy")


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
    if isinstance(x, (bytes, bytearray, str)):
        return False
    return hasattr(x, "__dlpack__") or _cuda_array_interface(x) is not None


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


def torch_raw_numpy(t: Any) -> np.ndarray:
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


def _is_torch_cuda(t: Any) -> bool:
    """A tensor in CUDA memory (not ROCm's HIP memory, which torch also calls "cuda": that goes through the host)."""
    torch = _torch()
    return t.device.type == "cuda" and getattr(torch.version, "hip", None) is None


def _torch_cuda_buffer(t: Any) -> DeviceBuffer:
    """The device memory of a contiguous CUDA tensor, ordered on the device's current torch stream."""
    torch = _torch()
    stream = torch.cuda.current_stream(t.device).cuda_stream  # 0: the legacy default stream, as in the C ABI
    return DeviceBuffer(int(t.data_ptr()), t.numel() * t.element_size(), int(t.device.index), int(stream), t)


def _torch_cuda_source(t: Any, what: str) -> Tuple[int, Shape, DeviceBuffer]:
    """A CUDA tensor as a device piece; conjugate/negative views and strided layouts are resolved on the device (one
    device-side copy, queued on the current stream, which the save waits for)."""
    code = torch_code(t.dtype, what)
    t = _torch_plain(t, what)
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return code, tuple(int(d) for d in t.shape), _torch_cuda_buffer(t)


def _torch_source(t: Any, what: str) -> Tuple[int, np.ndarray]:
    code = torch_code(t.dtype, what)
    t = _torch_plain(t, what)
    if t.device.type != "cpu":  # not CUDA (those are device pieces): ROCm, MPS, XPU, through one host copy
        t = t.to("cpu")
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return code, torch_raw_numpy(t)


def _torch_target(t: Any, code: int, offsets: Shape, name: str) -> TargetTensor:
    torch = _torch()
    what = f"'{name}'"
    t_code = torch_code(t.dtype, what)
    plain = _torch_plain(t, what)
    lengths = tuple(int(d) for d in plain.shape)
    same_layout = plain.is_contiguous() and t_code == code and not plain.is_conj() and not plain.is_neg()
    if _is_torch_cuda(plain):
        # Filled in place on the device; otherwise through one temporary device tensor and a device-side copy_.
        if same_layout:
            return TargetTensor([Piece(offsets, lengths, _torch_cuda_buffer(plain))])
        dev_tmp = torch.empty(lengths, dtype=torch_dtype(code), device=plain.device)

        def finish_device() -> Any:
            with torch.no_grad():
                plain.copy_(dev_tmp)
            return SAME

        return TargetTensor([Piece(offsets, lengths, _torch_cuda_buffer(dev_tmp))], finish_device)
    if plain.device.type == "cpu" and same_layout:
        return TargetTensor([Piece(offsets, lengths, torch_raw_numpy(plain))])
    tmp = torch.empty(lengths, dtype=torch_dtype(code))

    def finish() -> Any:
        with torch.no_grad():
            plain.copy_(tmp)
        return SAME

    return TargetTensor([Piece(offsets, lengths, torch_raw_numpy(tmp))], finish)


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


# ---- CUDA memory: __cuda_array_interface__ (CuPy, Numba, ...) and DLPack ------------------------------------------

#: DLPack's device type of CUDA memory (kDLCUDA); pinned host memory (kDLCUDAHost = 3) is host memory.
_KDL_CUDA = 2
#: __cuda_array_interface__'s stream values with a fixed meaning: 1 the legacy default stream, 2 the per-thread default
#: stream. The C ABI's NULL (0) is the legacy default stream; the driver's CU_STREAM_PER_THREAD handle is 2.
_CAI_LEGACY_STREAM = 1
_CAI_PER_THREAD_STREAM = 2
_CU_STREAM_PER_THREAD = 2
#: The C ABI's DCKPT_STREAM_READY (the data is complete: wait for nothing) and DCKPT_DEVICE_OF_POINTER (the core asks
#: the driver which device the buffer is on).
_STREAM_READY = int(_native.STREAM_READY)
_DEVICE_OF_POINTER = int(_native.DEVICE_OF_POINTER)


def _cuda_array_interface(x: Any) -> Optional[Dict[str, Any]]:
    """``x.__cuda_array_interface__``, or None when ``x`` has none. torch tensors and JAX arrays are handled by their
    own code (the property raises for CPU ones)."""
    if is_torch_tensor(x) or is_jax_array(x) or isinstance(x, (np.ndarray, np.generic, memoryview)):
        return None
    try:
        cupy = _cupy()
        if cupy is not None and isinstance(x, cupy.ndarray):
            # CuPy reports the current stream of the current device: read it with the array's device current, so that
            # an array on cuda:1 saved while cuda:0 is current is ordered on a stream of its own device.
            with cupy.cuda.Device(x.device.id):
                cai = x.__cuda_array_interface__
        else:
            cai = getattr(x, "__cuda_array_interface__", None)
    except Exception:  # noqa: BLE001 - e.g. a property that refuses host-resident data
        return None
    return cai if isinstance(cai, dict) else None


def _dlpack_cuda_ordinal(x: Any) -> Optional[int]:
    """The CUDA device ordinal of a DLPack producer whose data is in CUDA memory; None otherwise."""
    fn = getattr(x, "__dlpack_device__", None)
    if fn is None:
        return None
    try:
        kind, ordinal = fn()
    except Exception:  # noqa: BLE001 - e.g. a multi-device JAX array
        return None
    return int(ordinal) if int(kind) == _KDL_CUDA else None


def c_stream(cai_stream: Any) -> int:
    """``__cuda_array_interface__``'s ``stream`` -> dckpt_piece_options.stream (as an integer).

    None (the producer says no synchronisation is needed) becomes DCKPT_STREAM_READY: the copies wait for nothing
    (mapping it to the legacy default stream would wait for all of the device's legacy-stream work). 1 (the legacy
    default stream) becomes NULL, the C ABI's legacy default stream. 2 (the per-thread default stream) becomes
    CU_STREAM_PER_THREAD; the core records its event on the calling thread, so this is the caller's per-thread stream.
    Any other value is a CUstream handle (0 is not allowed by the interface; it is taken as the legacy stream).
    """
    if cai_stream is None:
        return _STREAM_READY
    if cai_stream == 0 or cai_stream == _CAI_LEGACY_STREAM:
        return 0
    if cai_stream == _CAI_PER_THREAD_STREAM:
        return _CU_STREAM_PER_THREAD
    return int(cai_stream)


def _cai_device(x: Any) -> int:
    """The device ordinal of a __cuda_array_interface__ array: CuPy's ``device.id``, else ``__dlpack_device__``, else
    DCKPT_DEVICE_OF_POINTER (the interface itself does not say: the core asks the driver which device the pointer is
    on)."""
    cupy = _cupy()
    if cupy is not None and isinstance(x, cupy.ndarray):
        return int(x.device.id)
    ordinal = _dlpack_cuda_ordinal(x)
    return _DEVICE_OF_POINTER if ordinal is None else ordinal


def _is_c_contiguous(shape: Shape, strides: Any, itemsize: int) -> bool:
    if strides is None:
        return True
    if any(n == 0 for n in shape):
        return True
    expect = itemsize
    for n, st in zip(reversed(shape), reversed(tuple(strides))):
        if n != 1 and int(st) != expect:
            return False
        expect *= n
    return True


@dataclass
class _CaiArray:
    code: int
    shape: Shape
    contiguous: bool
    readonly: bool
    buffer: DeviceBuffer


def _parse_cai(x: Any, cai: Dict[str, Any], what: str) -> _CaiArray:
    version = int(cai.get("version", 0))
    shape = tuple(int(d) for d in cai["shape"])
    try:
        dtype = np.dtype(cai["typestr"])
    except TypeError as e:
        raise UnsupportedError(f"{what}: __cuda_array_interface__ typestr {cai['typestr']!r} is not a dtype") from e
    if dtype.byteorder == ">" and dtype.itemsize > 1:
        raise UnsupportedError(f"{what}: big-endian device arrays ({cai['typestr']}) are not supported")
    code = _dtypes.code_of(dtype.newbyteorder("="))
    if code is None:
        raise UnsupportedError(f"{what}: __cuda_array_interface__ typestr {cai['typestr']!r} has no distckpt dtype")
    if cai.get("mask") is not None:
        raise UnsupportedError(f"{what}: masked device arrays are not supported")
    ptr, readonly = cai["data"]
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    stream = c_stream(cai.get("stream")) if version >= 3 else 0
    return _CaiArray(
        code, shape, _is_c_contiguous(shape, cai.get("strides"), dtype.itemsize), bool(readonly),
        DeviceBuffer(int(ptr or 0), nbytes, _cai_device(x), stream, x),
    )  # fmt: skip


def device_out_buffer(x: Any, code: int, lengths: Shape, what: str) -> Optional[DeviceBuffer]:
    """The memory of a CUDA array to read a box into in place (a CUDA torch tensor or a writable
    __cuda_array_interface__ array, C-contiguous, of dtype ``code`` and shape ``lengths``); None for anything that is
    not in CUDA memory."""
    if is_torch_tensor(x):
        if not _is_torch_cuda(x):
            return None
        t = _torch_plain(x, what)
        ok = t.is_contiguous() and not t.is_conj() and not t.is_neg() and torch_code(t.dtype, what) == code
        if not ok or tuple(int(d) for d in t.shape) != tuple(lengths):
            raise InvalidArgumentError(
                f"{what}: out must be a contiguous {_dtypes.name(code)} CUDA tensor of shape {tuple(lengths)}"
            )
        return _torch_cuda_buffer(t)
    cai = _cuda_array_interface(x)
    if cai is None:
        return None
    arr = _parse_cai(x, cai, what)
    if arr.readonly or not arr.contiguous or arr.code != code or arr.shape != tuple(lengths):
        raise InvalidArgumentError(
            f"{what}: out must be a writable C-contiguous {_dtypes.name(code)} device array of shape {tuple(lengths)}"
        )
    return arr.buffer


# ---- JAX --------------------------------------------------------------------------------------------------------


def _jax_cuda_buffer(a: Any) -> Optional[DeviceBuffer]:
    """The CUDA buffer of a single-device JAX array; None when it is not on an NVIDIA GPU.

    XLA orders its work on its own streams, which the caller does not hold: the array is made ready first
    (``block_until_ready``, as JAX's own ``__cuda_array_interface__`` does), so no stream needs waiting on and the
    piece names the legacy default stream (NULL).
    """
    ordinal = _dlpack_cuda_ordinal(a)
    if ordinal is None:
        return None
    a.block_until_ready()
    nbytes = int(a.size) * np.dtype(a.dtype).itemsize
    ptr = 0
    if nbytes:
        try:
            ptr = int(a.__cuda_array_interface__["data"][0])
        except Exception:  # noqa: BLE001 - dtypes the interface cannot describe (bf16, fp8)
            ptr = int(a.unsafe_buffer_pointer())
    return DeviceBuffer(ptr, nbytes, ordinal, 0, a)


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
        data = s.data
        device = _jax_cuda_buffer(data)
        pieces.append(Piece(offsets, lengths, device if device is not None else _c_contiguous(np.asarray(data))))
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
    from . import _torch_shards as dtorch  # noqa: PLC0415  (imports torch.distributed only when a tensor exists)

    return dtorch.to_shards(x) if dtorch.is_sharded(x) else None


def _device_source(x: Any, what: str) -> Optional[Tuple[int, Shape, DeviceBuffer]]:
    """(code, shape, device buffer) for an array in CUDA memory; None for anything else. Checked before any host
    conversion, so CUDA data is never copied to the host here."""
    if is_torch_tensor(x):
        return _torch_cuda_source(x, what) if _is_torch_cuda(x) else None
    if is_jax_array(x):
        buf = _jax_cuda_buffer(x)  # a single-device array (e.g. a Shard's data); None for host or sharded arrays
        if buf is None:
            return None
        code = _dtypes.code_of(np.dtype(x.dtype))
        if code is None:
            raise UnsupportedError(f"{what}: JAX dtype {x.dtype} has no distckpt dtype")
        return code, tuple(int(d) for d in x.shape), buf
    cupy = _cupy()
    if cupy is not None and isinstance(x, cupy.ndarray) and not x.flags.c_contiguous:
        x = cupy.ascontiguousarray(x)  # one device-side copy, on CuPy's current stream (which the piece names)
    cai = _cuda_array_interface(x)
    if cai is not None:
        arr = _parse_cai(x, cai, what)
        if not arr.contiguous:
            raise UnsupportedError(
                f"{what}: the device array is not C-contiguous (strides {cai.get('strides')}); make a contiguous copy "
                "on the device first"
            )
        return arr.code, arr.shape, arr.buffer
    if _dlpack_cuda_ordinal(x) is not None:
        raise UnsupportedError(
            f"{what}: {type(x).__module__}.{type(x).__name__} is in CUDA memory but has no __cuda_array_interface__; "
            "distckpt takes CUDA arrays through torch, JAX, CuPy or __cuda_array_interface__ and never copies them "
            "to the host in Python"
        )
    return None


def _source_of(x: Any, what: str) -> Tuple[int, Shape, Union[np.ndarray, DeviceBuffer]]:
    """(code, shape, memory) of one local array: device memory as it is, host memory C-contiguous."""
    device = _device_source(x, what)
    if device is not None:
        return device
    code, a = _host_source(x, what)
    return code, tuple(a.shape), a


def source_tensor(x: Any, name: str) -> SourceTensor:
    """Describes an array leaf for saving: dtype, global shape and this rank's pieces."""
    what = f"'{name}'"
    if is_jax_array(x):
        return _jax_source(x, what)
    torch_shards = _torch_sharded(x)
    if torch_shards is not None:
        code = torch_code(x.dtype, what)
        return SourceTensor(code, tuple(int(d) for d in x.shape), _shard_pieces(torch_shards, code, what)[1])
    if isinstance(x, Shard) or is_shard_list(x):
        shards = [x] if isinstance(x, Shard) else list(x)
        shape = shards[0].global_shape
        if any(s.global_shape != shape for s in shards):
            raise InvalidArgumentError(
                f"{what}: shards disagree on the global shape: {[s.global_shape for s in shards]}"
            )
        code, pieces = _shard_pieces(shards, None, what)
        return SourceTensor(code, shape, pieces)
    code, shape, data = _source_of(x, what)
    return SourceTensor(code, shape, [Piece((0,) * len(shape), shape, data)])


def _shard_pieces(shards: Sequence[Shard], code: Optional[int], what: str) -> Tuple[int, List[Piece]]:
    """The pieces of ``shards``, which must all have dtype ``code`` (None: the first shard's)."""
    pieces = []
    for s in shards:
        c, shape, data = _source_of(s.data, what)
        if code is None:
            code = c
        if c != code:
            raise InvalidArgumentError(
                f"{what}: shards disagree on the dtype: {_dtypes.name(c)} and {_dtypes.name(code)}"
            )
        pieces.append(Piece(s.offsets, shape, data))
    assert code is not None
    return code, pieces


def target_tensor(x: Any, code: int, shape: Shape, name: str, checkpoint: str) -> TargetTensor:
    """Describes a load target (an array, shard(s), or a jax.ShapeDtypeStruct) for the stored tensor ``name`` of the
    checkpoint at ``checkpoint`` (named by errors)."""
    if is_jax_array(x) or is_jax_shape_dtype(x):
        _check_shape(checkpoint, name, tuple(int(d) for d in x.shape), shape)
        return _jax_target(x, code, shape, name)
    torch_shards = _torch_sharded(x)
    if torch_shards is not None:
        _check_shape(checkpoint, name, tuple(int(d) for d in x.shape), shape)
        return _merge(_local_target(s.data, code, s.offsets, name) for s in torch_shards)
    if isinstance(x, Shard) or is_shard_list(x):
        shards = [x] if isinstance(x, Shard) else list(x)
        for s in shards:
            _check_shape(checkpoint, name, s.global_shape, shape)
        return _merge(_local_target(s.data, code, s.offsets, name) for s in shards)
    if isinstance(x, np.generic):
        _check_shape(checkpoint, name, (), shape)
        return _scalar_target(x, code, name)
    cai = _cuda_array_interface(x)
    if cai is not None:
        lengths = tuple(int(d) for d in cai["shape"])
    else:
        lengths = tuple(int(d) for d in getattr(x, "shape", np.shape(x)))
    _check_shape(checkpoint, name, lengths, shape)
    return _local_target(x, code, (0,) * len(shape), name)


def _local_target(x: Any, code: int, offsets: Shape, name: str) -> TargetTensor:
    if is_torch_tensor(x):
        return _torch_target(x, code, offsets, name)
    if isinstance(x, np.ndarray):
        return _numpy_target(x, code, offsets, name)
    if isinstance(x, memoryview):
        return _numpy_target(np.asarray(x), code, offsets, name)
    cai = _cuda_array_interface(x)
    if cai is not None:
        return _cai_target(x, cai, code, offsets, name)
    raise UnsupportedError(
        f"cannot load '{name}' in place into {type(x).__module__}.{type(x).__name__}; "
        "pass numpy arrays, torch tensors, JAX arrays or CUDA arrays with __cuda_array_interface__"
    )


def _cai_target(x: Any, cai: Dict[str, Any], code: int, offsets: Shape, name: str) -> TargetTensor:
    """A writable __cuda_array_interface__ array (CuPy, Numba, ...) filled in place on its device; a CuPy array of
    another layout or dtype through one temporary CuPy array and a device-side copy."""
    arr = _parse_cai(x, cai, f"'{name}'")
    if arr.readonly:
        raise InvalidArgumentError(f"cannot load '{name}' into a read-only device array")
    if arr.contiguous and arr.code == code:
        return TargetTensor([Piece(offsets, arr.shape, arr.buffer)])
    cupy = _cupy()
    if cupy is None or not isinstance(x, cupy.ndarray):
        raise UnsupportedError(
            f"cannot load '{name}' into a {'strided' if not arr.contiguous else _dtypes.name(arr.code)} device array "
            f"of {type(x).__module__}.{type(x).__name__}: pass a C-contiguous {_dtypes.name(code)} array (distckpt "
            "converts on the device only for torch and CuPy)"
        )
    with x.device:
        tmp = cupy.empty(arr.shape, dtype=_dtypes.raw_dtype(code))
    tmp_arr = _parse_cai(tmp, tmp.__cuda_array_interface__, f"'{name}'")

    def finish() -> Any:
        with x.device:
            cupy.copyto(x, tmp.view(_dtypes.numpy_dtype(code, entry=name)), casting="unsafe")
        return SAME

    return TargetTensor([Piece(offsets, arr.shape, tmp_arr.buffer)], finish)


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


def _check_shape(checkpoint: str, name: str, target: Shape, stored: Shape) -> None:
    if tuple(target) != tuple(stored):
        raise InvalidArgumentError(
            f"checkpoint '{checkpoint}', entry '{name}': the target's global shape {tuple(target)} differs from the "
            f"stored tensor's {tuple(stored)}; load into an array (or shards of one) of shape {tuple(stored)}"
        )
