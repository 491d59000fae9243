"""The storage classes below distckpt.storage: ``Storage`` (one native ``dckpt_storage``), the built-in POSIX, memory
and S3 backends, and ``CallbackStorage`` (storage plugged in through an object's methods; the protocol is documented in
:mod:`distckpt.storage`). Internal: import them from ``distckpt.storage`` (or ``distckpt``), which re-exports them.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

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


class S3Storage(Storage):
    """S3 and S3-compatible stores (MinIO, Ceph, moto), served by distckpt's core: what ``"s3://bucket/prefix"`` URLs
    get without ``storage=``, with these options in place of the environment's. Paths on it are ``s3://`` URLs.

    HTTP goes through libcurl (loaded when the first S3 storage is made; without it this raises ``UnsupportedError``
    naming it), signed with AWS Signature Version 4. Data files of more than one part are multipart uploads streamed
    part by part as they are written (never a whole file in memory), aborted if the save fails; the metadata is
    committed last with one conditional PUT; reads are parallel ranged GETs, small ones sharing a block; failed
    requests (network errors, HTTP 5xx, throttling) are retried with backoff. Errors name the URL and S3's answer.

    Every option left None or 0 is what the AWS CLI reads from the environment, then from the ``AWS_PROFILE`` (else
    ``default``) profile of ``~/.aws/credentials`` and ``~/.aws/config``, or else the default given:

    Args:
        endpoint: e.g. ``"http://127.0.0.1:9000"``; None: ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, else AWS
            (``https://s3.<region>.amazonaws.com``).
        region: None: ``AWS_REGION``, ``AWS_DEFAULT_REGION``, else ``us-east-1``.
        access_key_id, secret_access_key, session_token: None: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
            ``AWS_SESSION_TOKEN`` (no key at all: requests go unsigned).
        addressing: ``"auto"`` (path style with a custom endpoint, virtual-hosted on AWS), ``"path"`` or
            ``"virtual"``.
        max_in_flight: requests running at once (0: 16).
        max_attempts: tries per request, the first included (1: no retry; 0: 6).
        request_timeout: seconds a request may go without moving a byte before it fails and is retried (0: 30).
        part_size: multipart upload part size in bytes (0: 8 MiB; at least 5 MiB).
        read_block_size: a read shorter than half of this fetches the aligned block around it, which the reads that
            follow share (0: 4 MiB; 1: every read is its own GET).
    """

    _ADDRESSING = ("auto", "path", "virtual")

    def __init__(
        self, endpoint: Optional[str] = None, *, region: Optional[str] = None, access_key_id: Optional[str] = None,
        secret_access_key: Optional[str] = None, session_token: Optional[str] = None, addressing: str = "auto",
        max_in_flight: int = 0, max_attempts: int = 0, request_timeout: float = 0.0, part_size: int = 0,
        read_block_size: int = 0,
    ) -> None:  # fmt: skip
        if addressing not in self._ADDRESSING:
            raise InvalidArgumentError(f"addressing must be one of {self._ADDRESSING}, not {addressing!r}")
        for name, value in (("max_in_flight", max_in_flight), ("max_attempts", max_attempts),
                            ("request_timeout", request_timeout), ("part_size", part_size),
                            ("read_block_size", read_block_size)):  # fmt: skip
            if value < 0:
                raise InvalidArgumentError(f"{name} must be >= 0, not {value}")
        self.endpoint = endpoint
        self._native = _native.Storage.s3(
            endpoint, region, access_key_id, secret_access_key, session_token, addressing, int(max_in_flight),
            int(max_attempts), float(request_timeout), int(part_size), int(read_block_size),
        )  # fmt: skip

    def __repr__(self) -> str:
        where = f" {self.endpoint}" if self.endpoint else ""
        return f"<distckpt.S3Storage{where}>"
