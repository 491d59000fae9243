"""save, async_save and load: the torch.distributed.checkpoint-style entry points.

``__all__`` is what the package re-exports. The other names without an underscore (``add_leaf``, ``save_state``,
``abort_on_local_error``) are the package-internal API the DCP writer (``_dcp_storage``) shares with ``save``;
``build_save_state`` and ``load_into`` are what the checkpoint manager (``manager``) shares with ``save`` and ``load``:
the same state becomes the same entries, and a restore fills a state as a load does.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import os
import posixpath
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, MutableMapping, Optional, Set, Tuple, Union

import numpy as np

from . import _arrays, _dtypes, _native, _tree
from . import storage as _storage
from .comm import Communicator, for_background, native_of
from .errors import CorruptCheckpointError, InvalidArgumentError, NotFoundError

PathLike = Union[str, "os.PathLike[str]"]
ProgressFn = Callable[[int, int], Any]

__all__ = ["SaveSummary", "AsyncSave", "save", "async_save", "load"]


@dataclass(frozen=True)
class SaveSummary:
    """What a save wrote (the same on every rank, except ``bytes_written`` and ``seconds``)."""

    path: str
    num_files: int  #: data files in the checkpoint
    num_entries: int  #: tensors plus bytes entries
    bytes_written: int  #: data bytes this rank wrote
    total_bytes: int  #: data bytes of the whole checkpoint
    metadata_bytes: int
    seconds: float  #: wall time on this rank
    bytes_reused: int = 0  #: of total_bytes, those an incremental save refers to in its bases instead of writing


def add_leaf(state: "_native.State", name: str, value: Any, is_array: bool, allow_pickle: bool) -> Optional[str]:
    """Adds one leaf to a native State for saving: an array's pieces, or an object encoded (returns its encoding)."""
    if is_array:
        src = _arrays.source_tensor(value, name)
        state.add_tensor(name, src.code, list(src.shape))
        for p in src.pieces:
            _arrays.add_piece(state, name, p, writable=False)
        return None
    data, encoding = _tree.encode_object(value, name, allow_pickle)
    state.add_bytes(name, data, False)
    return encoding


def build_save_state(
    state_dict: Mapping[str, Any], allow_pickle: bool, user_metadata: Optional[Mapping[str, str]]
) -> "_native.State":
    flat = _tree.flatten(state_dict, _arrays.is_array)
    state = _native.State()
    for leaf in flat.leaves:
        encoding = add_leaf(state, leaf.name, leaf.value, leaf.is_array, allow_pickle)
        if encoding is not None:
            leaf.node["encoding"] = encoding
    state.set_structure(_tree.dump_structure(flat.root))
    # Top-level scalars (step, epoch, ...) are also user metadata, so every client and `distckpt ls` can show them.
    # Only the top level: an optimizer's per-parameter "step" would otherwise add thousands of keys.
    for leaf in flat.leaves:
        if len(leaf.path) == 1 and isinstance(leaf.path[0], str) and leaf.name not in (user_metadata or {}):
            text = _tree.scalar_text(leaf.value)
            if text is not None:
                state.set_user(leaf.name, text)
    for key, value in (user_metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgumentError(f"user_metadata must map str to str; got {key!r}: {value!r}")
        if "\x00" in key or "\x00" in value:
            raise InvalidArgumentError(
                f"user_metadata {key!r}: keys and values cannot contain NUL (C readers see NUL-terminated strings)"
            )
        state.set_user(key, value)
    return state


def save(
    state_dict: Mapping[str, Any],
    path: PathLike,
    *,
    comm: Optional[Communicator] = None,
    overwrite: bool = False,
    allow_pickle: bool = False,
    user_metadata: Optional[Mapping[str, str]] = None,
    sync: bool = True,
    io_threads: int = 0,
    checksum_block_size: int = 0,
    timeout: Optional[float] = None,
    progress: Optional[ProgressFn] = None,
    storage: Optional["_storage.Storage"] = None,
    base: Optional[PathLike] = None,
    full_every: int = 0,
    compression: Optional[str] = None,
    compression_level: int = 0,
) -> SaveSummary:
    """Saves a (nested) state dict as one checkpoint directory, atomically.

    Collective over ``comm``: every rank calls it with the same path, passing its own pieces (plain arrays are
    replicas of the whole tensor; ``Shard``s, DTensors and sharded JAX arrays are pieces of a larger one). Boxes held
    by several ranks are written once. If any rank fails, every rank raises and nothing appears at ``path``.

    Args:
        state_dict: a mapping of str (or int) keys to arrays, shards, nested dicts/lists, stateful objects
            (``state_dict()``/``load_state_dict()``), and plain values (numbers, strings, bools, None, lists and
            dicts of those), which are stored as JSON.
        path: the checkpoint directory to create.
        comm: the ranks that save together (``distckpt.comm``); None for a single process.
        overwrite: replace an existing checkpoint at ``path`` (atomically). Only a checkpoint or an empty directory is
            replaced: anything else there raises ``AlreadyExistsError`` and is left untouched.
        allow_pickle: store values JSON cannot represent with pickle (loading them then needs it too).
        user_metadata: free-form str -> str pairs stored in the metadata (rank 0's are kept). Top-level scalar
            values of ``state_dict`` (int, float, bool, str of at most 256 characters, numpy scalars and 0-d
            arrays: ``{"step": 100}``) are recorded there too, as text ("100"), so ``distckpt ls`` and the Rust, Go
            and C readers show them; a key given here wins over the recorded value.
        sync: fsync data, metadata and directories (turn off only for scratch data).
        io_threads: I/O threads; 0 picks a default for the machine.
        checksum_block_size: bytes per checksum block (a power of two >= 4096); 0 means 1 MiB.
        timeout: seconds to wait for the other ranks at each collective step; None: 10 minutes.
        progress: ``progress(done_bytes, total_bytes)``, called from a distckpt thread; raising aborts the save.
        storage: where to write (:mod:`distckpt.storage`); None: the one ``path`` names (``"s3://bucket/ckpt"`` to
            the core's S3 backend, other URLs through fsspec, a plain path or ``file://`` to the POSIX file system).
        base: an incremental save: an earlier checkpoint beside this one (its path in the same directory, or its
            name). Arrays whose bytes equal the base's (same entry and region, same XXH3-128) are not written again;
            the checkpoint refers to them and needs those checkpoints to be read (``SaveSummary.bytes_reused``). CPU
            arrays are compared, CUDA arrays always written. Remove checkpoints with :func:`remove_checkpoint` or
            ``distckpt prune``, which keep what others refer to.
        full_every: with ``base``, the ``full_every``-th save of a chain (counted from the last self-contained one) is
            written whole instead; 0: no bound.
        compression: ``"zstd"``: every checksum block of a CPU array is compressed on its own, the bytes of its
            elements grouped by position first (2-, 4- and 8-byte dtypes: the exponent bytes of floats together);
            what does not shrink is stored raw, CUDA arrays are written raw. Loads decode in the read threads and
            check both the stored and the decoded bytes. None (default): no compression. The checkpoint is format 3.0.
        compression_level: 0 (default): zstd's entropy coder alone over the grouped bytes (no match finding; on
            floats as small as level 1 and about 3x faster); -7 to -1 and 1 to 22: zstd's levels with match finding,
            for data with repeats (integer ids, masks, text).

    Returns:
        The checkpoint's summary. The GIL is released while writing.
    """
    with abort_on_local_error(comm):
        compression_code(compression)  # a bad value fails every rank, before any collective
        state = build_save_state(state_dict, allow_pickle, user_metadata)
    return save_state(
        state,
        path,
        comm,
        overwrite,
        sync,
        io_threads,
        checksum_block_size,
        timeout,
        progress,
        storage,
        base,
        full_every,
        compression,
        compression_level,
    )


def save_state(
    state: "_native.State", path: PathLike, comm: Optional[Communicator], overwrite: bool, sync: bool,
    io_threads: int, checksum_block_size: int, timeout: Optional[float], progress: Optional[ProgressFn],
    storage: Optional["_storage.Storage"], base: Optional[PathLike] = None, full_every: int = 0,
    compression: Optional[str] = None, compression_level: int = 0,
) -> SaveSummary:  # fmt: skip
    """The collective save of a built State (GIL released while writing)."""
    path = os.fspath(path)
    native_path, native_storage, _ = _storage.resolve(path, storage)
    info = _native.save(
        native_path, state, native_of(comm), io_threads, overwrite, sync, checksum_block_size,
        _native.timeout_ms(timeout), progress, native_storage, _base_name(path, base), full_every,
        compression_code(compression), compression_level,
    )  # fmt: skip
    return SaveSummary(path=path, **info)


_COMPRESSION = {None: 0, "none": 0, "zstd": 1}


def compression_code(compression: Optional[str]) -> int:
    """The C ABI's dckpt_compression for ``compression`` (None, "none" or "zstd")."""
    try:
        return _COMPRESSION[compression]
    except (KeyError, TypeError):
        raise ValueError(f"compression={compression!r}: None, 'none' or 'zstd'") from None


def _base_name(path: str, base: Optional[PathLike]) -> str:
    """What the core gets as an incremental save's base: the name of a sibling given by its path (the core resolves it
    beside the path it writes to, which for a URL is not the URL), anything else as given, for the core to judge."""
    if base is None:
        return ""
    base = os.fspath(base)
    if "/" in base and posixpath.dirname(base.rstrip("/")) == posixpath.dirname(path.rstrip("/")):
        return posixpath.basename(base.rstrip("/"))
    return base


@contextlib.contextmanager
def abort_on_local_error(comm: Optional[Communicator]) -> Iterator[None]:
    """A rank that fails before its first collective tells the others at once, instead of leaving them to wait out
    their timeouts."""
    try:
        yield
    except BaseException as e:
        if comm is not None and not comm.closed:
            try:
                comm.abort(f"{type(e).__name__}: {e}")
            except Exception:  # noqa: BLE001 - the original error matters more
                pass
        raise


# ---- Asynchronous save -----------------------------------------------------------------------------------------------

_pending: Set["AsyncSave"] = set()
_pending_lock = threading.Lock()


class AsyncSave:
    """A save running in the background, returned by :func:`async_save`.

    By the time you have this handle, the state was already copied out of your arrays: change them freely. Writing,
    hashing and the commit run on a distckpt thread. Saves still running when the interpreter exits are waited for.
    """

    def __init__(self, future: "_native.SaveFuture", path: str) -> None:
        self._future: Optional[_native.SaveFuture] = future
        self._path = path
        self._outcome: Optional[Tuple[Optional[SaveSummary], Optional[BaseException]]] = None
        self._lock = threading.Lock()
        self._staging: Tuple[float, int] = future.staging()
        self._snapshot: Tuple[int, int] = future.snapshot()
        with _pending_lock:
            _pending.add(self)

    @property
    def path(self) -> str:
        return self._path

    def staged(self) -> bool:
        """True once the state has been copied out of the caller's arrays: always, since async_save returns after
        that (kept for API parity with staging that itself runs asynchronously, e.g. from GPU memory)."""
        return True

    @property
    def staging_seconds(self) -> float:
        """Seconds async_save blocked the caller to copy the state."""
        return self._staging[0]

    @property
    def staged_bytes(self) -> int:
        """Bytes copied out of the caller's arrays."""
        return self._staging[1]

    @property
    def snapshot_bytes(self) -> int:
        """Bytes of CUDA arrays snapshotted in device memory (``device_snapshot=True``)."""
        return self._snapshot[0]

    @property
    def snapshot_fallback_bytes(self) -> int:
        """Bytes of CUDA arrays that ``device_snapshot=True`` staged in host memory instead: their GPU had not that
        much free beyond the headroom left for training (1/16 of it, at least 512 MiB)."""
        return self._snapshot[1]

    def done(self) -> bool:
        """True once the save has finished, successfully or not. Never blocks."""
        if not self._lock.acquire(blocking=False):  # another thread is waiting in result()
            return self._outcome is not None
        try:
            if self._outcome is None and self._future is not None and self._future.done():
                self._finish(0)
            return self._outcome is not None
        finally:
            self._lock.release()

    def result(self, timeout: Optional[float] = None) -> SaveSummary:
        """Waits for the save (at most ``timeout`` seconds; None: until done) and returns its summary.

        Raises the save's error, or the builtin ``TimeoutError`` if it is still running after ``timeout``.
        """
        summary, error = self._wait(timeout)
        if error is not None:
            raise error
        assert summary is not None
        return summary

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The save's error (None if it succeeded), waiting like :meth:`result`."""
        return self._wait(timeout)[1]

    def _wait(self, timeout: Optional[float]) -> Tuple[Optional[SaveSummary], Optional[BaseException]]:
        with self._lock:
            if self._outcome is None:
                ms = _native.WAIT_FOREVER if timeout is None else max(0, int(timeout * 1000))
                if not self._finish(ms):
                    raise builtins.TimeoutError(f"the save to '{self._path}' is still running after {timeout} s")
            assert self._outcome is not None
            return self._outcome

    def _finish(self, timeout_ms: int) -> bool:
        """Collects the outcome and frees the native future (and its staging memory). False if still running."""
        assert self._future is not None
        try:
            info = self._future.wait(timeout_ms)
            if info is None:
                return False
            self._outcome = (SaveSummary(path=self._path, **info), None)
        except BaseException as e:  # noqa: BLE001  (kept and re-raised by result())
            self._outcome = (None, e)
        self._future.free()
        self._future = None
        with _pending_lock:
            _pending.discard(self)
        return True

    def __repr__(self) -> str:
        state = "running" if self._outcome is None else ("failed" if self._outcome[1] else "done")
        return f"<distckpt.AsyncSave {self._path!r} {state}>"


def _wait_pending_at_exit() -> None:
    with _pending_lock:
        pending = list(_pending)
    for handle in pending:
        try:
            handle.result()
        except BaseException as e:  # noqa: BLE001
            warnings.warn(f"distckpt: background save to '{handle.path}' failed: {e}", RuntimeWarning, stacklevel=1)


atexit.register(_wait_pending_at_exit)


def async_save(
    state_dict: Mapping[str, Any],
    path: PathLike,
    *,
    comm: Optional[Communicator] = None,
    overwrite: bool = False,
    allow_pickle: bool = False,
    user_metadata: Optional[Mapping[str, str]] = None,
    sync: bool = True,
    io_threads: int = 0,
    checksum_block_size: int = 0,
    timeout: Optional[float] = None,
    progress: Optional[ProgressFn] = None,
    device_snapshot: bool = False,
    storage: Optional["_storage.Storage"] = None,
    base: Optional[PathLike] = None,
    full_every: int = 0,
    compression: Optional[str] = None,
    compression_level: int = 0,
) -> AsyncSave:
    """Like :func:`save`, but returns once the state is copied into memory distckpt owns.

    The caller may modify or free its arrays as soon as this returns (the copy is taken first; see DCP issue
    pytorch#144657 for why this matters). Planning, writing, hashing and the commit run on a background C++ thread;
    ``comm`` belongs to the save until it completes, so run no other distckpt collective on it meanwhile. A
    ``comm.from_torch(group)`` communicator is the exception: training goes on using ``group``, so the save runs its
    collectives over a gloo process group of its own with the same ranks, made on the first async save over
    ``group`` and reused by the later ones (``distckpt.comm.for_background``).

    CUDA arrays are copied to pinned host memory before the call returns; with ``device_snapshot=True`` they are
    instead copied device-to-device into GPU memory distckpt allocates (the call then blocks only for that copy, at
    device memory bandwidth), and the background save drains the snapshot to the host. It costs free GPU memory the
    size of the CUDA arrays (one allocation per device); the arrays of a device without that much free memory are
    staged in host memory as without the option (any other allocation failure raises).

    ``storage`` as for :func:`save` (URLs too); the save keeps it alive until it finishes. ``base`` and
    ``full_every`` as for :func:`save`: the staged copy is compared with the base in the background; so are
    ``compression`` and ``compression_level``: the staged copy is compressed in the background (CUDA arrays too, as
    they are staged in host memory; not those a ``device_snapshot`` keeps on the device).
    """
    path = os.fspath(path)
    native_path, native_storage, _ = _storage.resolve(path, storage)
    with _pending_lock:
        pending = list(_pending)
    for handle in pending:  # free the staging memory of saves that have finished
        handle.done()
    # Never the training's own torch process group (comm.for_background); before anything can fail, so that a rank
    # that fails below tells the others on the communicator their saves use.
    comm = for_background(comm)
    with abort_on_local_error(comm):
        compression_code(compression)
        state = build_save_state(state_dict, allow_pickle, user_metadata)
    future = _native.save_async(
        native_path, state, native_of(comm), io_threads, overwrite, sync, checksum_block_size,
        _native.timeout_ms(timeout), progress, device_snapshot, native_storage, _base_name(path, base), full_every,
        compression_code(compression), compression_level,
    )  # fmt: skip
    return AsyncSave(future, path)


# ---- Load ------------------------------------------------------------------------------------------------------------

_TENSOR = 0
_BYTES = 1


class _Opened:
    """The metadata of an open checkpoint, as load needs it."""

    def __init__(self, reader: "_native.Reader", path: str) -> None:
        self.reader = reader
        self.path = path
        # name -> (kind, dtype code, shape)
        self.entries: Dict[str, Tuple[int, int, Tuple[int, ...]]] = {
            name: (kind, code, tuple(shape)) for name, kind, code, shape, _, _ in reader.entries()
        }
        self.root = _tree.parse_structure(reader.structure(), path)
        self.encodings: Dict[str, str] = {}
        if self.root is not None:
            for node in _tree.iter_nodes(self.root):
                name = _tree.leaf_name(node)
                if name not in self.entries:
                    raise CorruptCheckpointError(
                        f"checkpoint '{path}': the structure names '{name}', which is not an entry"
                    )
                if "object" in node:
                    self.encodings[name] = node["encoding"]

    def read_object(self, name: str, allow_pickle: bool) -> Any:
        data = self.reader.read_bytes(name)
        encoding = self.encodings.get(name)
        if encoding is None:  # not written by distckpt's Python API: hand the bytes over as they are
            return data
        return _tree.decode_object(data, encoding, name, self.path, allow_pickle)


#: load(fanout=...) -> dckpt_fanout_mode (distckpt.h).
_FANOUT_MODES = {"auto": 0, "off": 1, "always": 2}


def load(
    state_dict: Optional[MutableMapping[str, Any]],
    path: PathLike,
    *,
    comm: Optional[Communicator] = None,
    allow_pickle: bool = False,
    verify: bool = True,
    io_threads: int = 0,
    timeout: Optional[float] = None,
    progress: Optional[ProgressFn] = None,
    map_files: bool = True,
    share_verification: bool = True,
    fanout: str = "auto",
    storage: Optional["_storage.Storage"] = None,
    rename: Optional[Callable[[str], str]] = None,
) -> Any:
    """Loads a checkpoint into ``state_dict`` in place, resharding as needed, like ``torch.distributed.checkpoint``.

    Each array leaf of ``state_dict`` (numpy array, torch tensor, DTensor, JAX array, ``Shard`` or list of Shards,
    ``jax.ShapeDtypeStruct``) says which part of the stored tensor this rank wants; each rank reads only the bytes
    its pieces need. numpy arrays, CPU and CUDA torch tensors and writable CUDA arrays (``__cuda_array_interface__``)
    are filled in place, CUDA ones on their device (other layouts and dtypes through one temporary copy on the same
    device; README "GPU arrays"); JAX arrays, which are immutable, are replaced in their container by new arrays with
    the same sharding. Other leaves (numbers, strings, None, ...) are replaced by the stored values. Stateful objects
    get ``load_state_dict`` with their filled state dict. Entries of the checkpoint that ``state_dict`` does not name
    are not read.

    With ``state_dict=None`` the whole checkpoint is returned as a new nested dict of numpy arrays and values (the
    single-process case; BF16/FP8 need ``ml_dtypes``).

    Collective over ``comm``. The GIL is released while reading. ``map_files`` reads data already in the page cache
    through a mapping of the file (turn it off where files may be truncated under a running load: a truncated mapped
    file raises SIGBUS); ``share_verification`` lets the ranks of one host hash each shared checksum block once
    (``capi/API.md``, "How data is read"). ``fanout`` ("auto", "always" or "off"): bytes several ranks need
    (replicated weights) are read from storage once, split among those ranks, and exchanged over ``comm``; "auto"
    does so only where the ranks do not share one page cache (``capi/API.md``, "Fan-out load"). ``storage`` as for
    :func:`save` (URLs too).

    ``rename`` maps the entry name of each leaf of ``state_dict`` to the name it has in the checkpoint, to load a
    checkpoint written by another framework with its own names (``params.layers_0.kernel`` from
    ``model.layers.0.weight``; :func:`distckpt.interop.rename_rules` builds one from patterns). It only renames:
    dtypes are converted as always, layouts (a transposed kernel) are the caller's to change after the load.

    Returns:
        ``state_dict`` (the same object), or the new nested dict.
    Raises:
        NotFoundError: a leaf of ``state_dict`` has no entry in the checkpoint.
        PickleNotAllowedError: a requested entry was pickled and ``allow_pickle`` is False (checked before reading).
        CorruptCheckpointError: a checksum does not match, or the metadata is invalid.
    """
    path = os.fspath(path)
    native_path, native_storage, _ = _storage.resolve(path, storage)
    native_comm = native_of(comm)
    ms = _native.timeout_ms(timeout)
    # One reader for the structure, the bytes entries and the tensors: everything comes from the checkpoint it opened.
    # One process pins every data file at once (it then loads that checkpoint whatever happens to the path meanwhile);
    # on many ranks each opens only the files it reads, on first use (a checkpoint replaced meanwhile fails the load,
    # it is never mixed with another).
    pin_files = native_comm is None
    if fanout not in _FANOUT_MODES:
        raise InvalidArgumentError(f"fanout={fanout!r}: expected one of {', '.join(map(repr, _FANOUT_MODES))}")
    reader = _native.Reader.open(
        native_path,
        native_comm,
        verify,
        io_threads,
        ms,
        map_files,
        share_verification,
        pin_files,
        _FANOUT_MODES[fanout],
        native_storage,
    )
    try:
        # A failure on this rank before the load's collectives (a missing entry, a refused pickle) aborts the group,
        # so the other ranks fail at once instead of waiting out their timeouts.
        with abort_on_local_error(comm):
            ckpt = _Opened(reader, path)
            if state_dict is None:
                if rename is not None:
                    raise InvalidArgumentError("load: rename needs a state_dict to name the targets")
                return _load_everything(ckpt, native_comm, allow_pickle, progress)
            return load_into(state_dict, ckpt, native_comm, allow_pickle, progress, rename)
    finally:
        reader.close()


def _check_pickle(names: List[str], ckpt: _Opened, allow_pickle: bool) -> None:
    pickled = [n for n in names if ckpt.encodings.get(n) == "pickle"]
    if pickled and not allow_pickle:
        raise _tree.pickle_refused(pickled, ckpt.path)


def load_into(
    state_dict: MutableMapping[str, Any], ckpt: _Opened, native_comm: Any, allow_pickle: bool,
    progress: Optional[ProgressFn], rename: Optional[Callable[[str], str]] = None,
) -> Any:  # fmt: skip
    """Fills ``state_dict`` from ``ckpt``: an ``_Opened``, or any object with its ``path``, ``entries``,
    ``encodings``, ``read_object`` and ``reader.load`` (the checkpoint manager's restore passes one)."""
    flat = _tree.flatten(state_dict, _arrays.is_load_target)
    if rename is not None:
        _rename_leaves(flat, rename, ckpt.path)
    missing = [leaf.name for leaf in flat.leaves if leaf.name not in ckpt.entries]
    if missing:
        shown = ", ".join(f"'{n}'" for n in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        renamed = " (names after rename)" if rename is not None else ""
        raise NotFoundError(
            f"checkpoint '{ckpt.path}' has no entry {shown}{renamed} (it has {len(ckpt.entries)} entries)"
        )
    _check_pickle([leaf.name for leaf in flat.leaves if not leaf.is_array], ckpt, allow_pickle)

    state = _native.State()
    finishers: Dict[Tuple[Any, ...], Callable[[], Any]] = {}
    replacements: Dict[Tuple[Any, ...], Any] = {}
    objects: List[_tree.Leaf] = []
    for leaf in flat.leaves:
        kind, code, shape = ckpt.entries[leaf.name]
        if leaf.is_array:
            if kind != _TENSOR:
                raise InvalidArgumentError(
                    f"checkpoint '{ckpt.path}': '{leaf.name}' is stored as a bytes entry, but the target is an array"
                )
            target = _arrays.target_tensor(leaf.value, code, shape, leaf.name, ckpt.path)
            state.add_tensor(leaf.name, code, list(shape))
            for p in target.pieces:
                _arrays.add_piece(state, leaf.name, p, writable=True)
            if target.finish is not None:
                finishers[leaf.path] = target.finish
        elif kind == _BYTES:
            objects.append(leaf)
        else:  # a plain value (e.g. None) where the checkpoint has a tensor: give back a new numpy array
            a = np.empty(shape, dtype=_dtypes.numpy_dtype(code, entry=leaf.name))
            state.add_tensor(leaf.name, code, list(shape))
            state.add_piece(leaf.name, [0] * len(shape), list(shape), _arrays.bytes_view(a), True)
            replacements[leaf.path] = a

    ckpt.reader.load(state, native_comm, progress)
    for leaf in objects:
        replacements[leaf.path] = ckpt.read_object(leaf.name, allow_pickle)
    for leaf_path, finish in finishers.items():
        value = finish()
        if value is not _arrays.SAME:
            replacements[leaf_path] = value
    return _tree.replace_leaves(state_dict, flat, replacements)


def _rename_leaves(flat: "_tree.Flat", rename: Callable[[str], str], path: str) -> None:
    """Gives every leaf the checkpoint name ``rename`` maps its own name to; two leaves may not read one entry."""
    taken: Dict[str, str] = {}
    for leaf in flat.leaves:
        stored = rename(leaf.name)
        if not isinstance(stored, str) or not stored:
            raise InvalidArgumentError(f"load: rename({leaf.name!r}) returned {stored!r}, not an entry name")
        if stored in taken:
            raise InvalidArgumentError(
                f"load: rename maps both '{taken[stored]}' and '{leaf.name}' to entry '{stored}' of checkpoint "
                f"'{path}'; load one and copy it"
            )
        taken[stored] = leaf.name
        leaf.name = stored


def _load_everything(
    ckpt: _Opened, native_comm: Any, allow_pickle: bool, progress: Optional[ProgressFn]
) -> Dict[Any, Any]:  # fmt: skip
    _check_pickle(list(ckpt.encodings), ckpt, allow_pickle)
    state = _native.State()
    arrays: Dict[str, np.ndarray] = {}
    for name, (kind, code, shape) in ckpt.entries.items():
        if kind != _TENSOR:
            continue
        a = np.empty(shape, dtype=_dtypes.numpy_dtype(code, entry=name))
        state.add_tensor(name, code, list(shape))
        state.add_piece(name, [0] * len(shape), list(shape), _arrays.bytes_view(a), True)
        arrays[name] = a
    ckpt.reader.load(state, native_comm, progress)
    values: Dict[str, Any] = dict(arrays)
    for name, (kind, _, _) in ckpt.entries.items():
        if kind == _BYTES:
            values[name] = ckpt.read_object(name, allow_pickle)

    if ckpt.root is None:
        return values
    used: Set[str] = set()

    def get(node: Dict[str, Any]) -> Any:
        name = _tree.leaf_name(node)
        used.add(name)
        value = values[name]
        return value[()] if node.get("scalar") else value

    tree = _tree.build(ckpt.root, get)
    for name, value in values.items():  # entries the structure does not describe (e.g. written by other ranks)
        if name not in used:
            tree.setdefault(name, value)
    return tree
