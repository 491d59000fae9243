"""A restricted reader for the ``.metadata`` file of a torch.distributed.checkpoint (DCP) directory.

DCP writes that file with ``pickle``, and torch reads it back with ``pickle.load``: a hostile file runs any code it
likes. This reader never does. It works in three passes over the bytes, none of which needs torch:

1. a scan of the opcodes (``pickletools.genops``): only the opcodes DCP's pickles use are allowed, every counted
   length must lie inside the file, and memo indices must be small, so the unpickler never makes a huge
   allocation on the file's say-so;
2. an unpickler whose ``find_class`` knows only the names DCP metadata holds (its dataclasses, ``torch.Size``, the
   torch dtypes, the layout and memory-format encodings, ``pathlib`` paths, ``collections.OrderedDict``) and
   resolves each to a stand-in defined here, which stores what it is given and calls nothing else; any other name
   is refused with an :class:`UnsafePickleError` naming the file and the global;
3. a check of the result against the schema: every field the importer uses has the right type and range, and the
   work is bounded by the file's size even when the pickle shares objects.

:func:`parse` returns a :class:`DcpMetadata` (plain Python values). ``import_torch_dcp`` then builds torch's own
``Metadata`` from the same bytes with :func:`to_torch`, which maps the same allow-list to torch's real classes: it
runs only once pass 1 to 3 accepted the file, so the only callables torch's unpickler reaches are those classes.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import posixpath
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from .errors import CorruptCheckpointError, UnsafePickleError

__all__ = [
    "MAX_METADATA_BYTES",
    "UnsafePickleError",
    "DcpMetadata",
    "DcpTensor",
    "DcpChunk",
    "DcpStorageInfo",
    "parse",
    "read",
    "to_torch",
]

#: The largest .metadata file read (DCP's metadata of a 1-trillion-parameter model is a few hundred MB).
MAX_METADATA_BYTES = 1 << 31
_MAX_INDEX = 1 << 63  # sizes, offsets and lengths


_META = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"

#: torch dtypes by attribute name of the ``torch`` module (what a pickled dtype names).
TORCH_DTYPES = frozenset({
    "bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "bfloat16",
    "float32", "float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "half", "float", "double",
    "short", "int", "long", "cfloat", "cdouble", "complex32", "chalf", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
})  # fmt: skip
_LAYOUTS = frozenset({"torch.strided", "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc", "torch.sparse_bsr",
                      "torch.sparse_bsc", "torch._mkldnn", "torch.jagged"})  # fmt: skip
_MEM_FORMATS = {0: "contiguous_format", 1: "channels_last", 2: "preserve_format"}

# Opcodes of protocols 0-5 that DCP's pickles (protocol 2-5 of dataclasses, tuples, dicts, lists, strings, numbers)
# may use. Left out: PERSID/BINPERSID (persistent ids), EXT1/2/4 (the copyreg extension registry), INST/OBJ (protocol
# 0 instance creation), NEXT_BUFFER/READONLY_BUFFER (out-of-band buffers), and anything unknown.
_ALLOWED_OPCODES = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
    "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_SET", "ADDITEMS", "FROZENSET",
    "GET", "BINGET", "LONG_BINGET", "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE",
    "GLOBAL", "STACK_GLOBAL", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD",
})  # fmt: skip
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


# ---- Stand-ins: what the allowed globals resolve to while parsing ---------------------------------------------------


class _Refused(Exception):
    """A stand-in refuses what the pickle does with it; _unpickle turns it into a CorruptCheckpointError."""


def _no_build(obj: Any, state: Any) -> None:
    # BUILD on anything but a record would change a shared object (a class, a function, a constant): refused, so
    # that to_torch, which replays the same opcodes over torch's real objects, never does that to torch's.
    raise _Refused(f"the pickle changes the state of {_short(obj)}, which DCP metadata never does")


class _Frozen(type):
    """Metaclass of the stand-in classes: a pickle can neither set their attributes nor BUILD on them."""

    def __setattr__(cls, name: str, value: Any) -> None:
        raise _Refused(f"the pickle sets the attribute {_short(name)} of a class")

    def __setstate__(cls, state: Any) -> None:
        _no_build(cls, state)


class _Record(metaclass=_Frozen):
    """A DCP dataclass instance as pickled: made by NEWOBJ, then given its state by BUILD (kept, unchecked)."""

    kind = ""
    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _record_class(kind: str) -> type:
    return _Frozen(kind, (_Record,), {"kind": kind})


class _Size(tuple, metaclass=_Frozen):  # torch.Size(sequence)
    __slots__ = ()


class _Token:
    """A named constant of torch (a dtype, a layout, a memory-format encoding). Immutable."""

    __slots__ = ("kind", "name")

    def __init__(self, kind: str, name: str) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "name", name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise _Refused("the pickle changes a torch constant")

    def __setstate__(self, state: Any) -> None:
        _no_build(self, state)

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name}>"


class _Function:
    """One of the functions the allow-list names (a layout by name, a memory format by number, a path)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        object.__setattr__(self, "fn", fn)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __setattr__(self, name: str, value: Any) -> None:
        raise _Refused("the pickle sets an attribute of a function")

    def __setstate__(self, state: Any) -> None:
        _no_build(self, state)


def _get_layout(name: Any) -> _Token:  # torch.serialization._get_layout("torch.strided")
    if not (isinstance(name, str) and name in _LAYOUTS):
        raise _Refused(f"unknown torch layout {str(name)[:60]!r}")
    return _Token("layout", name)


def _mem_format(value: Any) -> _Token:  # _MEM_FORMAT_ENCODING(0)
    if type(value) is not int or value not in _MEM_FORMATS:
        raise _Refused(f"unknown torch memory-format encoding {str(value)[:60]!r}")
    return _Token("memory_format", _MEM_FORMATS[value])


def _path(*parts: Any) -> str:  # pathlib.PosixPath("/", "tmp", "ckpt") -> "/tmp/ckpt"
    if not all(isinstance(p, str) for p in parts):
        raise _Refused("a pathlib path in the metadata has a part that is not a string")
    return posixpath.join("", *parts)


def _ordered_dict(*args: Any) -> Dict[Any, Any]:  # collections.OrderedDict(): filled by SETITEMS afterwards
    if args:
        raise _Refused("collections.OrderedDict is called with arguments")
    return {}


_RECORDS = ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
            "MetadataIndex", "StorageMeta", "_StorageInfo")  # fmt: skip
_STANDIN_CLASSES: Dict[str, type] = {k: _record_class(k) for k in _RECORDS}

#: (module, name) -> the stand-in the parser gives for it. to_torch resolves the same keys to torch's objects.
_ALLOWED: Dict[Tuple[str, str], Any] = {
    **{(_META, k): _STANDIN_CLASSES[k] for k in _RECORDS if k != "_StorageInfo"},
    (_FS, "_StorageInfo"): _STANDIN_CLASSES["_StorageInfo"],
    (_META, "_MEM_FORMAT_ENCODING"): _Function(_mem_format),
    ("torch", "Size"): _Size,
    ("torch.serialization", "_get_layout"): _Function(_get_layout),
    ("pathlib", "PosixPath"): _Function(_path),
    ("pathlib", "PurePosixPath"): _Function(_path),
    ("pathlib", "Path"): _Function(_path),
    ("collections", "OrderedDict"): _Function(_ordered_dict),
    **{("torch", d): _Token("dtype", d) for d in TORCH_DTYPES},
}


def _short(x: Any) -> str:
    s = x if isinstance(x, str) else type(x).__name__
    return s[:100] + ("..." if len(s) > 100 else "")


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, path: str, resolve: Callable[[str, str], Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._path = path
        self._resolve = resolve

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise UnsafePickleError(
                f"'{self._path}': the DCP metadata pickle refers to {_short(module)}.{_short(name)}, which a DCP "
                "metadata file never holds; it was not loaded (a pickle can run code; this one may be hostile)"
            )
        return self._resolve(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"'{self._path}': the DCP metadata pickle uses a persistent id")


# ---- Pass 1: the opcode scan ----------------------------------------------------------------------------------------


def _scan(data: bytes, path: str) -> bytes:
    """Checks every opcode up to STOP and returns the same pickle without its FRAME opcodes and trailing bytes.

    Frames are only a read-ahead hint, but the C unpickler honours them in its own way: a frame that starts inside
    another, or an opcode that straddles a frame's end, makes it skip bytes and parse a different opcode stream from
    the one scanned here (a fuzz finding: a nested frame led it past the scanned STOP into an unchecked length, and a
    MemoryError). Without frames both read the bytes in the same order, so what is unpickled is what was scanned.
    """
    ops = 0
    keep = []
    prev = None  # (opcode name, position) of the previous opcode, kept once its end is known
    try:
        for op, arg, pos in pickletools.genops(data):
            ops += 1
            if prev is not None and prev[0] != "FRAME":
                keep.append(data[prev[1] : pos])
            prev = (op.name, pos)
            if op.name not in _ALLOWED_OPCODES:
                raise UnsafePickleError(
                    f"'{path}': the DCP metadata pickle uses the opcode {op.name} at byte {pos}, which DCP never "
                    "writes; it was not loaded"
                )
            if op.name in _PUT_OPS and (not isinstance(arg, int) or arg < 0 or arg > ops):
                # The unpickler sizes its memo table by the index: a huge one would allocate gigabytes.
                raise CorruptCheckpointError(f"'{path}': the DCP metadata pickle has a memo index {arg} out of range")
            if op.name == "FRAME" and (not isinstance(arg, int) or arg > len(data) - pos):
                raise CorruptCheckpointError(f"'{path}': the DCP metadata pickle has a frame past its end")
            if op.name == "STOP":
                keep.append(data[pos : pos + 1])
                break
    except (ValueError, TypeError, UnicodeDecodeError, OverflowError, EOFError) as e:
        # genops raises ValueError for a truncated or unknown opcode, a bad length or a bad argument; the others for
        # malformed arguments of the text opcodes.
        raise CorruptCheckpointError(f"'{path}': the DCP metadata is not a valid pickle ({_short(str(e))})") from None
    if prev is None or prev[0] != "STOP":
        raise CorruptCheckpointError(f"'{path}': the DCP metadata pickle has no STOP opcode (truncated)")
    return b"".join(keep)


def _unpickle(data: bytes, path: str, resolve: Callable[[str, str], Any]) -> Any:
    try:
        return _Unpickler(data, path, resolve).load()
    except CorruptCheckpointError:
        raise
    except _Refused as e:
        raise CorruptCheckpointError(f"'{path}': the DCP metadata pickle is refused: {e}") from None
    except MemoryError:
        raise  # pass 1 exists so that this cannot happen: let it show
    except Exception as e:  # noqa: BLE001 - any failure of pickle's machinery on hostile bytes is corruption
        raise CorruptCheckpointError(
            f"'{path}': the DCP metadata pickle cannot be loaded ({type(e).__name__}: {_short(str(e))})"
        ) from None


# ---- Pass 3: the schema ---------------------------------------------------------------------------------------------


@dataclass
class DcpChunk:
    offsets: Tuple[int, ...]
    sizes: Tuple[int, ...]


@dataclass
class DcpTensor:
    dtype: str  #: torch dtype name, e.g. "float32"
    size: Tuple[int, ...]
    chunks: List[DcpChunk]
    layout: str = "torch.strided"


@dataclass
class DcpStorageInfo:
    fqn: str
    offset: Optional[Tuple[int, ...]]  #: the chunk's offsets (tensors) or None (bytes)
    index: Optional[int]
    relative_path: str
    file_offset: int
    length: int


@dataclass
class DcpMetadata:
    """What a DCP .metadata file says, checked: entries by FQN (a DcpTensor, or None for a bytes entry), the
    planner's nesting of each FQN (``planner_data``), and where each item's bytes are."""

    entries: Dict[str, Optional[DcpTensor]]
    planner_data: Dict[str, Tuple[Union[str, int], ...]] = field(default_factory=dict)
    storage: List[DcpStorageInfo] = field(default_factory=list)
    version: Optional[str] = None


class _Checker:
    def __init__(self, path: str, budget: int) -> None:
        self.path = path
        self.budget = budget  # items visited; bounded by the file size so that shared objects cannot multiply work

    def bad(self, what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"'{self.path}': DCP metadata: {what}")

    def spend(self, n: int) -> None:
        self.budget -= n
        if self.budget < 0:
            raise self.bad("the pickle shares objects so much that checking it would take more work than its size")

    def fields(self, rec: Any, kind: str, what: str) -> Dict[str, Any]:
        if not isinstance(rec, _STANDIN_CLASSES[kind]):
            raise self.bad(f"{what} is a {_short(getattr(rec, 'kind', '') or rec)}, not a {kind}")
        state = rec.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict) and state[0] in (None, {}):
            state = state[1]  # (dict, slots) form of a dataclass with __slots__
        if state is None:
            state = {}
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise self.bad(f"{what} ({kind}) has a state that is not a dict of fields")
        self.spend(len(state) + 1)
        return state

    def string(self, x: Any, what: str) -> str:
        if not isinstance(x, str):
            raise self.bad(f"{what} is a {_short(x)}, not a string")
        return x

    def integer(self, x: Any, what: str, lo: int = 0, hi: int = _MAX_INDEX) -> int:
        if type(x) is not int or not lo <= x < hi:
            raise self.bad(f"{what} is not an integer in [{lo}, {hi})")
        return x

    def size(self, x: Any, what: str) -> Tuple[int, ...]:
        if not isinstance(x, tuple):  # torch.Size (the stand-in is a tuple) or a plain tuple
            raise self.bad(f"{what} is a {_short(x)}, not a torch.Size")
        self.spend(len(x) + 1)
        if len(x) > 64:
            raise self.bad(f"{what} has {len(x)} dimensions")
        return tuple(self.integer(d, f"{what}[{i}]") for i, d in enumerate(x))

    def dtype_of(self, props: Any, what: str) -> Tuple[str, str]:
        if not isinstance(props, _STANDIN_CLASSES["TensorProperties"]):
            raise self.bad(f"{what}.properties is a {_short(props)}, not a TensorProperties")
        state = props.state
        if isinstance(state, tuple) and len(state) in (5, 6):  # TensorProperties.__getstate__ of torch 2.x
            dtype, layout = state[0], state[1]
            if not (isinstance(state[3], _Token) and state[3].kind == "memory_format"):
                raise self.bad(f"{what}.properties has an invalid memory format")
            if len(state) == 6 and state[5] is not None:
                self.size(state[5], f"{what}.properties.strides")
        elif isinstance(state, dict):
            self.spend(len(state))
            dtype, layout = state.get("dtype"), state.get("layout", _Token("layout", "torch.strided"))
        else:
            raise self.bad(f"{what}.properties has a state of the wrong form")
        if not (isinstance(dtype, _Token) and dtype.kind == "dtype"):
            raise self.bad(f"{what} has no torch dtype")
        if not (isinstance(layout, _Token) and layout.kind == "layout"):
            raise self.bad(f"{what} has no torch layout")
        return dtype.name, layout.name

    def tensor(self, rec: Any, fqn: str) -> DcpTensor:
        what = f"tensor {fqn[:200]!r}"
        f = self.fields(rec, "TensorStorageMetadata", what)
        dtype, layout = self.dtype_of(f.get("properties"), what)
        size = self.size(f.get("size"), f"{what}.size")
        chunks_in = f.get("chunks")
        if not isinstance(chunks_in, list):
            raise self.bad(f"{what}.chunks is not a list")
        self.spend(len(chunks_in))
        chunks = []
        for i, c in enumerate(chunks_in):
            cf = self.fields(c, "ChunkStorageMetadata", f"{what} chunk #{i}")
            off = self.size(cf.get("offsets"), f"{what} chunk #{i} offsets")
            sz = self.size(cf.get("sizes"), f"{what} chunk #{i} sizes")
            if len(off) != len(size) or len(sz) != len(size):
                raise self.bad(f"{what} chunk #{i} has {len(off)} offsets and {len(sz)} sizes for {len(size)} dims")
            if any(o > s or n > s - o for o, n, s in zip(off, sz, size)):
                raise self.bad(f"{what} chunk #{i} lies outside the tensor's size {list(size)}")
            chunks.append(DcpChunk(off, sz))
        return DcpTensor(dtype=dtype, size=size, chunks=chunks, layout=layout)

    def path_key(self, x: Any, fqn: str) -> Tuple[Union[str, int], ...]:
        if not isinstance(x, (tuple, list)):
            raise self.bad(f"planner_data of {fqn[:200]!r} is not a tuple of keys")
        self.spend(len(x) + 1)
        for k in x:
            if not (isinstance(k, str) or type(k) is int):
                raise self.bad(f"planner_data of {fqn[:200]!r} holds a key that is neither a string nor an integer")
        return tuple(x)

    def storage(self, key: Any, info: Any) -> DcpStorageInfo:
        k = self.fields(key, "MetadataIndex", "a storage_data key")
        fqn = self.string(k.get("fqn"), "a storage_data key's fqn")
        what = f"storage_data of {fqn[:200]!r}"
        offset = k.get("offset")
        if offset is not None:
            offset = self.size(offset, f"{what} offset")
        index = k.get("index")
        if index is not None:
            index = self.integer(index, f"{what} index")
        v = self.fields(info, "_StorageInfo", what)
        rel = self.string(v.get("relative_path"), f"{what} relative_path")
        # torch joins it to the checkpoint directory: it must name a file inside it.
        if not rel or "/" in rel or "\\" in rel or "\0" in rel or rel in (".", "..") or rel == ".metadata":
            raise self.bad(f"{what} names the file {rel[:200]!r}, which is not a plain file name in the checkpoint")
        file_offset = self.integer(v.get("offset"), f"{what} offset in {rel!r}")
        length = self.integer(v.get("length"), f"{what} length")
        return DcpStorageInfo(fqn, offset, index, rel, file_offset, length)

    def metadata(self, root: Any) -> DcpMetadata:
        f = self.fields(root, "Metadata", "the pickled object")
        sdm = f.get("state_dict_metadata")
        if not isinstance(sdm, dict):
            raise self.bad("state_dict_metadata is not a dict")
        self.spend(len(sdm))
        entries: Dict[str, Optional[DcpTensor]] = {}
        for fqn, rec in sdm.items():
            self.string(fqn, "an FQN")
            if isinstance(rec, _STANDIN_CLASSES["BytesStorageMetadata"]):
                self.fields(rec, "BytesStorageMetadata", f"entry {fqn[:200]!r}")
                entries[fqn] = None
            else:
                entries[fqn] = self.tensor(rec, fqn)
        planner: Dict[str, Tuple[Union[str, int], ...]] = {}
        pd = f.get("planner_data")
        if pd is not None:
            if not isinstance(pd, dict):
                raise self.bad("planner_data is not a dict")
            self.spend(len(pd))
            for fqn, keys in pd.items():
                fqn = self.string(fqn, "a planner_data FQN")  # before path_key, which names it in messages
                planner[fqn] = self.path_key(keys, fqn)
        storage: List[DcpStorageInfo] = []
        sd = f.get("storage_data")
        if sd is not None:
            if not isinstance(sd, dict):
                raise self.bad("storage_data is not a dict")
            self.spend(len(sd))
            for key, info in sd.items():
                s = self.storage(key, info)
                if s.fqn not in entries:
                    raise self.bad(f"storage_data names {s.fqn[:200]!r}, which state_dict_metadata lacks")
                storage.append(s)
        meta = f.get("storage_meta")
        if meta is not None:
            m = self.fields(meta, "StorageMeta", "storage_meta")
            for k in ("save_id", "load_id", "checkpoint_id"):
                if m.get(k) is not None:
                    self.string(m.get(k), f"storage_meta.{k}")
            mods = m.get("modules", [])
            if not (isinstance(mods, list) and all(isinstance(x, str) for x in mods)):
                raise self.bad("storage_meta.modules is not a list of strings")
            self.spend(len(mods))
        version = f.get("version")
        if version is not None:
            self.string(version, "version")
        return DcpMetadata(entries=entries, planner_data=planner, storage=storage, version=version)


# ---- Entry points ---------------------------------------------------------------------------------------------------


def parse(data: bytes, path: str = ".metadata") -> DcpMetadata:
    """Checks and reads the bytes of a DCP .metadata file without running anything from it (and without torch).

    Raises:
        UnsafePickleError: the pickle names a global outside the allow-list, or an opcode DCP never writes.
        CorruptCheckpointError: anything else wrong with the file (``path`` names it in the message).
    """
    return _parse(data, path)[1]


def _parse(data: bytes, path: str) -> Tuple[bytes, DcpMetadata]:
    """(the scanned pickle, without frames, that is safe to unpickle; what it says)."""
    if len(data) > MAX_METADATA_BYTES:
        raise CorruptCheckpointError(f"'{path}': DCP metadata of {len(data)} bytes is larger than the limit")
    plain = _scan(data, path)
    root = _unpickle(plain, path, lambda module, name: _ALLOWED[(module, name)])
    return plain, _Checker(path, 16 * len(data) + 1024).metadata(root)


def read(path: str) -> Tuple[bytes, DcpMetadata]:
    """Reads and parses a .metadata file: (its bytes, what they say)."""
    with open(path, "rb") as f:
        data = f.read(MAX_METADATA_BYTES + 1)
    return data, parse(data, path)


def _torch_object(module: str, name: str) -> Any:
    import importlib  # noqa: PLC0415

    if (module, name) == ("collections", "OrderedDict") or module == "pathlib":
        return _ALLOWED[(module, name)]  # a dict is as good as an OrderedDict, a str as a checkpoint_id path
    obj = getattr(importlib.import_module(module), name, None)
    if obj is None:
        raise CorruptCheckpointError(f"this torch has no {module}.{name}, which the DCP metadata needs")
    return obj


def to_torch(data: bytes, path: str = ".metadata") -> Any:
    """torch's own ``Metadata`` object from the bytes of a .metadata file, after :func:`parse` accepted them.

    The unpickler resolves the allow-list to torch's real classes (and nothing else), so it runs only their
    constructors and ``__setstate__`` on values that pass 3 of :func:`parse` checked.
    """
    plain, _ = _parse(data, path)
    return _unpickle(plain, path, _torch_object)
