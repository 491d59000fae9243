"""Orbax integration: ``ocp.CheckpointManager`` saves and restores pytrees of sharded ``jax.Array``s with distckpt.

``DistckptSave`` / ``DistckptRestore`` are Orbax ``CheckpointArgs`` registered with :class:`DistckptCheckpointHandler`,
so a ``CheckpointManager`` picks the handler from the arguments alone::

    import orbax.checkpoint as ocp
    from distckpt.orbax import DistckptRestore, DistckptSave

    with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(max_to_keep=3)) as mngr:
        mngr.save(step, args=ocp.args.Composite(state=DistckptSave(state)))
        ...
        restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(state=DistckptRestore(abstract_state)))

**Layout.** Orbax hands the handler an item directory (``<root>/<step>/<item>``, under a temporary name until Orbax
finalizes the step). The handler writes one ordinary distckpt checkpoint into its subdirectory ``distckpt``
(:data:`SUBDIRECTORY`): ``<root>/<step>/<item>/distckpt/metadata.dckpt`` plus data files. Orbax creates (and later
renames) the item directory; distckpt creates ``distckpt`` inside it atomically (staging name, fsync, rename) and never
touches anything else there, so the two commits nest: distckpt's checkpoint is complete before Orbax finalizes the
step, and a step that failed part-way is an Orbax temporary directory that Orbax removes. Every distckpt tool reads
the subdirectory as it is (``python -m distckpt ls <root>/<step>/<item>/distckpt``); restoring also accepts an item
directory that *is* a plain distckpt checkpoint (one written by ``distckpt.save``).

**Names.** A pytree path becomes a distckpt entry name exactly as :func:`distckpt.save` names the same nested dicts
and lists: the keys joined with ``"."``. Dict keys are used as they are (``str`` or ``int``), list and tuple
positions are their indices, and the fields of dataclasses, ``NamedTuple``\\ s (optax states) and other registered
pytree nodes are their attribute names (``jax.tree_util`` key paths: ``DictKey``, ``SequenceKey``, ``GetAttrKey``,
``FlattenedIndexKey``). ``{"params": {"layers": [{"kernel": w}]}, "step": 3}`` is stored as ``params.layers.0.kernel``
and ``step``, so a checkpoint written by ``distckpt.save`` of the same dict restores through this handler and the
other way round. As in ``distckpt.save``, a list or tuple that holds no array anywhere is stored whole, as one value
(``"lr_schedule": [0.1, 0.01]`` is the entry ``lr_schedule``). Two pytree paths that give one name (a dict key that
contains ``"."`` next to a nested dict) are refused with an error.

**Leaves.** Arrays (``jax.Array`` of any sharding, numpy arrays and scalars) are tensors; each process writes the
boxes its devices hold, replicated boxes once. Other leaves (ints, floats, bools, strings, ``None`` inside a stored
list, ...) are stored as JSON values and come back as they were. ``None`` and empty containers are pytree nodes
without leaves: nothing is stored for them, and a restore takes them from the target.

**Restore.** ``DistckptRestore(target)`` takes a pytree of the same structure whose array leaves are
``jax.ShapeDtypeStruct(shape, dtype, sharding=...)`` or ``jax.Array``\\ s: each restored array gets its target's
sharding and dtype (another mesh, partition spec or device count than the one that saved it is fine; each device's
box is read from disk, and nothing else), numpy array targets give new numpy arrays (the target is not written to),
and other leaves give the stored values (converted to the target's type where it is a Python ``int``, ``float``,
``bool`` or ``complex`` and the stored value is a 0-d array). A target may name a subset of the checkpoint: only
those entries are read. Without a target the whole item comes back as nested dicts/lists of numpy arrays and values.

**Async.** The handler is an Orbax ``AsyncCheckpointHandler``: ``async_save`` returns once :func:`distckpt.async_save`
has copied the arrays into memory distckpt owns (the training step may then donate or overwrite them); writing,
hashing and distckpt's commit run on distckpt's background thread, and the commit future Orbax waits on before
finalizing the step completes when that save has committed (or raises its error). Orbax may create the item
directory asynchronously; ``async_save`` first waits for the directory-creation signals Orbax contracted for (a few
milliseconds on a local file system).

**Several processes.** Pass ``comm`` (a :mod:`distckpt.comm` communicator over the processes, e.g. Gloo) to the
handler: every process then saves and loads collectively, writing and reading only its own devices' shards. Register
the configured handler with the manager (``ocp.CheckpointManager(root, item_handlers={"state": handler})``).

Importing this module imports jax and orbax.checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from . import _arrays, _checkpoint, _tree
from .comm import Communicator
from .errors import InvalidArgumentError, NotFoundError
from .reader import open as _open

__all__ = ["SUBDIRECTORY", "DistckptCheckpointHandler", "DistckptSave", "DistckptRestore", "entry_names"]

#: The subdirectory of Orbax's item directory that holds the distckpt checkpoint.
SUBDIRECTORY = "distckpt"
_METADATA_FILE = "metadata.dckpt"  # core/format/metadata.h kMetadataFileName

# One step of a pytree path: (is_sequence, key). Sequences (lists, tuples) become lists, everything else dicts.
_Step = Tuple[bool, Union[str, int]]


# ---- pytree <-> the nested dicts and lists distckpt names ------------------------------------------------------------


def _step(key: Any) -> _Step:
    """One jax.tree_util key -> (is_sequence, key)."""
    tu = jax.tree_util
    if isinstance(key, tu.SequenceKey):
        return True, int(key.idx)
    if isinstance(key, tu.DictKey):
        k = key.key
        if isinstance(k, bool) or not isinstance(k, (str, int)):
            raise InvalidArgumentError(
                f"pytree dict key {k!r} ({type(k).__name__}): distckpt names need str or int keys"
            )
        return False, k
    if isinstance(key, tu.GetAttrKey):
        return False, key.name
    if isinstance(key, tu.FlattenedIndexKey):
        return False, int(key.key)
    raise InvalidArgumentError(f"pytree key {key!r} of type {type(key).__name__} has no distckpt name")


def _paths(tree: Any) -> Tuple[List[Tuple[_Step, ...]], List[Any], Any]:
    """The leaves of ``tree`` with their paths, and its treedef. ``None`` is an empty node, as in JAX."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
    paths = [tuple(_step(k) for k in path) for path, _ in with_path]
    leaves = [leaf for _, leaf in with_path]
    if any(not p for p in paths):
        raise InvalidArgumentError(
            "the item is a single leaf: distckpt saves a pytree whose root is a container (a dict, list, dataclass, "
            "...); wrap it, e.g. {'value': x}"
        )
    for path, leaf in zip(paths, leaves):
        dtype = getattr(leaf, "dtype", None)
        if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            raise InvalidArgumentError(
                f"'{_name(path)}' is a typed PRNG key array ({dtype}), which has no distckpt dtype: save "
                "jax.random.key_data(key) and rebuild the key with jax.random.wrap_key_data"
            )
    return paths, leaves, treedef


def _name(path: Tuple[_Step, ...]) -> str:
    return ".".join(str(k) for _, k in path)


def entry_names(tree: Any) -> List[str]:
    """The distckpt entries saving ``tree`` writes (``params.layers.0.kernel``, ...), in traversal order.

    A list or tuple without arrays is one entry, named after the list; every other leaf is an entry of its own.
    """
    paths, leaves, _ = _paths(tree)
    return [leaf.name for leaf in _tree.flatten(_tree.nest(paths, leaves), _arrays.is_load_target).leaves]


def _lookup(template: Any, loaded: Any, path: Tuple[_Step, ...], where: str) -> Any:
    """The value at ``path`` in ``loaded`` (the nest distckpt.load returned), checking that a list the checkpoint
    stored whole has the target's length."""
    node_t, node_l = template, loaded
    for depth, (_, key) in enumerate(path):
        if isinstance(node_t, list) and (not isinstance(node_l, (list, tuple)) or len(node_l) != len(node_t)):
            got = type(node_l).__name__ + (f" of {len(node_l)}" if isinstance(node_l, (list, tuple)) else "")
            raise InvalidArgumentError(
                f"{where}: '{_name(path[:depth]) or '<root>'}' is a {got} in the checkpoint, but a list of "
                f"{len(node_t)} in the target"
            )
        try:
            node_l = node_l[key]
        except (IndexError, KeyError, TypeError):
            raise NotFoundError(f"{where}: the checkpoint has no value at '{_name(path[: depth + 1])}'") from None
        node_t = node_t[key]
    return node_l


# ---- The Orbax handler and its arguments -----------------------------------------------------------------------------


class DistckptCheckpointHandler(ocp.AsyncCheckpointHandler):
    """Saves and restores one pytree item as a distckpt checkpoint in ``<item directory>/distckpt``.

    Args:
        comm: the processes that save and restore together (:mod:`distckpt.comm`); None for one process.
        io_threads: distckpt I/O threads; 0 picks a default.
        sync: fsync data, metadata and directories.
        checksum_block_size: bytes per checksum block (a power of two >= 4096); 0 means 1 MiB.
        timeout: seconds to wait for other processes at each collective step; None: distckpt's default.
        verify: check checksums when restoring.
        allow_pickle: store leaves JSON cannot represent with pickle (restoring them needs it too).
        compression, compression_level: as for :func:`distckpt.save` (``"zstd"``: docs/compression.md); restoring
            needs nothing more.
    """

    def __init__(
        self,
        *,
        comm: Optional[Communicator] = None,
        io_threads: int = 0,
        sync: bool = True,
        checksum_block_size: int = 0,
        timeout: Optional[float] = None,
        verify: bool = True,
        allow_pickle: bool = False,
        compression: Optional[str] = None,
        compression_level: int = 0,
    ) -> None:
        _checkpoint.compression_code(compression)  # a bad value fails here, not at the first save
        self._comm = comm
        self._compression = compression
        self._compression_level = compression_level
        self._io_threads = io_threads
        self._sync = sync
        self._checksum_block_size = checksum_block_size
        self._timeout = timeout
        self._verify = verify
        self._allow_pickle = allow_pickle

    # -- save --

    def _save_kwargs(self, args: "DistckptSave") -> Dict[str, Any]:
        return dict(
            comm=self._comm, allow_pickle=self._allow_pickle, user_metadata=args.user_metadata, sync=self._sync,
            io_threads=self._io_threads, checksum_block_size=self._checksum_block_size, timeout=self._timeout,
            compression=self._compression, compression_level=self._compression_level,
        )  # fmt: skip

    @staticmethod
    def _check_args(args: Any, cls: type, what: str) -> None:
        if not isinstance(args, cls):
            raise InvalidArgumentError(
                f"DistckptCheckpointHandler.{what} takes args={cls.__name__}(...); got {type(args).__name__}"
            )

    @staticmethod
    def _wait_for_directory() -> None:
        """Waits for the directory-creation signals Orbax contracted for this operation (none: returns at once)."""

        async def nothing() -> None:
            return None

        ocp.future.CommitFutureAwaitingContractedSignals(nothing(), name="distckpt_wait_dirs").result()

    async def async_save(  # type: ignore[override]
        self, directory: epath.Path, args: Optional["DistckptSave"] = None
    ) -> Optional[List[ocp.future.Future]]:
        """Starts the save into ``directory/distckpt``; returns once the arrays are copied. The returned commit
        future completes when distckpt has committed the checkpoint."""
        self._check_args(args, DistckptSave, "async_save")
        assert args is not None
        state = _tree.nest(*_paths(args.item)[:2])
        self._wait_for_directory()
        handle = _checkpoint.async_save(state, _target_path(directory), **self._save_kwargs(args))
        return [_CommitFuture(handle)]

    def save(self, directory: epath.Path, args: Optional["DistckptSave"] = None) -> None:  # type: ignore[override]
        """Saves into ``directory/distckpt`` and returns once distckpt has committed it."""
        self._check_args(args, DistckptSave, "save")
        assert args is not None
        state = _tree.nest(*_paths(args.item)[:2])
        self._wait_for_directory()
        _checkpoint.save(state, _target_path(directory), **self._save_kwargs(args))

    # -- restore --

    def restore(self, directory: epath.Path, args: Optional["DistckptRestore"] = None) -> Any:  # type: ignore[override]
        """Restores the item saved in ``directory`` (see the module docs for targets)."""
        if args is None:
            args = DistckptRestore()
        self._check_args(args, DistckptRestore, "restore")
        path = _checkpoint_path(directory)
        kwargs = dict(comm=self._comm, allow_pickle=self._allow_pickle, verify=self._verify,
                      io_threads=self._io_threads, timeout=self._timeout)  # fmt: skip
        if args.item is None:
            return _checkpoint.load(None, path, **kwargs)
        paths, templates, treedef = _paths(args.item)
        targets = [_load_target(t) for t in templates]
        shape = _tree.nest(
            paths, targets
        )  # load replaces leaves in the nest it is given: keep the target's shape apart
        loaded = _checkpoint.load(_tree.nest(paths, targets), path, **kwargs)
        values = [
            _as_target_type(_lookup(shape, loaded, p, f"checkpoint '{path}'"), t) for p, t in zip(paths, templates)
        ]
        return jax.tree_util.tree_unflatten(treedef, values)

    def metadata(self, directory: epath.Path) -> Dict[str, Any]:
        """The item's entries without reading data: name -> ``jax.ShapeDtypeStruct`` for arrays (no sharding), and
        name -> ``"bytes"`` for stored values. ``restore`` accepts a pytree built from these (add shardings)."""
        with _open(_checkpoint_path(directory), verify=False) as reader:
            out: Dict[str, Any] = {}
            for name, entry in reader.metadata.items():
                out[name] = jax.ShapeDtypeStruct(entry.shape, entry.numpy_dtype) if entry.kind == "tensor" else "bytes"
            return out

    def finalize(self, directory: epath.Path) -> None:
        """Nothing to do: distckpt committed the checkpoint before the commit future completed."""

    def close(self) -> None:
        """Nothing to release: saves still running are waited for by their commit futures (and at exit)."""


class _CommitFuture:
    """An Orbax commit future for one distckpt.AsyncSave: ``result`` waits for distckpt's commit."""

    def __init__(self, handle: _checkpoint.AsyncSave) -> None:
        self._handle = handle

    def result(self, timeout: Optional[float] = None) -> _checkpoint.SaveSummary:
        return self._handle.result(timeout)

    def cancel(self) -> bool:
        return False  # a distckpt save cannot be cancelled; it finishes or fails on its own


def _target_path(directory: Any) -> str:
    return os.fspath(epath.Path(directory) / SUBDIRECTORY)


def _checkpoint_path(directory: Any) -> str:
    """The distckpt checkpoint of an item directory: its ``distckpt`` subdirectory, or the directory itself when it is
    a plain distckpt checkpoint."""
    directory = epath.Path(directory)
    sub = directory / SUBDIRECTORY
    if (sub / _METADATA_FILE).exists():
        return os.fspath(sub)
    if (directory / _METADATA_FILE).exists():
        return os.fspath(directory)
    raise NotFoundError(
        f"'{directory}' holds no distckpt checkpoint (neither '{SUBDIRECTORY}/{_METADATA_FILE}' nor {_METADATA_FILE})"
    )


def _load_target(template: Any) -> Any:
    """What distckpt.load fills for one target leaf. Numpy targets get fresh arrays (the caller's are not written)."""
    if isinstance(template, (np.ndarray, np.generic)):
        return np.empty(np.shape(template), dtype=np.asarray(template).dtype)
    return template


def _as_target_type(value: Any, template: Any) -> Any:
    if isinstance(template, np.generic) and isinstance(value, np.ndarray) and value.ndim == 0:
        return value[()]
    if isinstance(template, (bool, int, float, complex)) and isinstance(value, (np.ndarray, np.generic)):
        if np.ndim(value) == 0:
            return type(template)(np.asarray(value).item())
    return value


@ocp.args.register_with_handler(DistckptCheckpointHandler, for_save=True)
@dataclasses.dataclass
class DistckptSave(ocp.args.CheckpointArgs):
    """Saves ``item`` (a pytree of arrays and values) with :class:`DistckptCheckpointHandler`.

    Attributes:
        item: the pytree; its root must be a container (dict, list, dataclass, ...).
        user_metadata: free-form str -> str pairs stored in the distckpt metadata (``distckpt ls`` shows them).
    """

    item: Any
    user_metadata: Optional[Mapping[str, str]] = None


@ocp.args.register_with_handler(DistckptCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class DistckptRestore(ocp.args.CheckpointArgs):
    """Restores with :class:`DistckptCheckpointHandler` into the structure of ``item``.

    Attributes:
        item: the target pytree (``jax.ShapeDtypeStruct`` with shardings, ``jax.Array``\\ s, numpy arrays, values);
            None: the whole item as nested dicts/lists of numpy arrays and values.
    """

    item: Any = None
