"""The exceptions distckpt raises, and the one table that maps C status codes to them.

Every failure of the native core arrives as a status code plus the C library's message (``dckpt_error_last()``,
which names the checkpoint, the entry and the file involved). :func:`error_from_status` turns the pair into an
instance of the class ``STATUS_TO_ERROR`` gives for the code; ``str(error)`` is the C message unchanged.

Where a Python built-in exception has the same meaning, the distckpt class also derives from it, so callers that
already catch ``ValueError``, ``TimeoutError`` or ``MemoryError`` keep working::

    Error
    ├── InvalidArgumentError (ValueError)      DCKPT_EINVAL
    ├── NotFoundError (LookupError)            DCKPT_ENOTFOUND
    ├── CorruptCheckpointError                 DCKPT_ECORRUPT
    │   └── UnsafePickleError                  raised by Python: a DCP pickle names a global outside the allow-list
    ├── VersionError                           DCKPT_EVERSION
    ├── StorageError                           DCKPT_EIO
    │   └── NoSpaceError                       DCKPT_ENOSPC
    ├── TimeoutError (TimeoutError)            DCKPT_ETIMEOUT
    ├── CallbackError                          DCKPT_EUSER (the callback's exception is the __cause__)
    ├── OutOfMemoryError (MemoryError)         DCKPT_ENOMEM
    ├── UnsupportedError (NotImplementedError) DCKPT_EUNSUPPORTED
    ├── AlreadyExistsError                     DCKPT_EEXISTS
    ├── BufferTooSmallError                    DCKPT_EBUFSIZE
    ├── PeerError                              DCKPT_EPEER (another rank failed)
    ├── StateError                             DCKPT_ESTATE
    ├── InternalError                          DCKPT_EINTERNAL, DCKPT_ERROR and unknown codes
    └── PickleNotAllowedError (ValueError)     raised by Python: pickle needs allow_pickle=True
"""

from __future__ import annotations

import builtins
from typing import Dict, Optional, Type

__all__ = [
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "CorruptCheckpointError",
    "VersionError",
    "StorageError",
    "NoSpaceError",
    "TimeoutError",
    "CallbackError",
    "OutOfMemoryError",
    "UnsupportedError",
    "AlreadyExistsError",
    "BufferTooSmallError",
    "PeerError",
    "StateError",
    "InternalError",
    "PickleNotAllowedError",
    "UnsafePickleError",
    "STATUS_TO_ERROR",
    "error_from_status",
]


class Error(Exception):
    """Base class of every distckpt error.

    Attributes:
        code: the C status code (a negative ``DCKPT_E*`` value), or ``None`` for errors raised by Python code.
        status: the code's short name (e.g. ``"corrupt"``), or ``None``.
        message: the error text; for native errors, the C library's message unchanged.
    """

    code: Optional[int]
    status: Optional[str]
    message: str

    def __init__(self, message: str, *, code: Optional[int] = None, status: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status

    def __str__(self) -> str:
        return self.message


class InvalidArgumentError(Error, ValueError):
    """The caller passed something invalid (bad shape, dtype, name, option...)."""


class NotFoundError(Error, LookupError):
    """A checkpoint, entry or file does not exist."""


class CorruptCheckpointError(Error):
    """Checksum mismatch, invalid metadata, or a truncated or missing data file."""


class UnsafePickleError(CorruptCheckpointError):
    """A pickle from a checkpoint (DCP's .metadata) names a global or opcode outside the allow-list: it was refused
    before anything in it ran. The message names the file and the global."""


class VersionError(Error):
    """The checkpoint's format version (or a struct version) is newer than this library supports."""


class StorageError(Error):
    """The operating system reported an I/O error."""


class NoSpaceError(StorageError):
    """No space left on the device."""


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 - deliberately shadows the builtin inside distckpt
    """A collective or a wait ran past its timeout: a rank died, stalled, or never arrived."""


class CallbackError(Error):
    """A callback (progress, communicator) failed; the exception it raised is ``__cause__``."""


class OutOfMemoryError(Error, MemoryError):
    """An allocation in the native core failed."""


class UnsupportedError(Error, NotImplementedError):
    """A valid request that this build, backend or format cannot do."""


class AlreadyExistsError(Error):
    """The target already exists (pass ``overwrite=True`` to replace a checkpoint)."""


class BufferTooSmallError(Error):
    """A buffer was smaller than the data to read into it."""


class PeerError(Error):
    """Another rank failed, so this rank aborted the collective operation too."""


class StateError(Error):
    """The object is in the wrong state for this call (closed reader, finished future, ...)."""


class InternalError(Error):
    """A bug in distckpt. Please report it with the message."""


class PickleNotAllowedError(Error, ValueError):
    """Saving or loading an entry needs pickle, and the caller did not pass ``allow_pickle=True``."""


#: C status code -> exception class. The single place where codes become Python exceptions. Codes come from
#: distckpt.h and are never renumbered.
STATUS_TO_ERROR: Dict[int, Type[Error]] = {
    -1: InternalError,  # DCKPT_ERROR: an error that fits no other code
    -2: InvalidArgumentError,  # DCKPT_EINVAL
    -3: NotFoundError,  # DCKPT_ENOTFOUND
    -4: CorruptCheckpointError,  # DCKPT_ECORRUPT
    -5: VersionError,  # DCKPT_EVERSION
    -6: StorageError,  # DCKPT_EIO
    -7: TimeoutError,  # DCKPT_ETIMEOUT
    -8: CallbackError,  # DCKPT_EUSER
    -9: OutOfMemoryError,  # DCKPT_ENOMEM
    -10: UnsupportedError,  # DCKPT_EUNSUPPORTED
    -11: AlreadyExistsError,  # DCKPT_EEXISTS
    -12: BufferTooSmallError,  # DCKPT_EBUFSIZE
    -13: PeerError,  # DCKPT_EPEER
    -14: NoSpaceError,  # DCKPT_ENOSPC
    -15: StateError,  # DCKPT_ESTATE
    -16: InternalError,  # DCKPT_EINTERNAL
}

# The names dckpt_status_name() gives each code (what Error.status holds). Kept here, as data, so that this module
# needs nothing else of distckpt (it is the bottom of the package's import graph, below the extension module);
# tests/test_errors.py checks every entry against the C library's.
_STATUS_NAMES: Dict[int, str] = {
    -1: "unknown",
    -2: "invalid argument",
    -3: "not found",
    -4: "corrupt",
    -5: "unsupported version",
    -6: "I/O error",
    -7: "timeout",
    -8: "aborted by callback",
    -9: "out of memory",
    -10: "unsupported",
    -11: "already exists",
    -12: "buffer too small",
    -13: "peer rank failed",
    -14: "no space left",
    -15: "bad state",
    -16: "internal error",
}


def error_from_status(code: int, message: str) -> Error:
    """Builds the exception for a failed native call: the class from STATUS_TO_ERROR, the C message as text.

    The extension module calls it for every failed C call (``distckpt._native`` installs it there)."""
    name = _STATUS_NAMES.get(code, "unknown")
    cls = STATUS_TO_ERROR.get(code, InternalError)
    return cls(message or name, code=code, status=name)
