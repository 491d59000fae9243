"""Reading a checkpoint offline: its metadata, whole entries, or any region of a tensor (only those bytes are read)."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _arrays, _dtypes, _mapped, _native, _tree
from . import storage as _storage
from .comm import Communicator, native_of
from .errors import CorruptCheckpointError, InvalidArgumentError, NotFoundError

__all__ = ["open", "Reader", "ArrayView", "CheckpointMetadata", "EntryMetadata", "ChunkMetadata", "IoStats"]

Shape = Tuple[int, ...]
_TENSOR = 0


@dataclass(frozen=True)
class ChunkMetadata:
    """Where one chunk of a tensor lives: its box in the tensor, and its byte range in a data file."""

    offsets: Shape
    lengths: Shape
    file: str  #: data file name inside the checkpoint directory
    file_offset: int
    length: int  #: bytes
    checksum: int  #: see core/format/FORMAT.md
    #: "" when ``file`` is the checkpoint's own; else the base checkpoint (a sibling) it lies in (incremental saves)
    base: str = ""
    codec: str = "none"  #: how it is stored: "none" (raw) or "zstd" (compressed per checksum block)
    stored_length: int = -1  #: bytes it takes in ``file`` from ``file_offset`` (== length when stored raw)


@dataclass(frozen=True)
class IoStats:
    """A reader's I/O counters since it was opened."""

    bytes_read: int  #: bytes read from data files
    read_calls: int  #: read system calls
    bytes_verified: int  #: bytes hashed to check checksums
    bytes_delivered: int  #: bytes copied into caller buffers
    bytes_mapped: int = 0  #: bytes delivered from the page cache through a mapping (not in bytes_read)
    bytes_read_direct: int = 0  #: of bytes_read, read past the page cache (O_DIRECT) for device destinations


class EntryMetadata:
    """One entry: a tensor (dtype, global shape, chunks) or a bytes entry (an object saved by the Python API, or
    opaque bytes from another binding)."""

    __slots__ = ("name", "kind", "dtype", "shape", "nbytes", "num_chunks", "index", "_code", "_reader", "_chunks")

    def __init__(self, reader: "_native.Reader", index: int, raw: Tuple[Any, ...]) -> None:
        name, kind, code, shape, nbytes, num_chunks = raw
        self.name: str = name
        self.kind: str = "tensor" if kind == _TENSOR else "bytes"
        self.dtype: str = _dtypes.name(code)  #: canonical name: "F32", "BF16", "F8_E4M3", ...
        self.shape: Shape = tuple(shape)
        self.nbytes: int = nbytes
        self.num_chunks: int = num_chunks
        self.index: int = index  #: position in the checkpoint's entries (sorted by name)
        self._code = code
        self._reader = reader
        self._chunks: Optional[Tuple[ChunkMetadata, ...]] = None

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype (BF16 and FP8 need ml_dtypes)."""
        return _dtypes.numpy_dtype(self._code, entry=self.name)

    @property
    def chunks(self) -> Tuple[ChunkMetadata, ...]:
        """The chunk layout: boxes tiling the tensor, each with its file and byte range (read lazily)."""
        if self._chunks is None:
            self._chunks = tuple(
                ChunkMetadata(tuple(o), tuple(n), f, fo, ln, ck, b, codec, stored)
                for o, n, f, fo, ln, ck, b, codec, stored in (
                    self._reader.chunk(self.index, c) for c in range(self.num_chunks)
                )
            )
        return self._chunks

    def __repr__(self) -> str:
        if self.kind == "bytes":
            return f"EntryMetadata({self.name!r}, bytes, {self.nbytes} bytes)"
        return f"EntryMetadata({self.name!r}, {self.dtype}, shape={self.shape}, {self.num_chunks} chunks)"


class CheckpointMetadata(Mapping[str, EntryMetadata]):
    """The checkpoint's metadata: a mapping of entry name -> EntryMetadata, plus checkpoint-wide facts."""

    def __init__(self, reader: "_native.Reader") -> None:
        info = reader.info()
        self.format_version: Tuple[int, int] = (info["format_major"], info["format_minor"])
        self.writer: str = info["writer"]
        self.num_files: int = info["num_files"]
        self.total_bytes: int = info["total_bytes"]  #: data bytes
        self.metadata_bytes: int = info["metadata_bytes"]
        self.checksum_block_size: int = info["checksum_block_size"]
        #: "distckpt", or the format of a checkpoint another library wrote, read in place: "safetensors", "torch-dcp"
        self.format: str = info["source"] or "distckpt"
        #: the version a foreign format records of itself ("1.0.0" for a DCP .metadata that has one), or None: for
        #: safetensors (no version), an older DCP checkpoint, and a distckpt checkpoint (see format_version)
        self.source_version: Optional[str] = info["source_version"] or None
        #: False for a foreign checkpoint: those formats carry no checksums, so nothing read from them is verified
        self.checksummed: bool = info["checksummed"]
        #: an incremental checkpoint's bases: the names of the sibling checkpoints whose data files it reads (empty for
        #: a self-contained one); removing one of them breaks this checkpoint
        self.bases: Tuple[str, ...] = tuple(info["bases"])
        #: saves since the last self-contained checkpoint of its chain (0: it reads no base)
        self.chain_length: int = info["chain_length"]
        #: of total_bytes, those that lie in its bases' data files
        self.bytes_in_bases: int = info["bytes_in_bases"]
        #: what the chunks take in data files (compressed ones at their stored size), and how many are compressed
        self.stored_bytes: int = info["stored_bytes"]
        self.compressed_chunks: int = info["compressed_chunks"]
        self.user: Dict[str, str] = dict(reader.user())  #: free-form key/values saved with the checkpoint
        self._entries: Dict[str, EntryMetadata] = {
            raw[0]: EntryMetadata(reader, i, raw) for i, raw in enumerate(reader.entries())
        }

    def __getitem__(self, name: str) -> EntryMetadata:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        if self.format != "distckpt":
            return f"<CheckpointMetadata {self.format} (read in place), {len(self)} entries, {self.total_bytes} bytes>"
        return (
            f"<CheckpointMetadata format {self.format_version[0]}.{self.format_version[1]}, {len(self)} entries, "
            f"{self.total_bytes} bytes in {self.num_files} files>"
        )


class ArrayView:
    """A stored tensor, not yet read. Index it to read a region (only the bytes of that region come from disk, rounded
    out to checksum blocks when verifying); ``np.asarray(view)`` or ``view[...]`` reads all of it.

    Basic indexing is supported: integers, slices (any step; the bounding box is read), and ``...``.
    """

    def __init__(self, reader: "Reader", entry: EntryMetadata) -> None:
        self._reader = reader
        self._entry = entry
        self._code = entry._code

    @property
    def name(self) -> str:
        return self._entry.name

    @property
    def shape(self) -> Shape:
        return self._entry.shape

    @property
    def ndim(self) -> int:
        return len(self._entry.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._entry.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self._entry.nbytes

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype (BF16 and FP8 need ml_dtypes)."""
        return _dtypes.numpy_dtype(self._code, entry=self.name)

    @property
    def metadata(self) -> EntryMetadata:
        return self._entry

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def read(self, offsets: Optional[Sequence[int]] = None, lengths: Optional[Sequence[int]] = None,
             out: Any = None) -> Any:  # fmt: skip
        """Reads the box ``[offsets, offsets + lengths)`` (default: everything), into ``out`` if given.

        ``out`` may be in CUDA memory (a CUDA torch tensor, a CuPy array, any writable ``__cuda_array_interface__``
        array; C-contiguous, of the stored dtype): the bytes go through the core's pinned staging buffers straight
        to the device (``dckpt_reader_read_ex``), ordered after the work queued on its current stream, and have
        arrived when this returns.
        """
        offsets = tuple(offsets) if offsets is not None else (0,) * self.ndim
        lengths = tuple(lengths) if lengths is not None else tuple(s - o for s, o in zip(self.shape, offsets))
        if out is not None and not isinstance(out, np.ndarray):
            device = _arrays.device_out_buffer(out, self._code, lengths, f"read('{self.name}')")
            if device is not None:
                self._reader._read_into_device(self.name, offsets, lengths, device)
                return out
        if out is None:
            out = np.empty(lengths, dtype=self.dtype)
        elif tuple(out.shape) != lengths or not out.flags.c_contiguous or _dtypes.code_of(out.dtype) != self._code:
            raise InvalidArgumentError(
                f"read('{self.name}'): out must be a C-contiguous {self._entry.dtype} array of shape {lengths}"
            )
        self._reader._read_into(self.name, offsets, lengths, out)
        return out

    def __getitem__(self, index: Any) -> Any:
        offsets, lengths, post = _plan_index(index, self.shape)
        region = self.read(offsets, lengths)
        return region[post]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"<distckpt.ArrayView {self.name!r} {self._entry.dtype} {self.shape}>"


def _plan_index(index: Any, shape: Shape) -> Tuple[Shape, Shape, Tuple[Any, ...]]:
    """Basic indexing -> (offsets, lengths) of the bounding box to read, and the index to apply to that box."""
    if not isinstance(index, tuple):
        index = (index,)
    n_ellipsis = sum(1 for i in index if i is Ellipsis)
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    for i in index:
        if not (i is Ellipsis or isinstance(i, (slice, int, np.integer))) or isinstance(i, bool):
            raise IndexError(
                f"only integers, slices and '...' can index a stored array (got {type(i).__name__}); read it with "
                "np.asarray(view) first for fancy indexing"
            )
    if n_ellipsis:
        at = next(k for k, i in enumerate(index) if i is Ellipsis)
        fill = len(shape) - (len(index) - 1)
        if fill < 0:
            raise IndexError(f"too many indices for an array of {len(shape)} dimensions")
        index = index[:at] + (slice(None),) * fill + index[at + 1 :]
    if len(index) > len(shape):
        raise IndexError(f"too many indices for an array of {len(shape)} dimensions")
    index = index + (slice(None),) * (len(shape) - len(index))
    offsets: List[int] = []
    lengths: List[int] = []
    post: List[Any] = []
    for d, (i, n) in enumerate(zip(index, shape)):
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            picked = range(start, stop, step)
            if len(picked) == 0:
                offsets.append(0)
                lengths.append(0)
                post.append(slice(None))
                continue
            lo, hi = min(picked[0], picked[-1]), max(picked[0], picked[-1]) + 1
            offsets.append(lo)
            lengths.append(hi - lo)
            # The box starts (step > 0) or ends (step < 0) at a picked element, so the step alone selects them.
            post.append(slice(None, None, step))
        else:
            k = int(i)
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {d} with size {n}")
            k %= n
            offsets.append(k)
            lengths.append(1)
            post.append(0)
    return tuple(offsets), tuple(lengths), tuple(post)


class Reader(Mapping[str, Any]):
    """An open checkpoint: a read-only mapping of entry name -> value.

    ``reader[name]`` is an :class:`ArrayView` for a tensor (index it to read a region, or ``np.asarray`` it), and
    the stored value for an object entry (decoded from JSON; pickled ones need ``allow_pickle=True`` at open; bytes
    written by other bindings come back as ``bytes``). Thread-safe: several threads may read at once, with the GIL
    released during each read.
    """

    def __init__(self, native: "_native.Reader", path: str, allow_pickle: bool) -> None:
        self._native = native
        self._path = path
        self._allow_pickle = allow_pickle
        self._metadata = CheckpointMetadata(native)
        self._root = _tree.parse_structure(native.structure(), path)
        self._encodings: Dict[str, str] = {}
        self._scalars: Dict[str, bool] = {}
        if self._root is not None:
            for node in _tree.iter_nodes(self._root):
                if _tree.leaf_name(node) not in self._metadata:
                    raise CorruptCheckpointError(
                        f"checkpoint '{path}': the structure names '{_tree.leaf_name(node)}', which is not an entry"
                    )
                if "object" in node:
                    self._encodings[node["object"]] = node["encoding"]
                elif node.get("scalar"):
                    self._scalars[node["array"]] = True

    @property
    def path(self) -> str:
        return self._path

    @property
    def metadata(self) -> CheckpointMetadata:
        """Every entry's dtype, shape and chunk layout, and the checkpoint's user metadata."""
        return self._metadata

    @property
    def user_metadata(self) -> Dict[str, str]:
        return self._metadata.user

    @property
    def structure(self) -> Optional[Dict[str, Any]]:
        """The nested layout the checkpoint was saved with: the root ``NODE`` of its structure document (README, "The
        structure document"; e.g. ``{"dict": [["model", {"dict": [["w", {"array": "model.w"}]]}], ...]}``), already
        validated against the entries; None when the checkpoint has none (written by another binding, or flat).
        A copy: changing it changes nothing here. Framework plug-ins rebuild their own nested targets from it."""
        return copy.deepcopy(self._root)

    def __iter__(self) -> Iterator[str]:
        return iter(self._metadata)

    def __len__(self) -> int:
        return len(self._metadata)

    def __contains__(self, name: object) -> bool:
        return name in self._metadata

    def _entry(self, name: str) -> EntryMetadata:
        try:
            return self._metadata[name]
        except KeyError:
            raise NotFoundError(f"checkpoint '{self._path}' has no entry '{name}'") from None

    def __getitem__(self, name: str) -> Any:
        entry = self._metadata.get(name)
        if entry is None:
            raise KeyError(name)
        if entry.kind == "tensor":
            return ArrayView(self, entry)
        return self._object(name)

    def read(self, name: str) -> Any:
        """The whole value of entry ``name``: a numpy array for a tensor (a numpy scalar if it was saved as one)."""
        entry = self._entry(name)
        if entry.kind == "bytes":
            return self._object(name)
        a = ArrayView(self, entry).read()
        return a[()] if self._scalars.get(name) else a

    def read_bytes(self, name: str) -> bytes:
        """The raw bytes of a bytes entry (no decoding)."""
        self._entry(name)
        return self._native.read_bytes(name)

    def _object(self, name: str) -> Any:
        data = self._native.read_bytes(name)
        encoding = self._encodings.get(name)
        if encoding is None:
            return data
        return _tree.decode_object(data, encoding, name, self._path, self._allow_pickle)

    def readinto(self, name: str, buffer: Any, offsets: Optional[Sequence[int]] = None,
                 lengths: Optional[Sequence[int]] = None) -> int:  # fmt: skip
        """Reads the box ``[offsets, offsets + lengths)`` of tensor ``name`` (default: all of it) into ``buffer`` as
        the stored bytes (little-endian, row-major, no dtype check) and returns how many bytes that is.

        ``buffer`` is any writable C-contiguous buffer of exactly that size: a numpy array of any dtype, a bytearray,
        a memoryview. It is the untyped form of :meth:`ArrayView.read`: for element types numpy lacks (BF16 and FP8
        without ml_dtypes) or a framework's own (a CPU torch tensor's bytes), and for reusing one buffer."""
        entry = self._entry(name)
        if entry.kind != "tensor":
            raise InvalidArgumentError(f"checkpoint '{self._path}': '{name}' is a bytes entry, not a tensor")
        offsets = tuple(int(o) for o in offsets) if offsets is not None else (0,) * len(entry.shape)
        if lengths is None:
            lengths = tuple(s - o for s, o in zip(entry.shape, offsets))
        lengths = tuple(int(n) for n in lengths)
        nbytes = int(np.prod(lengths, dtype=np.int64)) * _dtypes.itemsize(entry._code)
        if isinstance(buffer, np.ndarray):
            ok = buffer.flags.c_contiguous and buffer.flags.writeable and buffer.nbytes == nbytes
            out = buffer.reshape(-1).view(np.uint8) if ok else None
        else:
            view = memoryview(buffer)
            ok = not view.readonly and view.c_contiguous and view.nbytes == nbytes
            out = np.frombuffer(view.cast("B"), dtype=np.uint8) if ok else None
        if out is None:
            raise InvalidArgumentError(
                f"checkpoint '{self._path}': readinto('{name}', lengths={lengths}) needs a writable C-contiguous "
                f"buffer of {nbytes} bytes"
            )
        self._read_into(name, offsets, lengths, out)
        return nbytes

    def _read_into(self, name: str, offsets: Shape, lengths: Shape, out: np.ndarray) -> None:
        self._native.read(name, list(offsets), list(lengths), out.reshape(-1).view(np.uint8))

    def _read_into_device(self, name: str, offsets: Shape, lengths: Shape, out: "_arrays.DeviceBuffer") -> None:
        self._native.read_device(name, list(offsets), list(lengths), out.ptr, out.nbytes, out.device, out.stream)

    def to_dict(self) -> Dict[Any, Any]:
        """Everything as a nested dict of numpy arrays and values (what ``distckpt.load(None, path)`` returns)."""
        values = {name: self.read(name) for name in self._metadata}
        if self._root is None:
            return values
        used = set()

        def get(node: Dict[str, Any]) -> Any:
            name = _tree.leaf_name(node)
            used.add(name)
            return values[name]

        tree = _tree.build(self._root, get)
        for name, value in values.items():
            if name not in used:
                tree.setdefault(name, value)
        return tree

    @property
    def io_stats(self) -> IoStats:
        """Bytes and read calls since open: shows that partial reads read only what they need."""
        s = self._native.io_stats()
        return IoStats(
            s["bytes_read"],
            s["read_calls"],
            s["bytes_verified"],
            s["bytes_delivered"],
            s["bytes_mapped"],
            s["bytes_read_direct"],
        )

    def verify(self, progress: Optional[Callable[[int, int], Any]] = None) -> None:
        """Reads every chunk and checks its checksums; CorruptCheckpointError names the first bad block.
        UnsupportedError for a checkpoint another library wrote (safetensors, DCP), whose format has no checksums."""
        self._native.verify(progress)

    def map_all(
        self,
        names: Optional[Sequence[str]] = None,
        *,
        lazy: bool = False,
        progress: Optional[Callable[[int, int], Any]] = None,
    ) -> "_mapped.MappedTensors":
        """Every tensor (or those in ``names``) as read-only numpy arrays over the mapped data files: no copy, the
        counterpart of Rust's ``map_all`` and of ``safetensors.safe_open`` (the result has ``keys()``,
        ``get_tensor(name)`` and ``metadata()``). ``lazy=False`` pages everything in and, when the reader verifies
        (``open(verify=True)``, the default), checks every checksum up front; ``lazy=True`` maps now and checks each
        tensor's chunks the first time it is taken. A tensor stored as several chunks (saved sharded) cannot be one
        view of a file: it is read into memory instead; a compressed one is decoded and verified by the core into
        memory the reader keeps (``MappedTensors.copied`` names both). The arrays stay valid
        after ``close()``: the mapping lives as long as any of them."""
        return _mapped.MappedTensors(self, self._native, names, lazy, progress)

    def close(self) -> None:
        """Waits for reads in flight in other threads, then closes. Safe to call twice."""
        self._native.close()

    @property
    def closed(self) -> bool:
        return bool(self._native.closed)

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self)} entries"
        return f"<distckpt.Reader {self._path!r} {state}>"


def open(  # noqa: A001 - distckpt.open mirrors h5py.File / safetensors.safe_open
    path: Union[str, "os.PathLike[str]"],
    *,
    comm: Optional[Communicator] = None,
    verify: bool = True,
    allow_pickle: bool = False,
    io_threads: int = 0,
    timeout: Optional[float] = None,
    map_files: bool = True,
    storage: Optional["_storage.Storage"] = None,
) -> Reader:
    """Opens a committed checkpoint for reading. The metadata is verified and validated before use.

    With ``comm`` the call is collective: rank 0 reads the metadata once and broadcasts it. ``verify`` checks the
    checksums of every block a read touches. ``map_files`` reads the metadata and cached data through mappings of the
    files (``capi/API.md``, "How data is read"); ``io_stats.bytes_mapped`` counts what came that way. ``storage``:
    where the checkpoint lives (:mod:`distckpt.storage`); None: the one ``path`` names (``s3://`` the core's S3,
    other URLs fsspec).

    Checkpoints other libraries wrote open in place, with no conversion: a Hugging Face safetensors directory (an
    index and its shards, or ``.safetensors`` files), one ``.safetensors`` file, or a PyTorch DCP directory
    (``metadata.format`` says which; ``docs/foreign.md``). Those formats carry no checksums, so ``verify`` has no
    effect on them and :meth:`Reader.verify` raises UnsupportedError saying so.
    """
    path = os.fspath(path)
    native_path, native_storage, _ = _storage.resolve(path, storage)
    native = _native.Reader.open(
        native_path, native_of(comm), verify, io_threads, _native.timeout_ms(timeout), map_files, storage=native_storage
    )
    try:
        return Reader(native, path, allow_pickle)
    except BaseException:
        native.close()
        raise
