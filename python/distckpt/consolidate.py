"""One file from a checkpoint, and a checkpoint from one file: ``torch.save`` files and single safetensors files.

:func:`consolidate` writes a whole checkpoint, however many ranks saved it, as ONE file for tools that load a single
file (inference servers, evaluation harnesses, ``torch.load``):

- ``"torch"``: a ``torch.save`` file holding the nested state dict, as torch's ``dcp_to_torch_save`` and Lightning's
  ``consolidate_checkpoint`` produce: the nesting the checkpoint was saved with (dicts, lists, tuples) rebuilt, every
  tensor a CPU ``torch.Tensor`` of its stored dtype, plain values (numbers, strings, lists...) kept as they are. It
  loads with ``torch.load(path, weights_only=True)``.
- ``"safetensors"``: every tensor in one ``.safetensors`` file (entry names as keys), through the C++ core's
  streaming exporter; values that are not tensors have no place in the format and are left out.

Memory stays bounded for both. The torch format is a zip archive with one record per tensor storage; this module
writes that archive itself (torch is not even imported): the pickle describing the state is small and built first,
then each tensor's bytes are read from the checkpoint in C-order pieces of at most ``max_memory / 2`` bytes and
streamed into the tensor's record (two buffers: the next piece is read while the previous one is written). The file
is written under a temporary name beside ``out`` and renamed into place only when complete.

:func:`import_torch_save` goes the other way: a ``torch.save`` file (``torch.load(weights_only=True, mmap=True)``, so
the tensors stay in the page cache instead of being copied into memory) saved as a checkpoint with the names
:func:`distckpt.save` gives nested dicts (``model.layers.0.weight``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import io
import itertools
import os
import pickle
import secrets
import shutil
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _dtypes, _tree
from . import reader as _reader
from ._checkpoint import SaveSummary, save
from .errors import (
    AlreadyExistsError,
    CorruptCheckpointError,
    Error,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PickleNotAllowedError,
    UnsupportedError,
)
from .interop import export_safetensors, parse_size

__all__ = ["ConsolidateSummary", "consolidate", "import_torch_save", "format_of"]

PathLike = Union[str, "os.PathLike[str]"]
ProgressFn = Callable[[int, int], Any]

#: File name suffixes and the format they mean.
SUFFIXES = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch", ".bin": "torch"}
#: The smallest --max-memory: two buffers that each hold at least one element of any dtype, with room to spare.
MIN_MEMORY = 8192
#: torch's writer aligns every record's data to 64 bytes (its ``.storage_alignment``); so does this one.
_ALIGNMENT = 64
#: What ``torch.save`` writes (torch.serialization.DEFAULT_PROTOCOL).
_PICKLE_PROTOCOL = 2


@dataclass(frozen=True)
class ConsolidateSummary:
    """What :func:`consolidate` wrote."""

    path: str  #: the file written
    format: str  #: "torch" or "safetensors"
    num_tensors: int
    num_values: int  #: values that are not tensors, written (torch) or left out (safetensors; see ``skipped``)
    skipped: Tuple[str, ...]  #: entries not in the file (safetensors: the non-tensor values)
    bytes: int  #: size of the file
    seconds: float


def format_of(out: PathLike, format: Optional[str] = None) -> str:  # noqa: A002 - the CLI flag's name
    """The output format: ``format`` if given ("torch" or "safetensors"), else the one ``out``'s suffix names."""
    if format is not None:
        if format not in ("torch", "safetensors"):
            raise InvalidArgumentError(f"unknown format {format!r}: use 'torch' or 'safetensors'")
        return format
    suffix = os.path.splitext(os.fspath(out))[1].lower()
    if suffix not in SUFFIXES:
        raise InvalidArgumentError(
            f"cannot tell the format of '{os.fspath(out)}' from its suffix: name it .safetensors, .pt, .pth or .bin, "
            "or pass format='torch' / 'safetensors'"
        )
    return SUFFIXES[suffix]


def consolidate(
    ckpt_path: PathLike,
    out: PathLike,
    *,
    format: Optional[str] = None,  # noqa: A002 - mirrors the CLI flag
    max_memory: Union[int, str] = "256MiB",
    overwrite: bool = False,
    allow_pickle: bool = False,
    verify: bool = True,
    progress: Optional[ProgressFn] = None,
) -> ConsolidateSummary:
    """Writes the checkpoint at ``ckpt_path`` as one ``torch.save`` file or one safetensors file at ``out``.

    Args:
        ckpt_path: a committed checkpoint, saved by any number of ranks.
        out: the file to write; its directory must exist. The format comes from ``format``, else from the suffix
            (.safetensors; .pt, .pth, .bin: torch).
        format: "torch" or "safetensors".
        max_memory: bytes for the copy buffers, e.g. "256MiB" (default) or "1GB": tensors of any size are copied
            through them piece by piece. The safetensors format goes through the C++ exporter, whose buffer this
            is (``export_safetensors(buffer_size=...)``).
        overwrite: replace an existing file at ``out`` (otherwise AlreadyExistsError).
        allow_pickle: the checkpoint holds pickled values: load them (only for a checkpoint you trust). A torch file
            holding them then needs ``torch.load(weights_only=False)``.
        verify: check the checksums of everything read.
        progress: ``progress(done_bytes, total_bytes)`` as tensor bytes are written.

    Returns:
        A :class:`ConsolidateSummary`. Nothing appears at ``out`` unless the whole file was written.
    """
    ckpt_path, out = os.fspath(ckpt_path), os.fspath(out)
    fmt = format_of(out, format)
    budget = parse_size(max_memory)
    if budget < MIN_MEMORY:
        raise InvalidArgumentError(f"max_memory must be at least {MIN_MEMORY} bytes, not {max_memory!r}")
    if os.path.isdir(out):
        raise InvalidArgumentError(f"'{out}' is a directory; consolidate writes one file (name it, e.g. model.pt)")
    if os.path.lexists(out) and not overwrite:
        raise AlreadyExistsError(f"'{out}' already exists; pass overwrite=True (--overwrite) to replace it")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise NotFoundError(f"the directory of '{out}' ('{parent}') does not exist")
    start = time.monotonic()
    if fmt == "safetensors":
        return _consolidate_safetensors(ckpt_path, out, parent, budget, verify, progress, start)
    with _reader.open(ckpt_path, verify=verify, allow_pickle=allow_pickle, map_files=False) as r:
        return _consolidate_torch(r, out, parent, budget, allow_pickle, progress, start)


# ---- safetensors: the core's exporter, one shard -----------------------------------------------------------------

#: A shard size no checkpoint reaches: the exporter then writes everything into one file.
_UNLIMITED = 1 << 62


def _consolidate_safetensors(ckpt_path: str, out: str, parent: str, budget: int, verify: bool,
                             progress: Optional[ProgressFn], start: float) -> ConsolidateSummary:  # fmt: skip
    with _reader.open(ckpt_path, verify=False) as r:
        tensors = [n for n, e in r.metadata.items() if e.kind == "tensor"]
        skipped = tuple(n for n, e in r.metadata.items() if e.kind != "tensor")
    # The exporter writes <prefix>-00001-of-00001.safetensors plus an index into a directory: a private one beside
    # `out` (same file system), whose single file is then renamed onto `out`.
    work = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", suffix=".tmp", dir=parent)
    try:
        files = export_safetensors(
            ckpt_path, work, _UNLIMITED, prefix="model", verify=verify, progress=progress, buffer_size=budget
        )
        shards = [f for f in files if f.endswith(".safetensors")]
        if len(shards) != 1:
            raise CorruptCheckpointError(f"exporting '{ckpt_path}' gave {len(shards)} files instead of one")
        _fsync_file(shards[0])
        os.replace(shards[0], out)
        _fsync_dir(parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ConsolidateSummary(out, "safetensors", len(tensors), len(skipped), skipped, os.path.getsize(out),
                              time.monotonic() - start)  # fmt: skip


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    try:
        _fsync_file(path)
    except OSError:  # some file systems cannot fsync a directory; the rename itself has happened
        pass


# ---- torch.save format ---------------------------------------------------------------------------------------------

# torch.save pickles a tensor whose dtype has a legacy storage class as
#   torch._utils._rebuild_tensor_v2(<persistent ('storage', torch.FloatStorage, key, 'cpu', numel)>, offset, size,
#                                    stride, requires_grad, OrderedDict())
# and one of a newer dtype (uint16, float8...) as _rebuild_tensor_v3(<('storage', torch.storage.UntypedStorage, key,
# 'cpu', nbytes)>, ..., torch.<dtype>). The same opcodes are written here, with the same globals, which
# torch.load(weights_only=True) accepts.
_LEGACY_STORAGE = {
    "BOOL": "BoolStorage", "U8": "ByteStorage", "I8": "CharStorage", "I16": "ShortStorage", "I32": "IntStorage",
    "I64": "LongStorage", "F16": "HalfStorage", "BF16": "BFloat16Storage", "F32": "FloatStorage",
    "F64": "DoubleStorage", "C64": "ComplexFloatStorage", "C128": "ComplexDoubleStorage",
}  # fmt: skip
_TORCH_DTYPE = {"U16": "uint16", "U32": "uint32", "U64": "uint64", "F8_E4M3FN": "float8_e4m3fn",
                "F8_E5M2": "float8_e5m2"}  # fmt: skip
_CODE_NAMES = {code: n for n, code in _dtypes.CODES.items()}


class _Global:
    """A module attribute pickled by name (GLOBAL opcode) without importing its module: torch need not be installed."""

    _cache: Dict[Tuple[str, str], "_Global"] = {}

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    @classmethod
    def of(cls, module: str, name: str) -> "_Global":
        """One object per name, so that the pickler memoizes it (later uses are BINGETs, as in torch's files)."""
        return cls._cache.setdefault((module, name), cls(module, name))

    def __call__(self, *args: Any) -> Any:  # pickle requires a reduce function to be callable
        raise TypeError(f"{self.module}.{self.name} is a pickling placeholder")


class _Storage:
    """A tensor's storage: record ``data/<key>`` of the archive."""

    def __init__(self, code_name: str, numel: int, nbytes: int) -> None:
        self.key: Optional[str] = None  # given by the pickler, in the order torch.save gives them: first use
        self.code_name, self.numel, self.nbytes = code_name, numel, nbytes

    def persistent_id(self) -> Tuple[Any, ...]:
        legacy = _LEGACY_STORAGE.get(self.code_name)
        if legacy is not None:
            return ("storage", _Global.of("torch", legacy), self.key, "cpu", self.numel)
        return ("storage", _Global.of("torch.storage", "UntypedStorage"), self.key, "cpu", self.nbytes)


@dataclass
class _Tensor:
    """A tensor of the checkpoint, pickled as torch.save pickles a contiguous CPU tensor."""

    name: str
    code_name: str
    shape: Tuple[int, ...]
    storage: _Storage

    def reduce(self) -> Tuple[Any, Tuple[Any, ...]]:
        stride, acc = [], 1
        for n in reversed(self.shape):
            stride.append(acc)
            acc *= n
        args: Tuple[Any, ...] = (self.storage, 0, self.shape, tuple(reversed(stride)), False, collections.OrderedDict())
        if self.code_name in _LEGACY_STORAGE:
            return _Global.of("torch._utils", "_rebuild_tensor_v2"), args
        dtype = _Global.of("torch", _TORCH_DTYPE[self.code_name])
        return _Global.of("torch._utils", "_rebuild_tensor_v3"), args + (dtype,)


class _TorchPickler(pickle._Pickler):  # type: ignore[misc,name-defined]
    """The pure-Python pickler (whose ``dispatch`` can be extended), taught the two placeholders above."""

    dispatch = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.storages: List[_Storage] = []  # in key order

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is not _Storage:
            return None
        if obj.key is None:
            obj.key = str(len(self.storages))
            self.storages.append(obj)
        return obj.persistent_id()

    def _save_global(self, obj: _Global) -> None:
        self.write(pickle.GLOBAL + obj.module.encode() + b"\n" + obj.name.encode() + b"\n")
        self.memoize(obj)

    def _save_tensor(self, obj: _Tensor) -> None:
        func, args = obj.reduce()
        self.save_reduce(func, args, obj=obj)

    dispatch[_Global] = _save_global
    dispatch[_Tensor] = _save_tensor


def _torch_state(r: "_reader.Reader", allow_pickle: bool) -> Tuple[Any, List[_Tensor], int]:
    """The state dict to pickle (tensors as placeholders), its tensors in storage-key order, and its value count."""
    tensors: List[_Tensor] = []
    values: Dict[str, Any] = {}
    root = r.structure
    pickled = [
        n["object"] for n in (_tree.iter_nodes(root) if root is not None else ()) if n.get("encoding") == "pickle"
    ]
    if pickled and not allow_pickle:
        raise _tree.pickle_refused(pickled, r.path)
    for name, entry in r.metadata.items():
        if entry.kind != "tensor":
            values[name] = r.read(name)
            continue
        code_name = _CODE_NAMES.get(_dtypes.code_of_name(entry.dtype))
        if code_name is None or (code_name not in _LEGACY_STORAGE and code_name not in _TORCH_DTYPE):
            raise UnsupportedError(f"checkpoint '{r.path}': tensor '{name}' has dtype {entry.dtype}, which torch lacks")
        numel = int(np.prod(entry.shape, dtype=np.int64))
        storage = _Storage(code_name, numel, entry.nbytes)
        t = _Tensor(name, code_name, tuple(int(d) for d in entry.shape), storage)
        tensors.append(t)
        values[name] = t
    num_values = len(values) - len(tensors)
    if root is None:  # no structure (another binding wrote it): a flat dict of entry names
        return values, tensors, num_values
    used = set()
    as_numbers = set()

    def get(node: Dict[str, Any]) -> Any:
        name = _tree.leaf_name(node)
        used.add(name)
        value = values[name]
        if node.get("scalar") and isinstance(value, _Tensor):  # a numpy scalar: a plain Python number, as torch keeps
            as_numbers.add(name)
            return r.read(name).item()
        return value

    tree = _build(root, get)
    for name, value in values.items():  # entries the structure does not describe (as Reader.to_dict does)
        if name not in used:
            tree.setdefault(name, value)
    # Scalars became plain values: only the tensors still in the tree get records.
    return tree, [t for t in tensors if t.name not in as_numbers], num_values + len(as_numbers)


def _build(node: Dict[str, Any], get: Callable[[Dict[str, Any]], Any]) -> Any:
    """_tree.build with interned string keys: a key repeated in the state (``weight`` in every layer) is pickled once
    and referenced after, as torch.save does for a state dict built by Python code."""
    if "dict" in node:
        return {sys.intern(k) if isinstance(k, str) else k: _build(child, get) for k, child in node["dict"]}
    if "list" in node:
        return [_build(child, get) for child in node["list"]]
    if "tuple" in node:
        return tuple(_build(child, get) for child in node["tuple"])
    return get(node)


def _pieces(shape: Sequence[int], itemsize: int, budget: int) -> Iterator[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """Boxes (offsets, lengths) that together are the tensor in C order, each at most ``budget`` bytes (and at least
    one element) and each contiguous in the tensor's C-order bytes, in file order."""
    shape = tuple(int(s) for s in shape)
    if any(s == 0 for s in shape):
        return
    ndim = len(shape)
    d, inner = ndim, itemsize  # the trailing dimensions d.. fit in one piece; dimension d-1 is split into rows
    while d > 0 and inner * shape[d - 1] <= budget:
        inner *= shape[d - 1]
        d -= 1
    if d == 0:
        yield (0,) * ndim, shape
        return
    rows = max(1, budget // inner)
    for prefix in itertools.product(*(range(s) for s in shape[: d - 1])):
        for lo in range(0, shape[d - 1], rows):
            n = min(rows, shape[d - 1] - lo)
            yield tuple(prefix) + (lo,) + (0,) * (ndim - d), (1,) * (d - 1) + (n,) + shape[d:]


class _ZipWriter:
    """The archive torch.save writes: stored (uncompressed) records under ``archive/``, each one's data 64-byte
    aligned, written from a stream (zipfile computes the CRC as bytes go by and patches the local header after)."""

    def __init__(self, f: Any) -> None:
        self._zip = zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self._file = f

    def record(self, name: str, size: int) -> Any:
        """An open record of ``size`` bytes to write() into (close it when done)."""
        info = zipfile.ZipInfo(f"archive/{name}", date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_STORED
        info.file_size, info.compress_size, info.CRC = size, 0, 0
        zip64 = size >= 1 << 30  # zipfile itself switches at 1.05 * size > 4 GiB - 1: forced well below that
        header_at = self._file.tell()
        plain = len(info.FileHeader(zip64))
        pad = -(header_at + plain) % _ALIGNMENT
        if 0 < pad < 4:  # an extra field is at least its 4-byte header
            pad += _ALIGNMENT
        if pad:  # an unregistered extra field of zeros, as torch's writer pads ("FB")
            info.extra = b"FB" + (pad - 4).to_bytes(2, "little") + bytes(pad - 4)
        handle = self._zip.open(info, mode="w", force_zip64=zip64)
        if self._file.tell() % _ALIGNMENT:
            raise AssertionError(f"record {name} of the zip archive is not {_ALIGNMENT}-byte aligned")
        return handle

    def write_bytes(self, name: str, data: bytes) -> None:
        with self.record(name, len(data)) as h:
            h.write(data)

    def close(self) -> None:
        self._zip.close()


def _consolidate_torch(r: "_reader.Reader", out: str, parent: str, budget: int, allow_pickle: bool,
                       progress: Optional[ProgressFn], start: float) -> ConsolidateSummary:  # fmt: skip
    tree, tensors, num_values = _torch_state(r, allow_pickle)
    if not isinstance(tree, dict):
        raise CorruptCheckpointError(f"checkpoint '{r.path}': its state is not a dict")
    buf = io.BytesIO()
    pickler = _TorchPickler(buf, protocol=_PICKLE_PROTOCOL)
    try:
        pickler.dump(tree)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise UnsupportedError(f"checkpoint '{r.path}': a value cannot be written for torch.load ({e})") from None
    by_storage = {id(t.storage): t for t in tensors}
    tensors = [by_storage[id(s)] for s in pickler.storages]  # records in key order, as torch.save writes them
    total = sum(t.storage.nbytes for t in tensors)
    half = budget // 2
    # Created as open() creates files (0o666 less the umask; mkstemp would make it 0o600), under a name of its own.
    tmp = os.path.join(parent, f".{os.path.basename(out)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            z = _ZipWriter(f)
            try:
                z.write_bytes("data.pkl", buf.getvalue())
                z.write_bytes(".format_version", b"1")
                z.write_bytes(".storage_alignment", str(_ALIGNMENT).encode())
                z.write_bytes("byteorder", b"little")
                _write_storages(r, z, tensors, half, total, progress)
                z.write_bytes("version", b"3\n")
                z.write_bytes(".data/serialization_id",
                              "".join(secrets.choice("0123456789") for _ in range(40)).encode())  # fmt: skip
            finally:
                z.close()  # also on failure, while the file is open (the archive is then deleted)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(parent)
    skipped: Tuple[str, ...] = ()
    return ConsolidateSummary(out, "torch", len(tensors), num_values, skipped, os.path.getsize(out),
                              time.monotonic() - start)  # fmt: skip


def _write_storages(r: "_reader.Reader", z: _ZipWriter, tensors: List[_Tensor], half: int, total: int,
                    progress: Optional[ProgressFn]) -> None:  # fmt: skip
    """Streams every tensor into its record through two buffers of ``half`` bytes: one is read while the other is
    written."""
    bufs = [np.empty(half, np.uint8), np.empty(half, np.uint8)]
    done = 0
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="distckpt-consolidate") as pool:
        for t in tensors:
            itemsize = _dtypes.itemsize(_dtypes.CODES[t.code_name])

            def read(box: Tuple[Tuple[int, ...], Tuple[int, ...]], slot: int, name: str = t.name,
                     size: int = itemsize) -> memoryview:  # fmt: skip
                offsets, lengths = box
                nbytes = int(np.prod(lengths, dtype=np.int64)) * size
                view = bufs[slot][:nbytes]
                r.readinto(name, view, offsets, lengths)
                return memoryview(view)

            first = done
            with z.record(f"data/{t.storage.key}", t.storage.nbytes) as h:
                boxes = _pieces(t.shape, itemsize, half)
                slot = 0
                box = next(boxes, None)
                pending = pool.submit(read, box, slot) if box is not None else None
                while pending is not None:
                    data = pending.result()
                    box = next(boxes, None)
                    slot ^= 1
                    pending = pool.submit(read, box, slot) if box is not None else None
                    h.write(data)
                    done += len(data)
                    if progress is not None:
                        progress(done, total)
            if done - first != t.storage.nbytes:
                raise InternalError(f"'{t.name}': wrote {done - first} bytes instead of {t.storage.nbytes}")
    if progress is not None and total == 0:
        progress(0, 0)


# ---- torch.save file -> checkpoint ----------------------------------------------------------------------------------


def import_torch_save(
    file: PathLike,
    ckpt_path: PathLike,
    *,
    overwrite: bool = False,
    weights_only: bool = True,
    mmap: bool = True,
    allow_pickle: bool = False,
    user_metadata: Optional[Mapping[str, str]] = None,
    progress: Optional[ProgressFn] = None,
) -> SaveSummary:
    """Saves the state dict in a ``torch.save`` file as a distckpt checkpoint.

    The file is read with ``torch.load(file, map_location="cpu", weights_only=weights_only, mmap=mmap)``: by
    default only plain data (tensors, numbers, strings, containers) is accepted, so a hostile file cannot run code,
    and the tensors are memory-mapped (pages come from the page cache while they are written, never all at once in
    the process's own memory; files in torch's old, pre-zip format cannot be mapped and are read whole). Nested
    dicts are flattened as :func:`distckpt.save` flattens them (``{"model": {"w": t}}`` -> entry ``model.w``), and
    the nesting is recorded so that ``distckpt.load(None, ckpt)`` and :func:`consolidate` rebuild it. Values JSON
    cannot represent need ``allow_pickle``. The user metadata records ``converted_from=torch.save`` and the file.
    """
    file, ckpt_path = os.fspath(file), os.fspath(ckpt_path)
    if not os.path.isfile(file):
        raise NotFoundError(f"torch.save file '{file}' does not exist")
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        raise UnsupportedError(f"import_torch_save needs torch ({e})") from None
    is_zip = zipfile.is_zipfile(file)
    with open(file, "rb") as f:
        legacy = f.read(2) == b"\x80\x02"  # torch's old format: pickles one after the other, protocol 2
    if not (is_zip or legacy):
        raise CorruptCheckpointError(f"'{file}' is not a torch.save file (neither a zip archive nor a pickle)")
    try:
        state = torch.load(file, map_location="cpu", weights_only=weights_only, mmap=mmap and is_zip)
    except pickle.UnpicklingError as e:
        if weights_only and "weights_only" in str(e):
            lines = str(e).splitlines()
            why = next((ln.strip() for ln in lines if "WeightsUnpickler error" in ln), lines[0])
            raise PickleNotAllowedError(
                f"'{file}' holds more than plain data (tensors, numbers, strings, containers); pass "
                f"weights_only=False (--unsafe-pickle) only for a file you trust ({why[:300]})"
            ) from None
        raise CorruptCheckpointError(f"'{file}' is not a readable torch.save file ({str(e)[:300]})") from None
    except Error:
        raise
    except Exception as e:  # noqa: BLE001 - torch's errors for a file it cannot read
        raise CorruptCheckpointError(f"'{file}' is not a readable torch.save file ({str(e)[:300]})") from None
    if not isinstance(state, Mapping):
        raise InvalidArgumentError(
            f"'{file}' holds a {type(state).__name__}, not a state dict (a dict of tensors and values)"
        )
    meta = {"converted_from": "torch.save", "source_file": os.path.basename(file)}
    meta.update(user_metadata or {})
    return save(state, ckpt_path, overwrite=overwrite, allow_pickle=allow_pickle, user_metadata=meta,
                progress=progress)  # fmt: skip
