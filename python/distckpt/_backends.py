"""The storage classes below distckpt.storage: ``Storage`` (one native ``dckpt_storage``), the built-in POSIX and memory
backends, and ``CallbackStorage`` (storage plugged in through an object's methods; the protocol is documented in
:mod:`distckpt.storage`). Internal: import them from ``distckpt.storage`` (or ``distckpt``), which re-exports them.
"""

from __future__ import annotations

import os
from typing import Any, Union

from . import _native
from .errors import InvalidArgumentError

PathLike = Union[str, "os.PathLike[str]"]


class Storage:
    """A storage backend (one native ``dckpt_storage``). Thread-safe; one may serve many saves and loads at once, and
    the saves and readers using it keep it alive."""

    _native: "_native.Storage"

    def path_of(self, path: PathLike) -> str:
        """The path the storage sees for ``path`` as the user wrote it (a URL loses its protocol where the storage
        names paths without one)."""
        return os.fspath(path)

    @property
    def native(self) -> "_native.Storage":
        return self._native

    def __repr__(self) -> str:
        return f"<distckpt.{type(self).__name__}>"


class PosixStorage(Storage):
    """The POSIX file system, what no storage means: atomic rename commit, fsync, mapped reads."""

    def __init__(self) -> None:
        self._native = _native.Storage.posix()

    def path_of(self, path: PathLike) -> str:
        path = os.fspath(path)
        return path[len("file://") :] if path.startswith("file://") else path


class MemoryStorage(Storage):
    """An in-process store of files, lost with the object (tests, examples); committed metadata-last like plugged-in
    storage."""

    def __init__(self) -> None:
        self._native = _native.Storage.memory()


class CallbackStorage(Storage):
    """Storage through ``impl``'s methods (the protocol is in :mod:`distckpt.storage`'s documentation).

    ``max_in_flight``: the most ``write``/``read`` calls running at once (0: distckpt's default, 16).
    """

    def __init__(self, impl: Any, *, max_in_flight: int = 0) -> None:
        if max_in_flight < 0:
            raise InvalidArgumentError(f"max_in_flight must be >= 0, not {max_in_flight}")
        self.impl = impl
        self._native = _native.Storage.callbacks(impl, max_in_flight)
