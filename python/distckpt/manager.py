"""CheckpointManager: a checkpoint every step, kept in tiers by distckpt's core (``dckpt_manager_*``).

Each step is saved into a node-local tier (``/dev/shm`` by default: one ordinary checkpoint per rank), each rank's part
is replicated to ranks on other nodes over the manager's communicator, and every ``persist_every``-th step is persisted
as one ordinary checkpoint that :func:`distckpt.load` reads. :meth:`CheckpointManager.restore` loads the newest step
whose every part verifies in some tier, resharding to any number of ranks. All of that is the core's work; this module
turns a state into the core's entries the way :func:`distckpt.save` does, and fills a state the way
:func:`distckpt.load` does. docs/manager.md says what survives which failure and how to size the local tier.
"""

from __future__ import annotations

import atexit
import os
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Tuple, Union

import numpy as np

from . import _arrays, _dtypes, _native, _tree
from . import storage as _storage
from ._checkpoint import abort_on_local_error, build_save_state, compression_code, load_into
from .comm import Communicator, for_background, native_of
from .errors import BufferTooSmallError, Error, InvalidArgumentError, StateError, UnsupportedError
from .sharding import Shard

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["CheckpointManager", "ManagerStats", "RestoreResult"]

#: dckpt_tier -> RestoreResult.tier
_TIER_NAMES: Dict[int, str] = {code: name.lower() for name, code in _native.TIERS.items()}

#: The least room a restore gives each non-array value (JSON), whatever the template's value encodes to.
MIN_OBJECT_BYTES = 4096


@dataclass(frozen=True)
class RestoreResult:
    """What :meth:`CheckpointManager.restore` did on this rank."""

    found: bool  #: False: no step anywhere; the state was left as it was
    step: Optional[int]  #: the step restored (None when nothing was found)
    tier: str  #: where this rank's bytes came from: "local", "peer", "persistent" ("none" when nothing was found)
    bytes_local: int  #: bytes read from this node's tier
    bytes_from_peers: int  #: bytes other nodes sent this rank
    bytes_from_persistent: int  #: bytes read from persistent storage
    seconds: float
    report: str  #: the core's account: the step chosen and why, which tier served each part, what was skipped and why
    #: the filled state: the one passed in (JAX arrays, being immutable, replaced in their containers)
    state: Any = field(default=None, repr=False, compare=False)
    #: copies of the restored step's parts a lost node held, being made again in the background (the same on every
    #: rank; :meth:`CheckpointManager.wait_until_finished` waits for them)
    copies_made: int = 0


@dataclass(frozen=True)
class ManagerStats:
    """Counters of one :class:`CheckpointManager` since it was made (:meth:`CheckpointManager.stats`)."""

    steps_saved: int  #: steps ``save`` accepted (each then runs in the background)
    steps_completed: int  #: steps made complete (every part and its replicas durable)
    steps_failed: int  #: steps whose background work ended without the step complete
    #: saves that waited before copying the state (back-pressure): for the steps in flight (at most two) or for
    #: ``local_budget_bytes`` to free up
    saves_waited: int
    saves_waited_for_budget: int  #: of ``saves_waited``: those that waited for ``local_budget_bytes``
    wait_seconds: float  #: total time saves spent waiting
    max_wait_seconds: float  #: the longest wait of one save
    bytes_written: int  #: bytes of this rank's own parts of completed steps, written to the local tier
    bytes_replicated: int  #: bytes of other ranks' parts this rank received and kept (completed steps)
    #: bytes this rank wrote to persistent storage, as stored (compressed); a box several ranks hold is written once
    bytes_persisted: int = 0
    bytes_persist_reused: int = 0  #: rank 0: data bytes persisted steps refer to in the previous persisted step
    persist_seconds: float = 0.0  #: time the background work spent persisting steps (after writing, replicating)


#: CheckpointManager(background_priority=...) -> dckpt_priority
_PRIORITIES: Dict[Optional[str], int] = {
    None: _native.PRIORITIES["DEFAULT"],
    "normal": _native.PRIORITIES["NORMAL"],
    "low": _native.PRIORITIES["LOW"],
    "idle": _native.PRIORITIES["IDLE"],
}


class _NothingToRestore(Exception):
    pass


class _RestoreSource:
    """What ``load_into`` needs of an opened checkpoint, for a restore. There is no metadata to read first: each leaf
    of the state describes its entry (an array's dtype and global shape, the same as when it was saved; the core
    refuses a mismatch), non-array leaves are JSON bytes entries, and the core's restore fills the native State that
    ``load_into`` builds."""

    path = "checkpoint manager"  # how load_into's errors name the checkpoint

    def __init__(
        self, native: "_native.Manager", flat: "_tree.Flat", fallback: bool, use_persistent: bool,
        max_object_bytes: Optional[int],
    ) -> None:  # fmt: skip
        self._native = native
        self._fallback = fallback
        self._use_persistent = use_persistent
        self.reader = self  # load_into calls ckpt.reader.load(state, comm, progress)
        self.entries: Dict[str, Tuple[int, int, Tuple[int, ...]]] = {}
        self.encodings: Dict[str, str] = {}
        self._buffers: Dict[str, np.ndarray] = {}
        self._sizes: Dict[str, int] = {}
        self.info: Optional[Dict[str, Any]] = None
        self.restoring = False  # set when the collective restore starts
        for leaf in flat.leaves:
            if leaf.is_array:
                code, shape = _describe(leaf.value, leaf.name)
                self.entries[leaf.name] = (_native.ENTRY_TENSOR, code, shape)
            else:
                self.entries[leaf.name] = (_native.ENTRY_BYTES, 0, ())
                self.encodings[leaf.name] = "json"
                self._buffers[leaf.name] = np.empty(_object_capacity(leaf.value, leaf.name, max_object_bytes), np.uint8)

    def load(self, state: "_native.State", native_comm: Any, progress: Any) -> None:
        for name, buf in self._buffers.items():
            state.add_bytes(name, buf, True)
        self.restoring = True
        try:
            self.info = self._native.restore(state, self._fallback, self._use_persistent)
        except BufferTooSmallError as e:
            raise BufferTooSmallError(
                f"{e} (a non-array value's stored JSON is larger than the room restore gave it: pass a larger "
                "max_object_bytes to restore)",
                code=e.code,
                status=e.status,
            ) from None
        if not self.info["found"]:
            raise _NothingToRestore()
        self._sizes = {name: int(state.bytes_size(name)) for name in self._buffers}

    def read_object(self, name: str, allow_pickle: bool) -> Any:
        data = self._buffers[name][: self._sizes[name]].tobytes()
        return _tree.decode_object(data, "json", name, f"{self.path} step {self.info['step']}", allow_pickle)


def _describe(x: Any, name: str) -> Tuple[int, Tuple[int, ...]]:
    """(dtype code, global shape) of an array leaf of a restore's state, without touching its data."""
    what = f"'{name}'"
    if isinstance(x, Shard) or _arrays.is_shard_list(x):
        shards = [x] if isinstance(x, Shard) else list(x)
        return _local_code(shards[0].data, what), tuple(int(d) for d in shards[0].global_shape)
    if isinstance(x, memoryview):
        x = np.asarray(x)
    shape = getattr(x, "shape", None)
    if shape is None:  # only __cuda_array_interface__
        shape = getattr(x, "__cuda_array_interface__", {}).get("shape", ())
    return _local_code(x, what), tuple(int(d) for d in shape)


def _local_code(x: Any, what: str) -> int:
    if _arrays.is_torch_tensor(x):  # DTensors too: their dtype and shape are the global tensor's
        return _arrays.torch_code(x.dtype, what)
    cai = getattr(x, "__cuda_array_interface__", None)  # CUDA arrays that expose only the interface (Numba, ...)
    dtype = getattr(x, "dtype", None)  # numpy, JAX (arrays and ShapeDtypeStruct), CuPy, numpy scalars
    if dtype is None and isinstance(cai, dict):
        dtype = cai.get("typestr")
    code = None if dtype is None else _dtypes.code_of(np.dtype(dtype))
    if code is None:
        raise UnsupportedError(
            f"{what}: {type(x).__module__}.{type(x).__name__} of dtype {dtype} has no distckpt dtype"
        )
    return code


def _object_capacity(value: Any, name: str, max_object_bytes: Optional[int]) -> int:
    """Room for the stored JSON of a non-array leaf: ``max_object_bytes``, else 4 times what the template's value
    encodes to, at least MIN_OBJECT_BYTES (the stored value of a counter or a config is about the template's size)."""
    if max_object_bytes is not None:
        return int(max_object_bytes)
    try:
        size = len(_tree.encode_object(value, name, False)[0])
    except Error:  # not JSON (PickleNotAllowedError): the stored value is, so the template's says nothing
        size = 0
    return max(MIN_OBJECT_BYTES, 4 * size)


# Managers still open at exit are closed before the interpreter finalises: their background thread may need the GIL.
_open: "weakref.WeakSet[CheckpointManager]" = weakref.WeakSet()
_open_lock = threading.Lock()


class CheckpointManager:
    """Saves a checkpoint every step into tiers and restores the newest one that survived (``dckpt_manager_*``).

    One per rank; every rank makes it in the same call (collective over ``comm``), saves the same steps in the same
    order, and restores together. Modelled on Orbax's ``CheckpointManager`` and DCP's ``async_save``::

        with distckpt.CheckpointManager(comm, local_dir="/dev/shm/job", persistent="s3://bucket/job",
                                        persist_every=100) as mgr:
            start = mgr.restore(state).step or 0      # fills state in place
            for step in range(start + 1, steps):
                train_step(state)
                mgr.save(step, state)                 # returns once the state is copied
            mgr.wait_until_finished()

    Args:
        comm: the ranks of the job (``distckpt.comm``); None for a single process. The manager's background thread
            runs its collectives, so it must not be used for anything else while the manager is open: give the
            manager a communicator of its own. A ``comm.from_torch(group)`` communicator is replaced by a gloo group
            of the same ranks made for the purpose (as :func:`distckpt.async_save` does).
        local_dir: the node-local tier, shared by the ranks of one node; None: ``/dev/shm/distckpt-<job>``.
        job: names the default ``local_dir``; None: "default".
        node_id: this rank's node (replicas go to ranks with another node_id); None: the host name.
        replicas: copies of each rank's part kept on other nodes: 0, 1 or 2; None (the default): 1 where the job has
            other nodes, 0 on one node (the restore report says which).
        persistent: where persisted steps go, as ``<persistent>/step-<10 digits>``: a directory or a URL
            (``s3://bucket/prefix``); None: no persistent tier.
        persistent_storage: the :mod:`distckpt.storage` ``persistent`` is on (as ``save(storage=)``); None: the one
            the path names.
        persist_every: persist every step that is a multiple of this (0: only steps saved with ``persist=True``).
        keep_local: complete steps kept in the local tier.
        keep_persistent: persisted steps kept (0: all).
        local_budget_bytes: the most this rank's share of the local tier may hold (its parts, the replicas it keeps
            for others and the steps in flight); a save waits or drops older steps to stay under it, and a step larger
            than the whole budget is an InvalidArgumentError. 0: no cap.
        timeout: seconds the collectives wait for other ranks; None: 10 minutes.
        device_snapshot: snapshot CUDA arrays in device memory instead of host memory (as ``async_save``).
        exchange_round_bytes: the most one rank sends another per exchange round (replication, restore); 0: 64 MiB.
        threads: writer threads of each step's background work (the part's write and checksums; replicating and
            persisting run on the manager's one thread); None: a quarter of the cores, 1 to 4.
        background_priority: the CPU and I/O priority of the background work: "normal", "low" (nice 19, I/O
            best-effort 7: yields to training) or "idle" (SCHED_IDLE, idle I/O class); None: the core's default,
            "normal" (docs/manager.md, "Background work": a lower priority slowed a busy host's loop down).
        persist_compression: ``"zstd"``: persisted steps are compressed (as ``save(compression=)``) while they are
            copied from the local tier, which stays raw; None: not compressed.
        persist_compression_level: as ``save(compression_level=)``.
        persist_incremental: a persisted step refers to the previous persisted step for every chunk whose bytes are
            equal there (same box and XXH3-128) instead of writing it again (docs/manager.md, "Persisting smaller");
            ``keep_persistent`` keeps every step a kept one refers to.
        persist_full_every: with ``persist_incremental``: every Nth persisted step of a chain is written whole
            (0: no bound).
    """

    def __init__(
        self,
        comm: Optional[Communicator] = None,
        *,
        local_dir: Optional[PathLike] = None,
        job: Optional[str] = None,
        node_id: Optional[str] = None,
        replicas: Optional[int] = None,
        persistent: Optional[PathLike] = None,
        persistent_storage: Optional["_storage.Storage"] = None,
        persist_every: int = 0,
        keep_local: int = 2,
        keep_persistent: int = 0,
        local_budget_bytes: int = 0,
        timeout: Optional[float] = None,
        device_snapshot: bool = False,
        exchange_round_bytes: int = 0,
        threads: Optional[int] = None,
        background_priority: Optional[str] = None,
        persist_compression: Optional[str] = None,
        persist_compression_level: int = 0,
        persist_incremental: bool = False,
        persist_full_every: int = 0,
    ) -> None:
        self._native: Optional[_native.Manager] = None
        self._comm = for_background(comm)
        path: Optional[str] = None
        native_storage = None
        if persistent is not None:
            path, native_storage, _ = _storage.resolve(os.fspath(persistent), persistent_storage)
        elif persistent_storage is not None:
            raise InvalidArgumentError("persistent_storage needs persistent=, the path of the persisted steps on it")
        for arg, value in (("replicas", 0 if replicas is None else replicas), ("persist_every", persist_every),
                           ("keep_local", keep_local),
                           ("keep_persistent", keep_persistent), ("local_budget_bytes", local_budget_bytes),
                           ("exchange_round_bytes", exchange_round_bytes), ("threads", threads or 0),
                           ("persist_full_every", persist_full_every)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"CheckpointManager: {arg} must be an int >= 0, not {value!r}")
        if background_priority not in _PRIORITIES:
            raise InvalidArgumentError(
                f"CheckpointManager: background_priority must be 'low', 'idle', 'normal' or None, not "
                f"{background_priority!r}"
            )
        self._native = _native.Manager.new(
            native_of(self._comm),
            None if local_dir is None else os.fspath(local_dir),
            job,
            node_id,
            _native.REPLICAS_AUTO if replicas is None else replicas,
            path,
            native_storage,
            persist_every,
            keep_local,
            keep_persistent,
            local_budget_bytes,
            _native.timeout_ms(timeout),
            device_snapshot,
            exchange_round_bytes,
            threads or 0,
            _PRIORITIES[background_priority],
            compression_code(persist_compression),
            persist_compression_level,
            bool(persist_incremental),
            persist_full_every,
        )
        self._persistent = None if persistent is None else os.fspath(persistent)
        with _open_lock:
            _open.add(self)

    @property
    def _manager(self) -> "_native.Manager":
        if self._native is None:
            raise StateError("the checkpoint manager is closed")
        return self._native

    @property
    def persistent(self) -> Optional[str]:
        """Where persisted steps go (``<persistent>/step-<10 digits>``), or None."""
        return self._persistent

    def save(self, step: int, state: Mapping[str, Any], *, persist: bool = False) -> None:
        """Saves ``state`` as ``step`` (larger than every step saved before); returns once it is copied.

        ``state`` is what :func:`distckpt.save` takes: numpy, torch and JAX arrays, ``Shard`` pieces, DTensors,
        stateful objects, and non-array values stored as JSON. Writing the local part, replicating it and persisting
        run on the core's background thread, in step order. ``persist=True`` persists this step whatever
        ``persist_every`` says (Orbax's ``force``). An error of earlier background work is raised here
        (``PeerError`` once the communicator has failed: the job must restart and restore).
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise InvalidArgumentError(f"CheckpointManager.save: step must be an int >= 0, not {step!r}")
        manager = self._manager
        with abort_on_local_error(self._comm):
            native_state = build_save_state(state, False, None)
        manager.save(int(step), native_state, bool(persist))

    def wait_until_finished(self, timeout: Optional[float] = None) -> None:
        """Waits until every step saved so far is complete (and persisted where asked), at most ``timeout`` seconds
        (None: until done); raises the first background error since the last wait, or ``distckpt.TimeoutError``."""
        ms = _native.WAIT_FOREVER if timeout is None else max(0, int(timeout * 1000))
        self._manager.wait(ms)

    def latest_step(self) -> Optional[int]:
        """The newest step this rank knows to be complete in the local tier (its parts and their replicas durable);
        None when there is none."""
        step = self._manager.latest_step()
        return None if step is None else int(step)

    def restore(
        self,
        state: MutableMapping[str, Any],
        *,
        fallback: bool = True,
        use_persistent: bool = True,
        max_object_bytes: Optional[int] = None,
    ) -> RestoreResult:
        """Fills ``state`` from the newest step that can be restored, like :func:`distckpt.load` (collective).

        Every rank passes its state as it would to ``load``: each array leaf says which part of the saved tensor this
        rank wants (any sharding, any number of ranks) and must have the saved dtype and global shape; non-array leaves
        are replaced by the saved values. The ranks agree on the newest step whose every part verifies in some tier
        (this node, a replica on another node, then persistent storage); a part that fails verification in one tier
        is read from the next, and ``RestoreResult.report`` says so.

        Args:
            fallback: when the newest complete step has lost parts in every tier, restore the newest one that can be
                (an older local step or a persisted one). False: ``NotFoundError`` naming the missing parts.
            use_persistent: consider persisted steps.
            max_object_bytes: room for each non-array value's stored JSON; None: 4 times what the value in ``state``
                encodes to, at least 4 KiB.

        Returns:
            What was restored (``found`` False, with ``state`` untouched, when there is no step anywhere).
        """
        manager = self._manager
        if max_object_bytes is not None and (isinstance(max_object_bytes, bool) or max_object_bytes < 0):
            raise InvalidArgumentError(f"restore: max_object_bytes must be an int >= 0, not {max_object_bytes!r}")
        source: Optional[_RestoreSource] = None
        try:
            flat = _tree.flatten(state, _arrays.is_load_target)
            source = _RestoreSource(manager, flat, fallback, use_persistent, max_object_bytes)
            filled = load_into(state, source, None, False, None)
        except _NothingToRestore:
            assert source is not None and source.info is not None
            return _result(source.info, None)
        except BaseException as e:
            # A failure on this rank before the collective restore tells the other ranks at once (as load does);
            # one of the restore itself was agreed on by every rank, and leaves the manager usable.
            if (source is None or not source.restoring) and self._comm is not None and not self._comm.closed:
                try:
                    self._comm.abort(f"{type(e).__name__}: {e}")
                except Exception:  # noqa: BLE001 - the original error matters more
                    pass
            raise
        assert source.info is not None
        return _result(source.info, filled)

    def stats(self) -> ManagerStats:
        """The manager's counters so far: steps saved and completed, the saves that waited for back-pressure and how
        long, bytes written and replicated. Unlike the other methods it may be called from another thread while
        ``save`` waits (a monitor)."""
        return ManagerStats(**self._manager.stats())

    def restore_report(self) -> str:
        """What the last restore did (also after a failed one), one line per fact."""
        return self._manager.restore_report()

    def close(self) -> None:
        """Waits for the background work, raising its error, and releases the manager (and its use of ``comm``).
        Safe to call twice."""
        native = self._native
        if native is None:
            return
        try:
            native.wait(_native.WAIT_FOREVER)
        finally:
            self._release()

    def _release(self) -> None:
        native, self._native = self._native, None
        if native is not None:
            native.close()  # waits for the background work; its errors are lost
        with _open_lock:
            _open.discard(self)

    @property
    def closed(self) -> bool:
        return self._native is None

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._release()  # the exception in flight matters more than a background error

    def __repr__(self) -> str:
        if self._native is None:
            return "<distckpt.CheckpointManager closed>"
        return f"<distckpt.CheckpointManager persistent={self._persistent!r}>"


def _result(info: Dict[str, Any], state: Any) -> RestoreResult:
    found = bool(info["found"])
    return RestoreResult(
        found=found,
        step=int(info["step"]) if found else None,
        tier=_TIER_NAMES.get(int(info["tier"]), str(info["tier"])),
        bytes_local=int(info["bytes_local"]),
        bytes_from_peers=int(info["bytes_from_peers"]),
        bytes_from_persistent=int(info["bytes_from_persistent"]),
        seconds=float(info["seconds"]),
        report=str(info["report"]),
        state=state,
        copies_made=int(info.get("copies_made", 0)),
    )


def _close_open_managers() -> None:
    with _open_lock:
        managers: List[CheckpointManager] = list(_open)
    for m in managers:
        try:
            m.close()
        except BaseException as e:  # noqa: BLE001
            warnings.warn(f"distckpt: checkpoint manager's background work failed: {e}", RuntimeWarning, stacklevel=1)


atexit.register(_close_open_managers)
