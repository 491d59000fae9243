"""Lightning integration: a ``CheckpointIO`` plugin that writes Lightning checkpoints as distckpt checkpoints.

::

    from lightning.pytorch import Trainer
    from distckpt.lightning import DistckptCheckpointIO

    trainer = Trainer(plugins=[DistckptCheckpointIO()])        # sync; or DistckptCheckpointIO(async_save=True)
    trainer.fit(model, ckpt_path="checkpoints/epoch=0-step=100.ckpt")      # resume, on any number of processes

The ``path`` Lightning passes (``.../epoch=0-step=100.ckpt``) becomes the checkpoint *directory*. What is stored how:

- Every tensor of the checkpoint dict (model weights, optimizer moments and steps, scheduler tensors, callback
  tensors such as ``best_model_score``) is a raw tensor entry, checksummed, readable from numpy, Rust, Go and C.
- Every other value is stored per leaf, as JSON when JSON (with distckpt's tagged forms for tuples, non-string keys,
  NaN/inf, bytes) can represent it: epoch, global_step, loops, callback states, optimizer ``param_groups``, hyper
  parameters made of numbers, strings, lists and dicts.
- Values JSON cannot represent (an omegaconf container, a ``pathlib.Path``, an enum, a class object, any object a
  hook put into the dict) are pickled, entry by entry, because ``allow_pickle=True`` is the default, as ``torch.save``
  would. Loading a pickled entry can run code: ``load_checkpoint(..., weights_only=True)`` (or
  ``allow_pickle=False``) refuses such entries with ``PickleNotAllowedError`` naming them, and
  ``DistckptCheckpointIO(allow_pickle=False)`` refuses to save them in the first place.

Which processes write. Lightning's own strategies call ``save_checkpoint`` on global rank 0 only (DDP state is
replicated), so with them rank 0 writes the whole checkpoint alone, atomically. :class:`DistckptDDPStrategy` (Trainer)
and :class:`DistckptFabricDDPStrategy` (Fabric) instead make every rank take part in one collective distckpt save over
a ``torch.distributed`` group of their own (:func:`distckpt.comm.from_torch`): the replicated bytes are written once,
split among the ranks, and the commit is still atomic.

Loading needs no collective: DDP state is replicated, so every rank reads the whole checkpoint on its own, whatever the
number of processes that saved it. Importing this module imports torch and lightning (``lightning.pytorch`` /
``lightning.fabric``; the standalone ``pytorch_lightning`` package is not supported).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.strategies import DDPStrategy as _FabricDDPStrategy
from lightning.pytorch.strategies import DDPStrategy as _TrainerDDPStrategy

from . import _arrays, _dtypes, _tree
from ._checkpoint import AsyncSave, SaveSummary, async_save, load, save
from .comm import Communicator, from_torch
from .errors import InvalidArgumentError, NotFoundError, StateError
from .reader import open as _open
from .storage import Storage, remove_checkpoint

__all__ = ["DistckptCheckpointIO", "DistckptDDPStrategy", "DistckptFabricDDPStrategy"]

#: The keyword arguments of distckpt.save that ``storage_options`` may set for one save.
_SAVE_OPTIONS = ("user_metadata", "sync", "io_threads", "checksum_block_size", "timeout", "progress", "compression",
                 "compression_level")  # fmt: skip


class DistckptCheckpointIO(CheckpointIO):
    """Saves and loads Lightning checkpoints with distckpt; pass it as ``Trainer(plugins=[...])`` or
    ``Fabric(plugins=[...])``.

    Args:
        async_save: return from ``save_checkpoint`` once the state is copied into memory distckpt owns; the writing
            and the commit go on in the background. Before the next save, before a removal of the checkpoint being
            written, at ``teardown`` (the end of ``fit``) and on :meth:`wait`, the previous save is waited for and its
            error, if any, raised.
        allow_pickle: pickle the non-tensor values JSON cannot represent (saving) and unpickle them (loading, unless
            Lightning asks for ``weights_only=True``). False keeps checkpoints free of pickle: a save that needs it
            fails with ``PickleNotAllowedError`` naming the value.
        overwrite: replace an existing checkpoint at the same path (atomically), as Lightning does with files. Only a
            distckpt checkpoint or an empty directory is replaced; anything else raises ``AlreadyExistsError``.
        storage: where checkpoints live (:mod:`distckpt.storage`); None: the path decides (``s3://...`` URLs on the
            core's S3 backend, other URLs through fsspec, plain paths on the POSIX file system).
        timeout: seconds each rank waits for the others at each step of a collective save (None: 10 minutes).
        save_options: further keyword arguments for every ``distckpt.save`` (``sync``, ``io_threads``,
            ``checksum_block_size``, ``user_metadata``, ``progress``). Lightning's ``storage_options`` may also be a
            dict of these, for one save.
        load_options: keyword arguments for ``distckpt.load`` (``verify``, ``io_threads``, ``map_files``).
    """

    def __init__(
        self,
        *,
        async_save: bool = False,
        allow_pickle: bool = True,
        overwrite: bool = True,
        storage: Optional[Storage] = None,
        timeout: Optional[float] = None,
        save_options: Optional[Mapping[str, Any]] = None,
        load_options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__()
        self.async_save = bool(async_save)
        self.allow_pickle = bool(allow_pickle)
        self.overwrite = bool(overwrite)
        self.storage = storage
        self.timeout = timeout
        self.save_options = _check_save_options(save_options, "save_options")
        self.load_options = dict(load_options or {})
        self._pending: Optional[AsyncSave] = None
        self._lock = threading.Lock()
        self._comm: Optional[Communicator] = None
        self._group: Any = None
        #: the summary of the last save that finished (sync saves, and async ones once waited for)
        self.last_summary: Optional[SaveSummary] = None

    def __getstate__(self) -> Dict[str, Any]:
        """For process launchers that pickle the strategy (``start_method="spawn"``, ``ddp_spawn``): the settings
        travel, the running save and the communicator stay in this process."""
        if self._pending is not None:
            raise StateError("a DistckptCheckpointIO with a save still running cannot be pickled: call wait() first")
        state = dict(self.__dict__)
        for key in ("_lock", "_comm", "_group"):
            state.pop(key)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._comm = None
        self._group = None

    # ---- CheckpointIO ------------------------------------------------------------------------------------------------

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        """Saves ``checkpoint`` as the distckpt checkpoint directory ``path``, from this process alone (Lightning's
        strategies call this on global rank 0 only)."""
        self._save(checkpoint, path, storage_options, comm=None)

    def save_collective(self, checkpoint: Dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        """Saves ``checkpoint`` together with every other rank of ``torch.distributed``'s default group: every rank
        must call this, in the same order (:class:`DistckptDDPStrategy` does). Replicated tensors and values are
        written once, the bytes split among the ranks; the commit is atomic. The collectives run over a gloo group
        this plugin creates (on the first call, which is therefore collective too), so an async save never
        interleaves with the training's own collectives."""
        self._save(checkpoint, path, storage_options, comm=self._communicator())

    def load_checkpoint(
        self, path: Any, map_location: Optional[Any] = None, weights_only: Optional[bool] = None
    ) -> Dict[str, Any]:
        """Reads the whole checkpoint at ``path`` back as Lightning's dict: tensors as torch tensors (on the CPU, or
        on ``map_location`` when that is a device or a device string), other values as saved. No collective: each
        process reads it on its own, whatever the number of processes that saved it. ``weights_only=True`` refuses
        pickled entries; None uses ``allow_pickle``."""
        path = os.fspath(path)
        self._wait_for(path)  # our own save of this path, still running
        allow_pickle = self.allow_pickle if weights_only is None else not weights_only
        device = _device_of(map_location)
        with _open(path, allow_pickle=allow_pickle, storage=self.storage) as reader:
            root = reader.structure
            if root is None:
                raise InvalidArgumentError(
                    f"checkpoint '{path}' was not written by distckpt's Python API (it has no nested structure); "
                    "read its entries with distckpt.open"
                )
            meta = reader.metadata

            def target(node: Dict[str, Any]) -> Any:
                if "array" not in node:
                    return None  # replaced by the stored value
                entry = meta[node["array"]]
                if node.get("scalar"):
                    return None  # a numpy scalar: comes back as a 0-d array, made a scalar below
                return torch.empty(entry.shape, dtype=_arrays.torch_dtype(_dtypes.code_of_name(entry.dtype)))

            tree = _tree.build(root, target)
        load(tree, path, allow_pickle=allow_pickle, timeout=self.timeout, storage=self.storage, **self.load_options)
        tree = _finish_loaded(root, tree, device)
        return tree

    def remove_checkpoint(self, path: Any) -> None:
        """Removes the distckpt checkpoint at ``path`` (waiting first if it is still being written), then its directory
        if that is left empty. A symbolic link (``save_last="link"``) is removed, not what it points to.
        ``NotFoundError`` if there is no distckpt checkpoint there: nothing else is ever deleted."""
        path = os.fspath(path)
        self._wait_for(path)
        local = self.storage is None and "://" not in path
        if local and os.path.islink(path):  # e.g. ModelCheckpoint's "last.ckpt" link: the link goes, not its target
            os.remove(path)
            return
        if local and os.path.lexists(path) and not os.path.isdir(path):
            raise NotFoundError(f"'{path}' is a file, not a distckpt checkpoint directory: it was left untouched")
        remove_checkpoint(path, storage=self.storage)  # the directory too, once empty (the core does it)

    def teardown(self) -> None:
        """Waits for a save still running (raising its error), and releases the communicator."""
        try:
            self.wait()
        finally:
            if self._comm is not None:
                self._comm.close()
                self._comm = None

    # ---- async -------------------------------------------------------------------------------------------------------

    def wait(self, timeout: Optional[float] = None) -> Optional[SaveSummary]:
        """Waits for the background save, if one is running, and returns its summary (None when none was pending).
        Raises the save's error. Every rank of a collective async save should call it (``teardown`` does)."""
        with self._lock:
            handle = self._pending
            if handle is None:
                return None
            try:
                summary = handle.result(timeout)
            except TimeoutError:  # the builtin one: still running, still pending
                raise
            except BaseException:
                self._pending = None
                raise
            self._pending = None
            self.last_summary = summary
            return summary

    @property
    def pending(self) -> Optional[AsyncSave]:
        """The handle of the background save, until it is waited for."""
        return self._pending

    # ---- internals ---------------------------------------------------------------------------------------------------

    def _save(self, checkpoint: Dict[str, Any], path: Any, storage_options: Optional[Any],
              comm: Optional[Communicator]) -> None:  # fmt: skip
        if not isinstance(checkpoint, Mapping):
            raise InvalidArgumentError(f"a Lightning checkpoint must be a dict, not {type(checkpoint).__name__}")
        path = os.fspath(path)
        options = {**self.save_options, **_check_save_options(storage_options, "storage_options")}
        options.setdefault("timeout", self.timeout)
        self.wait()  # one save at a time: the previous one must commit before the next starts
        if self.storage is None and "://" not in path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # as Lightning does for its files
        kwargs = dict(comm=comm, overwrite=self.overwrite, allow_pickle=self.allow_pickle, storage=self.storage)
        if self.async_save:
            handle = async_save(checkpoint, path, **kwargs, **options)
            with self._lock:
                self._pending = handle
        else:
            self.last_summary = save(checkpoint, path, **kwargs, **options)

    def _wait_for(self, path: str) -> None:
        handle = self._pending
        if handle is not None and os.path.abspath(handle.path) == os.path.abspath(path):
            self.wait()

    def _communicator(self) -> Communicator:
        import torch.distributed as dist  # noqa: PLC0415

        if not dist.is_available() or not dist.is_initialized():
            raise StateError("save_collective needs torch.distributed to be initialized (a DDP strategy's setup)")
        if self._comm is None:
            # A group of its own: an async save's collectives run on a distckpt thread while training goes on.
            self._group = dist.new_group(backend="gloo")
            self._comm = from_torch(self._group)
        return self._comm


def _check_save_options(options: Optional[Any], what: str) -> Dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise InvalidArgumentError(
            f"{what} must be None or a dict of distckpt.save options ({', '.join(_SAVE_OPTIONS)}), "
            f"not {type(options).__name__}"
        )
    unknown = sorted(set(options) - set(_SAVE_OPTIONS))
    if unknown:
        raise InvalidArgumentError(f"{what}: unknown option(s) {unknown}; distckpt accepts {list(_SAVE_OPTIONS)}")
    return dict(options)


def _device_of(map_location: Optional[Any]) -> Optional[torch.device]:
    if map_location is None:
        return None
    if isinstance(map_location, (str, torch.device)):
        return torch.device(map_location)
    raise InvalidArgumentError(
        f"map_location={map_location!r}: distckpt's Lightning plugin takes None, a torch.device or a device string "
        "(functions and dicts are torch.load's remapping of pickled storages, which distckpt does not have)"
    )


def _finish_loaded(node: Dict[str, Any], value: Any, device: Optional[torch.device]) -> Any:
    """Numpy scalars back to scalars, and tensors to ``device``, following the saved structure."""
    if "dict" in node:
        for key, child in node["dict"]:
            value[key] = _finish_loaded(child, value[key], device)
        return value
    if "list" in node or "tuple" in node:
        children: List[Dict[str, Any]] = node["list"] if "list" in node else node["tuple"]
        items = [_finish_loaded(child, v, device) for child, v in zip(children, value)]
        return items if "list" in node else tuple(items)
    if "array" in node and node.get("scalar") and isinstance(value, np.ndarray):
        return value[()]
    if device is not None and isinstance(value, torch.Tensor):
        return value.to(device)
    return value


# ---- strategies whose every rank takes part in the save -------------------------------------------------------------


def _plugin(strategy: Any) -> DistckptCheckpointIO:
    io = strategy.checkpoint_io
    if not isinstance(io, DistckptCheckpointIO):
        raise InvalidArgumentError(
            f"{type(strategy).__name__} saves collectively through DistckptCheckpointIO; its checkpoint_io is a "
            f"{type(io).__name__}: pass plugins=[distckpt.lightning.DistckptCheckpointIO()]"
        )
    return io


class DistckptDDPStrategy(_TrainerDDPStrategy):
    """Lightning Trainer's DDP strategy, except that every rank takes part in saving a checkpoint (one collective
    distckpt save: the replicated state is written once, split among the ranks). Use it with
    :class:`DistckptCheckpointIO`: ``Trainer(strategy=DistckptDDPStrategy(), plugins=[DistckptCheckpointIO()])``.
    Removing stays on global rank 0; loading is per rank, as with DDPStrategy."""

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        _plugin(self).save_collective(checkpoint, filepath, storage_options)

    def teardown(self) -> None:
        _plugin(self).wait()  # the group the save uses must outlive it
        super().teardown()


class DistckptFabricDDPStrategy(_FabricDDPStrategy):
    """Fabric's DDP strategy, except that every rank takes part in ``fabric.save`` (one collective distckpt save).
    Use it with :class:`DistckptCheckpointIO`: ``Fabric(strategy=DistckptFabricDDPStrategy(),
    plugins=[DistckptCheckpointIO()])``."""

    def save_checkpoint(self, path: Any, state: Dict[str, Any], storage_options: Optional[Any] = None,
                        filter: Optional[Dict[str, Any]] = None) -> None:  # noqa: A002 - Lightning's name  # fmt: skip
        state = self._convert_stateful_objects_in_state(state, filter=(filter or {}))
        _plugin(self).save_collective(state, path, storage_options)

    def teardown(self) -> None:
        _plugin(self).wait()
        super().teardown()
