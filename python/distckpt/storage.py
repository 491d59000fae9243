"""Where checkpoints live: the POSIX file system (the default), S3, an in-process store, or storage you plug in.

Every entry point that takes a checkpoint path (``save``, ``async_save``, ``load``, ``open``, ``export_safetensors``,
the prune functions below) also takes ``storage=``. Without it, the path picks the storage: ``"s3://bucket/ckpt"``
goes to distckpt's own S3 backend in the core (configured from the ``AWS_*`` environment as the AWS CLI is; the same
backend C, Rust and Go programs and the ``distckpt`` CLI use; :class:`S3Storage` sets its options explicitly);
``"gs://..."``, ``"az://..."``, ``"memory://..."`` or any other fsspec protocol goes through :class:`FsspecStorage`
(``fsspec.core.url_to_fs``, so fsspec's usual configuration applies), and a scheme nothing serves is an
``UnsupportedError`` naming it; plain paths and ``file://`` URLs stay on the built-in POSIX backend. S3 through
s3fs is still there for the asking: ``storage=FsspecStorage(s3fs.S3FileSystem(...))``.

Plugged-in storage has no rename, so distckpt commits there by writing the metadata last (core/format/FORMAT.md,
"Commit on storage without rename"): data files ``data-NNNNN.<nonce>.bin`` and a marker ``STAGING.<nonce>`` below the
checkpoint path, then ``metadata.dckpt``, whose appearance is the commit. A save that dies leaves files but no
checkpoint; :func:`storage_stat` shows them and :func:`remove_leftovers` removes them.

A callback storage is any object with these methods (:class:`CallbackStorage` wraps one; they are called from several
distckpt threads at once, each with the GIL, so they must be thread-safe (a distckpt thread keeps one Python thread
state while it lives, so ``threading.local()`` holds per-thread resources between calls); raise ``FileNotFoundError``
for a missing path, ``FileExistsError`` where commit finds one, anything else for an I/O error; the exception's text is
added to the ``distckpt.Error`` the call raises, and the exception becomes its ``__cause__``):

- ``create(path, size_hint) -> handle``: start writing ``path`` (``size_hint``: its final size, 0 if unknown); nothing
  may be visible at ``path`` before ``close``.
- ``write(handle, offset, data)``: ``data`` (a memoryview, valid only during the call) at ``offset``; calls for one
  file come from several threads, for disjoint ranges, in any order.
- ``sync(handle)`` (optional, may be None): make what was written durable.
- ``close(handle, size, discard)``: publish the file with ``size`` bytes (the rest zeros), or drop it if ``discard``.
- ``size(path) -> int``.
- ``read(path, offset, out) -> int``: fill the writable memoryview ``out`` from ``offset``; return the bytes read
  (fewer only at the end of the file).
- ``list(dir) -> iterable of str``: the names directly below ``dir`` (plain names, sub-"directories" included).
- ``remove(path)``: remove a file; nothing to do if it is missing.
- ``commit(path, data, replace)`` (optional): write ``data`` at ``path`` in one atomic step; with ``replace`` False,
  raise ``FileExistsError`` if something is there (S3: a PUT with ``If-None-Match: *``).
- Multipart uploads (optional, all four or none, with an attribute ``min_part_size``): distckpt then assembles a
  file of more than one part itself, buffering a few parts at a time and sending each as soon as its bytes are in
  (the file is never held whole; smaller files still go through ``create``/``write``/``close``).
  ``upload_begin(path, size_hint) -> handle`` starts one; ``upload_part(handle, part_number, data)`` sends part
  ``part_number`` (from 1; ``data`` a memoryview valid only during the call; every part but the last is the same size,
  at least ``min_part_size``; several parts may be in flight at once); ``upload_complete(handle)`` publishes the
  object; ``upload_abort(handle)`` drops the upload and its parts (called instead of ``upload_complete`` when the
  file is discarded or a call failed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from . import _native
from ._backends import CallbackStorage, MemoryStorage, PathLike, PosixStorage, S3Storage, Storage
from ._fsspec_storage import FsspecStorage
from .errors import InvalidArgumentError, UnsupportedError

__all__ = [
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
    "remove_checkpoint",
]

# The classes are defined in _backends and _fsspec_storage; this module is their public home (reprs, docs, help()).
for _cls in (Storage, PosixStorage, MemoryStorage, CallbackStorage, S3Storage, FsspecStorage):
    _cls.__module__ = __name__
del _cls


# ---- Choosing a storage ----------------------------------------------------------------------------------------------


def url_scheme(path: str) -> Optional[str]:
    """The scheme of a URL ("s3" for "s3://b/k"), None for a plain path."""
    head, sep, _ = path.partition("://")
    if not sep or not head or "/" in head:
        return None
    return head


def is_core_url(path: str) -> bool:
    """Whether ``path`` is a URL the core serves itself with no storage given (``s3://``)."""
    return url_scheme(path) == "s3"


def storage_for(url_or_path: PathLike, **storage_options: Any) -> Storage:
    """The storage a path or URL names: POSIX for a plain path or ``file://``; :class:`S3Storage` for ``s3://``
    (``storage_options`` are its keyword arguments); otherwise :class:`FsspecStorage` over
    ``fsspec.core.url_to_fs(url, **storage_options)``. A scheme that nothing here serves is an ``UnsupportedError``
    naming it."""
    path = os.fspath(url_or_path)
    protocol = url_scheme(path)
    if protocol is None or protocol in ("file", "local"):
        return PosixStorage()
    if protocol == "s3":
        return S3Storage(**storage_options)
    serves = "distckpt serves s3:// URLs and local paths itself; other schemes go through fsspec"
    try:
        import fsspec.core  # noqa: PLC0415 - fsspec is optional; only URLs other than s3:// need it
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise UnsupportedError(
            f"'{path}': no storage for URLs of scheme '{protocol}' here: {serves}, which is not installed (pip "
            f"install 'distckpt[fsspec]' and the store's package: gcsfs, adlfs, ...)"
        ) from e
    try:
        fs, _ = fsspec.core.url_to_fs(path, **storage_options)
    except ImportError as e:  # a protocol fsspec knows whose package is missing (gcsfs for gs://)
        raise UnsupportedError(f"'{path}': no storage for URLs of scheme '{protocol}' here: {e} ({serves})") from e
    except ValueError as e:
        if "protocol" not in str(e).lower():
            raise
        raise UnsupportedError(f"'{path}': unknown URL scheme '{protocol}' ({serves}; fsspec: {e})") from e
    return FsspecStorage(fs)


def resolve(path: PathLike, storage: Optional[Storage]) -> Tuple[str, Optional["_native.Storage"], Optional[Storage]]:
    """(path as the storage sees it, native storage or None for the core's choice by path, the Storage) for an entry
    point's arguments. With no storage, plain paths and ``s3://`` URLs go to the core as they are (POSIX; S3 from the
    environment)."""
    if storage is not None and not isinstance(storage, Storage):
        raise InvalidArgumentError(f"storage must be a distckpt.storage.Storage or None, not {type(storage).__name__}")
    text = os.fspath(path)
    if storage is None:
        protocol = url_scheme(text)
        if protocol is None or protocol == "s3":
            return text, None, None
        if protocol in ("file", "local"):
            return text.split("://", 1)[1], None, None
        storage = storage_for(text)
    if isinstance(storage, PosixStorage):
        return storage.path_of(text), None, storage
    return storage.path_of(text), storage.native, storage


def listdir(path: PathLike, *, storage: Optional[Storage] = None) -> List[str]:
    """The names directly below ``path`` (a URL, or a path on ``storage``), each once, sorted: files and directories
    (on an object store, the first component of longer keys). A ``path`` with nothing below it has none."""
    p, native, _ = resolve(path, storage)
    return list(_native.storage_list(native, p))


# ---- Prune -----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PathInfo:
    """What is at a checkpoint path (:func:`storage_stat`)."""

    kind: str  #: "checkpoint" (committed), "incomplete" (only what unfinished saves left) or "none"
    files: int  #: files distckpt wrote there, committed and leftover
    bytes: int
    leftover_files: int  #: files no committed checkpoint refers to (unfinished or superseded saves)
    leftover_bytes: int
    saves_in_progress: int  #: unfinished saves whose marker is younger than the grace period


def storage_stat(path: PathLike, *, storage: Optional[Storage] = None, grace_seconds: float = 3600) -> PathInfo:
    """Describes the checkpoint at ``path`` (a URL, or a path on ``storage``) laid out for storage without rename.
    Saves whose marker is younger than ``grace_seconds`` count as in progress."""
    p, native, _ = resolve(path, storage)
    return PathInfo(**_native.storage_stat(native, p, float(grace_seconds)))


def remove_leftovers(
    path: PathLike, *, storage: Optional[Storage] = None, grace_seconds: float = 3600, dry_run: bool = False
) -> List[str]:
    """Removes what unfinished or superseded saves left at ``path``: files of abandoned saves (their writer on this
    host has exited, or, on another host, their marker is older than ``grace_seconds``; a running writer of this host
    keeps its files however old) and files no committed checkpoint refers to; never the committed checkpoint nor
    files distckpt did not write. Returns the paths removed (with ``dry_run``: that would be, and nothing is
    removed)."""
    p, native, _ = resolve(path, storage)
    return list(_native.storage_remove_leftovers(native, p, float(grace_seconds), dry_run))


def remove_checkpoint(path: PathLike, *, storage: Optional[Storage] = None) -> None:
    """Removes the checkpoint at ``path`` and its leftovers: the metadata first (so it stops existing in one step),
    then its data files, then its directory if that left it empty (a file distckpt did not write keeps it).
    ``NotFoundError`` when nothing distckpt wrote is there."""
    p, native, _ = resolve(path, storage)
    _native.storage_remove_checkpoint(native, p)


def flatten(
    src: PathLike, dst: PathLike, *, overwrite: bool = False, storage: Optional[Storage] = None
) -> Dict[str, int]:
    """Writes a self-contained copy of the checkpoint ``src`` to ``dst``: every chunk, wherever it lies (in ``src``
    or the checkpoints an incremental save made it refer to), read, verified and written to the copy's own data files.
    ``dst`` may be ``src`` with ``overwrite=True``: it then becomes self-contained in place, and its bases can be
    removed. Returns ``bytes_copied``, ``bytes_from_bases`` and ``num_files``."""
    s, native, _ = resolve(src, storage)
    d, _, _ = resolve(dst, storage)
    return dict(_native.flatten(native, s, d, overwrite))


def read_file(path: str, storage: Optional[Storage]) -> bytes:
    """A whole (small) file through ``storage`` (None: as ``path`` says), read by the core from any storage; for
    reading what an export wrote. ``path`` is as the storage sees it (:func:`resolve`)."""
    return _native.storage_read_file(None if storage is None else storage.native, path)
