"""Loads the extension module and connects it to distckpt.errors. Internal: use the public API."""

from __future__ import annotations

from . import _distckpt  # type: ignore[attr-defined]  # built by Bazel (bindings/), copied in by setup.py
from . import errors as _errors
from ._distckpt import (  # noqa: F401  (re-exported for the rest of the package)
    ABI_VERSION,
    DEVICE_OF_POINTER,
    DTYPES,
    ENTRY_BYTES,
    ENTRY_TENSOR,
    MAX_DIMS,
    PRIORITIES,
    STATUS,
    STREAM_READY,
    TIERS,
    WAIT_FOREVER,
    REPLICAS_AUTO,
    Comm,
    Manager,
    Reader,
    SaveFuture,
    State,
    Storage,
    abi_version,
    dtype_from_name,
    dtype_name,
    dtype_size,
    export_safetensors,
    flatten,
    load,
    remove_leftover,
    save,
    save_async,
    scan_leftovers,
    status_name,
    storage_remove_checkpoint,
    storage_list,
    storage_read_file,
    storage_remove_leftovers,
    storage_stat,
    tiers_describe,
    tiers_prune_abandoned,
    version,
    version_string,
)

if abi_version() != ABI_VERSION:  # the C ABI is linked statically, so this guards against a broken build only
    raise ImportError(f"distckpt: extension built for ABI {ABI_VERSION}, library reports {abi_version()}")

_distckpt._set_error_factory(_errors.error_from_status)


def timeout_ms(timeout: "float | None") -> int:
    """Seconds (None: the library default) -> the C ABI's milliseconds (0 means the default)."""
    if timeout is None:
        return 0
    if timeout <= 0:
        raise _errors.InvalidArgumentError(f"timeout must be positive seconds or None, not {timeout!r}")
    return max(1, int(round(timeout * 1000)))
