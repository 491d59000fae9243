"""distckpt: distributed checkpointing for numpy, torch and JAX over a C++ core.

The API follows ``torch.distributed.checkpoint`` (DCP) without requiring torch::

    import distckpt

    distckpt.save({"model": params, "step": 100}, "/ckpt/step-100")          # every rank, its own pieces
    state = distckpt.load(None, "/ckpt/step-100")                            # one process: new numpy arrays
    distckpt.load(my_state, "/ckpt/step-100", comm=distckpt.comm.gloo())     # fill in place, resharding

    handle = distckpt.async_save(state, "/ckpt/step-200")   # returns once the state is copied; arrays are free
    handle.result()

    with distckpt.open("/ckpt/step-100") as r:              # offline reads of any region
        block = r["model.w"][1024:2048, :]

    mgr = distckpt.CheckpointManager(comm, persistent="/ckpt/job", persist_every=100)  # every step, in tiers
    mgr.save(step, state)                                   # node-local, replicated to other nodes, persisted
    mgr.restore(state)                                      # the newest step that survived (docs/manager.md)

Non-array values are stored as JSON; pickle is used only with ``allow_pickle=True``. Errors are
:class:`distckpt.Error` subclasses carrying the C library's message (see :mod:`distckpt.errors`).
"""

from __future__ import annotations

from . import comm, errors, storage
from ._checkpoint import AsyncSave, SaveSummary, async_save, load, save
from ._leftovers import Leftover, prune, scan_leftovers
from ._native import version_string as _version_string
from .errors import (
    AlreadyExistsError,
    CallbackError,
    CorruptCheckpointError,
    Error,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PeerError,
    PickleNotAllowedError,
    StorageError,
    TimeoutError,
    UnsupportedError,
    VersionError,
)
from .interop import export_safetensors, import_safetensors, import_torch_dcp
from .manager import CheckpointManager, ManagerStats, RestoreResult
from .reader import ArrayView, CheckpointMetadata, ChunkMetadata, EntryMetadata, IoStats, Reader, open
from .sharding import Shard
from .storage import (
    CallbackStorage,
    FsspecStorage,
    MemoryStorage,
    PathInfo,
    PosixStorage,
    S3Storage,
    Storage,
    flatten,
    listdir,
    remove_checkpoint,
    remove_leftovers,
    storage_for,
    storage_stat,
)

__version__: str = _version_string()

__all__ = [
    "__version__",
    "save",
    "async_save",
    "load",
    "open",
    "Shard",
    "SaveSummary",
    "AsyncSave",
    "CheckpointManager",
    "ManagerStats",
    "RestoreResult",
    "Reader",
    "ArrayView",
    "CheckpointMetadata",
    "EntryMetadata",
    "ChunkMetadata",
    "IoStats",
    "export_safetensors",
    "import_safetensors",
    "import_torch_dcp",
    "comm",
    "errors",
    "storage",
    "Storage",
    "PosixStorage",
    "MemoryStorage",
    "CallbackStorage",
    "S3Storage",
    "FsspecStorage",
    "storage_for",
    "listdir",
    "PathInfo",
    "storage_stat",
    "remove_leftovers",
    "scan_leftovers",
    "prune",
    "Leftover",
    "remove_checkpoint",
    "flatten",
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "CorruptCheckpointError",
    "VersionError",
    "StorageError",
    "TimeoutError",
    "CallbackError",
    "UnsupportedError",
    "AlreadyExistsError",
    "PeerError",
    "InternalError",
    "PickleNotAllowedError",
]
