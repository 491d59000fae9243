"""Leftovers beside checkpoints on a file system, and pruning them: the core's judge (C ABI dckpt_scan_leftovers,
dckpt_remove_leftover), the same for C, Rust and Go's ``distckpt prune``.

A save writes into ``<name>.dckpt-staging-<nonce>`` and renames it into place; an overwrite moves the previous
checkpoint to ``<name>.dckpt-old-<nonce>``; a prune moves what it removes to ``<name>.dckpt-deleting-<nonce>``. What a
crash leaves of these is garbage once idle for the grace period, unless its writer (the staging directory's STAGING
marker) is a live process on this host. Symbolic links are never followed, and a directory is removed only after
being moved to a deleting name and found there to be the very one judged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Union

from . import _native
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
    missing ``root`` has none."""
    found = _native.scan_leftovers(os.fspath(root), checkpoint, float(grace_seconds))
    return [Leftover(**d) for d in found]


def prune(root: PathLike, *, grace_seconds: float = 3600, dry_run: bool = False) -> List[Leftover]:
    """Removes the garbage leftovers directly in ``root`` (see the module's description) and returns them; with
    ``dry_run``, removes nothing and returns what would go. Committed checkpoints are never touched (keeping the last N
    of them is the Go CLI's ``distckpt prune --keep-last``). A leftover that stopped being garbage since the scan (its
    writer came back) is skipped."""
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
