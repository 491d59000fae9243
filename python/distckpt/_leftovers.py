"""Leftovers beside checkpoints on a file system, and pruning them: the core's judge (C ABI dckpt_scan_leftovers,
dckpt_remove_leftover), the same for C, Rust and Go's ``distckpt prune``.

A save writes into ``<name>.dckpt-staging-<nonce>`` and renames it into place; an overwrite moves the previous
checkpoint to ``<name>.dckpt-old-<nonce>``; a prune moves what it removes to ``<name>.dckpt-deleting-<nonce>``. What a
crash leaves of these is garbage once idle for the grace period, unless its writer (the staging directory's STAGING
marker) is a live process on this host. Symbolic links are never followed, and a directory is removed only after
being moved to a deleting name and found there to be the very one judged.

On an object store (``root`` an ``s3://`` URL, or another URL with storage behind it) there is no rename: a save writes
its data files and a ``STAGING.<nonce>`` marker below the checkpoint's prefix and commits by writing the metadata
last. Each prefix directly below ``root`` is then judged by the core (``dckpt_storage_stat``,
``dckpt_storage_remove_leftovers``): files of unfinished saves whose writer is gone or whose marker is older than the
grace period, and files no committed checkpoint refers to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Union

from . import _native
from . import storage as _storage
from .errors import NotFoundError, StateError

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Leftover:
    """One leftover directory, as the core judged it (:func:`scan_leftovers`)."""

    path: str
    name: str
    final_name: str  #: the checkpoint name it belongs to
    kind: str  #: "staging", "complete-unrenamed", "replaced" or "deleting"
    bytes: int  #: regular files below it (links not followed)
    idle_seconds: float  #: since the newest change of it or an entry directly in it
    writer: str  #: "running", "exited" or "unknown" (a staging directory's STAGING marker)
    writer_pid: Optional[int]
    writer_host: str
    writer_started_utc: str
    garbage: bool  #: removable under the grace period it was judged with
    reason: str  #: why, in words


def scan_leftovers(root: PathLike, *, grace_seconds: float = 3600, checkpoint: Optional[str] = None) -> List[Leftover]:
    """The leftovers directly in ``root`` (only those of the checkpoint named ``checkpoint``, if given), by name. A
    missing ``root`` has none. ``root`` may be a URL (``s3://bucket/run``): see the module's description."""
    root = os.fspath(root)
    if _storage.url_scheme(root) not in (None, "file", "local"):
        return [x for x, _ in _scan_objects(root, grace_seconds, checkpoint)]
    root, _, _ = _storage.resolve(root, None)
    found = _native.scan_leftovers(root, checkpoint, float(grace_seconds))
    return [Leftover(**d) for d in found]


def prune(root: PathLike, *, grace_seconds: float = 3600, dry_run: bool = False) -> List[Leftover]:
    """Removes the garbage leftovers directly in ``root`` (see the module's description) and returns them; with
    ``dry_run``, removes nothing and returns what would go. Committed checkpoints are never touched (keeping the last N
    of them is the Go CLI's ``distckpt prune --keep-last``). A leftover that stopped being garbage since the scan (its
    writer came back) is skipped."""
    root = os.fspath(root)
    if _storage.url_scheme(root) not in (None, "file", "local"):
        return _prune_objects(root, grace_seconds, dry_run)
    root, _, _ = _storage.resolve(root, None)
    garbage = [x for x in scan_leftovers(root, grace_seconds=grace_seconds) if x.garbage]
    if dry_run:
        return garbage
    removed = []
    for leftover in garbage:
        try:
            _native.remove_leftover(leftover.path, float(grace_seconds))
        except (NotFoundError, StateError):
            continue  # gone, or no longer garbage: judged again at removal
        removed.append(leftover)
    return removed


# ---- Object stores ---------------------------------------------------------------------------------------------------


def _scan_objects(root: str, grace_seconds: float, only: Optional[str]) -> "List[tuple[Leftover, object]]":
    """(leftover, native storage) for each prefix directly below the URL ``root`` holding files of unfinished or
    superseded saves, judged by the core. An object store keeps no dates distckpt reads: ``idle_seconds`` is NaN."""
    path, native, _ = _storage.resolve(root, None)
    base = path.rstrip("/")
    out = []
    for name in _native.storage_list(native, base):
        if only is not None and name != only:
            continue
        child = f"{base}/{name}"
        info = _native.storage_stat(native, child, float(grace_seconds))
        if not info["leftover_files"]:
            continue
        would = _native.storage_remove_leftovers(native, child, float(grace_seconds), True)
        incomplete = info["kind"] == "incomplete"
        running = info["saves_in_progress"]
        what = f"{info['leftover_files']} file(s) of {'unfinished' if incomplete else 'superseded or unfinished'} saves"
        if would:
            reason = f"{what}: {len(would)} removable"
        else:
            reason = f"{what}: {running} save(s) in progress" if running else f"{what}: within the grace period"
        leftover = Leftover(
            path=child, name=name, final_name=name, kind="staging" if incomplete else "replaced",
            bytes=info["leftover_bytes"], idle_seconds=float("nan"), writer="running" if running else "unknown",
            writer_pid=None, writer_host="", writer_started_utc="", garbage=bool(would), reason=reason,
        )  # fmt: skip
        out.append((leftover, native))
    return out


def _prune_objects(root: str, grace_seconds: float, dry_run: bool) -> List[Leftover]:
    removed = []
    for leftover, native in _scan_objects(root, grace_seconds, None):
        if not leftover.garbage:
            continue
        # Judged again by the core as it removes: a save that came back in the meantime keeps its files.
        if dry_run or _native.storage_remove_leftovers(native, leftover.path, float(grace_seconds), False):
            removed.append(leftover)
    return removed
