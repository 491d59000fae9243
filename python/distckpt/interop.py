"""Interoperability: Hugging Face safetensors (export and import) and torch.distributed.checkpoint (import).

The safetensors *exporter* is the C++ one behind the C ABI (``dckpt_export_safetensors``, core/tools/): it streams
each tensor through a bounded buffer, so exporting never holds the checkpoint in memory. Safetensors files
are read in place by the core (``distckpt.open`` opens them as they are; the importer saves their mapped bytes as a
checkpoint with checksums), so neither the ``safetensors`` package nor torch is needed.
"""

from __future__ import annotations

import io
import json
import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _dcp_metadata, _dtypes, _native, _tree
from . import storage as _storage
from ._checkpoint import SaveSummary, save
from .comm import Communicator, native_of
from .errors import (
    CorruptCheckpointError,
    Error,
    InvalidArgumentError,
    NotFoundError,
    PickleNotAllowedError,
    UnsupportedError,
)

__all__ = ["export_safetensors", "import_safetensors", "import_torch_dcp", "parse_size", "rename_rules"]

PathLike = Union[str, "os.PathLike[str]"]
ProgressFn = Callable[[int, int], Any]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "K": 10**3, "M": 10**6, "G": 10**9,
          "T": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


def parse_size(size: Union[int, str]) -> int:
    """``5_000_000``, ``"5GB"`` (10^9 bytes per GB, as Hugging Face counts) or ``"4GiB"`` -> bytes."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size <= 0:
            raise InvalidArgumentError(f"size must be positive, not {size}")
        return size
    m = _SIZE.match(str(size))
    if not m or m.group(2).upper() not in _UNITS:
        raise InvalidArgumentError(f"cannot parse size {size!r}; use bytes or a string like '5GB', '500MB', '4GiB'")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise InvalidArgumentError(f"size must be positive, not {size!r}")
    return value


def export_safetensors(
    ckpt_path: PathLike,
    out_dir: PathLike,
    max_shard_size: Union[int, str] = "5GB",
    *,
    prefix: str = "model",
    verify: bool = True,
    progress: Optional[ProgressFn] = None,
    storage: Optional["_storage.Storage"] = None,
    out_storage: Optional["_storage.Storage"] = None,
    rename: Optional[Sequence[Tuple[str, str]]] = None,
    buffer_size: Union[int, str, None] = None,
    io_threads: int = 0,
    comm: Optional[Communicator] = None,
    timeout: Optional[float] = None,
) -> List[str]:
    """Writes every tensor of a checkpoint as safetensors files plus an index, the layout ``transformers`` loads.

    Files are ``<prefix>-00001-of-0000N.safetensors`` (none larger than ``max_shard_size``, header included, except
    a single tensor that alone exceeds it) and ``<prefix>.safetensors.index.json`` with ``metadata.total_size`` and
    ``weight_map``. Each file's ``__metadata__`` holds the checkpoint's user metadata plus ``"format": "pt"`` unless
    the user metadata sets a format. Bytes entries (objects) are skipped; a C128 tensor has no safetensors dtype
    and fails the export (UnsupportedError naming it) before anything is written. ``out_dir`` is created if needed
    (on the POSIX file system); files with the same names are replaced (an earlier index first, so no index ever
    lists a mix of old and new files). ``ckpt_path`` and ``out_dir`` may be URLs (``"s3://..."``), or paths on
    ``storage`` and ``out_storage`` (:mod:`distckpt.storage`).

    ``rename``: ``(pattern, replacement)`` pairs that the C++ core applies to every tensor name (capi/API.md,
    "Export to the Hugging Face hub"). The first pattern that matches the WHOLE name decides; names no pattern
    matches are kept. Patterns are ECMAScript regular expressions (for ``.``, ``\\d``, ``[...]``, ``(...)``,
    ``(?:...)``, ``|`` and the quantifiers the same as Python's ``re``; no named groups); replacements use ``\\1``
    or ``\\g<1>`` for groups. An empty replacement leaves the matching tensors out (optimizer state, say). Two
    tensors mapped to one name, a bad pattern or a bad replacement raise InvalidArgumentError naming them, before
    anything is written. (Unlike :func:`rename_rules`, which maps the names of a ``load``'s targets to stored names,
    these map stored names to exported names.)

    ``buffer_size``: the tensor bytes held in memory at once (default 64 MiB; e.g. ``"256MiB"``), whatever the
    checkpoint's size; ``io_threads``: files this process writes at once (0: one).

    ``comm``: the ranks of a job export together (collective; every rank passes the same arguments and ``out_dir``
    is one directory all ranks see): the files are split among the ranks, balanced by bytes, and written in
    parallel; rank 0 writes the index once every rank's files are durable, so a failure on any rank leaves no index.
    Every rank returns the same list or raises the same error. ``timeout`` (seconds) bounds each collective and must
    cover the slowest rank's writing (default 10 minutes). ``progress`` counts this rank's files.

    Returns:
        The paths written: the .safetensors files in order, then the index.
    """
    ckpt_path, out_dir = os.fspath(ckpt_path), os.fspath(out_dir)
    native_ckpt, native_storage, _ = _storage.resolve(ckpt_path, storage)
    native_out, native_out_storage, out = _storage.resolve(out_dir, out_storage)
    if native_out_storage is None and not _storage.is_core_url(native_out):
        os.makedirs(native_out, exist_ok=True)
    rules = _rename_pairs(rename)
    _native.export_safetensors(
        native_ckpt,
        native_out,
        parse_size(max_shard_size),
        prefix,
        verify,
        progress,
        native_storage,
        native_out_storage,
        rules,
        0 if buffer_size is None else parse_size(buffer_size),
        _count(io_threads, "io_threads"),
        native_of(comm),
        _native.timeout_ms(timeout),
    )
    index_name = f"{prefix}.safetensors.index.json"
    index = json.loads(_storage.read_file(native_out.rstrip("/") + "/" + index_name, out))
    files = sorted(set(index["weight_map"].values())) or [f"{prefix}-00001-of-00001.safetensors"]
    local = native_out_storage is None and not _storage.is_core_url(native_out)
    join = os.path.join if local else (lambda d, n: d.rstrip("/") + "/" + n)
    return [join(out_dir, name) for name in files] + [join(out_dir, index_name)]


def _rename_pairs(rename: Optional[Sequence[Tuple[str, str]]]) -> List[Tuple[str, str]]:
    """``rename`` checked for shape only (the core checks the rules themselves): a list of two-string pairs."""
    if rename is None:
        return []
    if isinstance(rename, (str, bytes)) or isinstance(rename, Mapping) or callable(rename):
        raise InvalidArgumentError(
            "rename must be a list of (pattern, replacement) pairs, e.g. [(r'model\\.(.*)', r'\\1')]; the core "
            f"applies them (not a {type(rename).__name__})"
        )
    pairs = []
    for i, rule in enumerate(rename):
        if not isinstance(rule, (tuple, list)) or len(rule) != 2 or not all(isinstance(x, str) for x in rule):
            raise InvalidArgumentError(f"rename rule {i + 1} must be a (pattern, replacement) pair of strings, not "
                                       f"{rule!r}")  # fmt: skip
        pairs.append((rule[0], rule[1]))
    return pairs


def _count(n: int, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative int, not {n!r}")
    return n


# ---- Import ---------------------------------------------------------------------------------------------------------


def _safetensors_sources(paths: Union[PathLike, Sequence[PathLike]]) -> List[str]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out = [os.fspath(p) for p in items]
    for p in out:
        if not os.path.exists(p):
            raise NotFoundError(f"safetensors file '{p}' does not exist")
    return out


def import_safetensors(
    paths: Union[PathLike, Sequence[PathLike]],
    ckpt_path: PathLike,
    *,
    overwrite: bool = False,
    user_metadata: Optional[Mapping[str, str]] = None,
    progress: Optional[ProgressFn] = None,
) -> SaveSummary:
    """Saves the tensors of safetensors files as a distckpt checkpoint (with checksums).

    ``paths``: a .safetensors file, a directory (its index and shards, or its .safetensors files), a
    ``*.safetensors.index.json``, or a list of those. Each is read in place by the core, whose header parser applies
    safetensors' own rules (``distckpt.open`` reads them the same way, without a copy: this import is needed only to
    get checksums, or another layout). Tensor names are kept as entry names (``load(None, ckpt)`` returns a flat dict
    of them). The files' ``__metadata__`` becomes the checkpoint's user metadata (``user_metadata`` wins on
    conflicts). Tensor bytes go from the mapped files to the new checkpoint, never copied into Python.
    """
    from .reader import open as _open  # noqa: PLC0415 - reader imports interop's neighbours

    state = _native.State()
    metadata: Dict[str, str] = {}
    seen: Dict[str, str] = {}
    items = []
    readers = []
    try:
        for source in _safetensors_sources(paths):
            r = _open(source)
            readers.append(r)
            if r.metadata.format != "safetensors":
                raise InvalidArgumentError(f"'{source}' is a {r.metadata.format} checkpoint, not safetensors")
            for k, v in r.user_metadata.items():
                metadata.setdefault(k, v)
            mapped = r.map_all()
            for name, entry in r.metadata.items():
                if name in seen:
                    raise InvalidArgumentError(f"tensor '{name}' is in both '{seen[name]}' and '{source}'")
                seen[name] = source
                state.add_tensor(name, _dtypes.code_of_name(entry.dtype), list(entry.shape))
                data = mapped[name].reshape(-1).view(np.uint8)  # the mapped bytes, not a copy
                state.add_piece(name, [0] * len(entry.shape), list(entry.shape), data, False)
                items.append([name, {"array": name}])
        state.set_structure(_tree.dump_structure({"dict": items}))
        metadata.update(user_metadata or {})
        for k, v in metadata.items():
            state.set_user(k, v)
        ckpt_path = os.fspath(ckpt_path)
        info = _native.save(ckpt_path, state, None, 0, overwrite, True, 0, 0, progress)
    finally:
        for r in readers:
            r.close()
    return SaveSummary(path=ckpt_path, **info)


def import_torch_dcp(
    dcp_dir: PathLike,
    ckpt_path: PathLike,
    *,
    overwrite: bool = False,
    allow_pickle: bool = False,
    user_metadata: Optional[Mapping[str, str]] = None,
    progress: Optional[ProgressFn] = None,
) -> SaveSummary:
    """Converts a checkpoint written by ``torch.distributed.checkpoint.save`` (torch 2.x) into distckpt format.

    The DCP state is rebuilt with its original nesting (DCP's ``planner_data``), so entry names are DCP's FQNs
    (``model.layers.0.weight``). Non-tensor values become JSON entries; values JSON cannot represent need
    ``allow_pickle=True``.

    DCP's own metadata file is a pickle: it is read by a restricted reader (distckpt._dcp_metadata) that allows only
    the classes DCP metadata holds and checks the result before torch sees it, so a hostile ``.metadata`` cannot run
    code (UnsafePickleError, a CorruptCheckpointError, names the file). DCP's non-tensor values are pickles too: they
    are loaded with ``torch.load(weights_only=True)``, which takes plain values (numbers, strings, lists, dicts...);
    others fail with PickleNotAllowedError. ``allow_pickle=True`` trusts the checkpoint: torch reads the metadata
    itself, loads every value with full pickle, and values JSON cannot represent are saved with pickle. Needs
    torch; runs in one process and holds the state in memory.
    """
    dcp_dir = os.fspath(dcp_dir)
    meta_path = os.path.join(dcp_dir, ".metadata")
    if not os.path.isfile(meta_path):
        raise NotFoundError(f"'{dcp_dir}' is not a torch.distributed.checkpoint directory (no .metadata file)")
    # Checked before torch is even imported: a file the restricted reader refuses never reaches pickle.
    meta_bytes = None if allow_pickle else _dcp_metadata.read(meta_path)[0]
    try:
        import torch  # noqa: PLC0415
        from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner  # noqa: PLC0415
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # noqa: PLC0415
    except ImportError as e:
        raise UnsupportedError(f"import_torch_dcp needs torch with torch.distributed ({e})") from None

    class _RestrictedReader(FileSystemReader):  # type: ignore[misc,valid-type]
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = _dcp_metadata.to_torch(meta_bytes, meta_path)
            if hasattr(metadata, "storage_meta") and hasattr(self, "load_id"):  # torch >= 2.4, as torch's reader does
                if metadata.storage_meta is None:
                    from torch.distributed.checkpoint.metadata import StorageMeta  # noqa: PLC0415

                    metadata.storage_meta = StorageMeta()
                metadata.storage_meta.load_id = self.load_id
            return metadata

    class _Planner(_EmptyStateDictLoadPlanner):  # type: ignore[misc,valid-type]
        def load_bytes(self, read_item: Any, value: Any) -> None:
            if not allow_pickle:
                fqn = getattr(getattr(read_item, "dest_index", None), "fqn", "?")
                try:
                    obj = torch.load(value, weights_only=True)
                except Exception as e:  # noqa: BLE001 - torch's unpickler refused the value
                    raise PickleNotAllowedError(
                        f"'{dcp_dir}': the value of '{fqn}' is a pickle of more than plain data; pass "
                        f"allow_pickle=True to load it (only for a checkpoint you trust) ({str(e)[:200]})"
                    ) from None
                value = io.BytesIO()
                torch.save(obj, value)  # plain data, handed on to torch's own planner
                value.seek(0)
            super().load_bytes(read_item, value)

    state: Dict[str, Any] = {}
    reader = FileSystemReader(dcp_dir) if allow_pickle else _RestrictedReader(dcp_dir)
    # What torch's own dcp_to_torch_save does: an empty state dict grown from the metadata, in one process.
    try:
        _load_state_dict(state, storage_reader=reader, planner=_Planner(), no_dist=True)
    except Error:
        raise
    except Exception as e:  # noqa: BLE001 - torch's errors on a checkpoint it cannot read
        inner = _dcp_error_cause(e)
        if isinstance(inner, Error):
            raise inner from None
        raise CorruptCheckpointError(f"'{dcp_dir}': torch cannot read the DCP checkpoint ({str(e)[:500]})") from e
    meta = {"converted_from": "torch.distributed.checkpoint"}
    meta.update(user_metadata or {})
    return save(state, ckpt_path, overwrite=overwrite, allow_pickle=allow_pickle, user_metadata=meta,
                progress=progress)  # fmt: skip


def _dcp_error_cause(e: BaseException) -> BaseException:
    """The distckpt error inside torch's CheckpointException (which wraps each rank's failure), or ``e``."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict):
        for failure in failures.values():
            inner = getattr(failure, "exception", failure)
            if isinstance(inner, BaseException):
                return inner
    cause = e.__cause__ or e.__context__
    return cause if isinstance(cause, Error) else e


def rename_rules(rules: Sequence[Tuple[str, str]], *, strict: bool = True) -> Callable[[str], str]:
    """A ``rename`` for :func:`distckpt.load` from ``(pattern, replacement)`` pairs: a target name is rewritten by the
    first pattern that matches it whole (``re.fullmatch``; the replacement may use ``\\1`` or ``\\g<name>``).

    A name no pattern matches is an error with ``strict`` (the default), else kept as it is. Example, a Flax-style
    pytree loading a torch ``nn.Sequential``'s weights::

        rename_rules([(r"params\\.Dense_(\\d+)\\.kernel", r"model.\\1.weight"),
                      (r"params\\.Dense_(\\d+)\\.bias", r"model.\\1.bias")])
    """
    compiled = [(re.compile(p), r) for p, r in rules]

    def rename(name: str) -> str:
        for pattern, replacement in compiled:
            m = pattern.fullmatch(name)
            if m is not None:
                return m.expand(replacement)
        if strict:
            raise InvalidArgumentError(f"rename_rules: no rule matches the name '{name}'")
        return name

    return rename
