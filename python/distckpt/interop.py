"""Interoperability: Hugging Face safetensors (export and import) and torch.distributed.checkpoint (import).

The safetensors *exporter* is the C++ one behind the C ABI (``dckpt_export_safetensors``, core/tools/): it streams
each tensor through a bounded buffer, so exporting never holds the checkpoint in memory. The importer here reads
safetensors headers itself (validated like safetensors does) and saves memory-mapped tensor bytes, so neither the
``safetensors`` package nor torch is needed, and memory stays bounded by the page cache.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _dtypes, _native, _tree
from ._checkpoint import SaveSummary, save
from .errors import CorruptCheckpointError, InvalidArgumentError, NotFoundError, UnsupportedError

__all__ = ["export_safetensors", "import_safetensors", "import_torch_dcp", "parse_size"]

PathLike = Union[str, "os.PathLike[str]"]
ProgressFn = Callable[[int, int], Any]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}  # fmt: skip


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
) -> List[str]:
    """Writes every tensor of a checkpoint as safetensors files plus an index, the layout ``transformers`` loads.

    Files are ``<prefix>-00001-of-0000N.safetensors`` (none larger than ``max_shard_size``, header included, except
    a single tensor that alone exceeds it) and ``<prefix>.safetensors.index.json`` with ``metadata.total_size`` and
    ``weight_map``. Each file's ``__metadata__`` holds the checkpoint's user metadata plus ``"format": "pt"`` unless
    the user metadata sets a format. Bytes entries (objects) are skipped; a C128 tensor has no safetensors dtype
    and fails the export (UnsupportedError naming it) before anything is written. ``out_dir`` is created if needed;
    files with the same names are replaced.

    Returns:
        The paths written: the .safetensors files in order, then the index.
    """
    ckpt_path, out_dir = os.fspath(ckpt_path), os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    _native.export_safetensors(ckpt_path, out_dir, parse_size(max_shard_size), prefix, verify, progress)
    index_path = os.path.join(out_dir, f"{prefix}.safetensors.index.json")
    with open(index_path, encoding="utf-8") as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values())) or [f"{prefix}-00001-of-00001.safetensors"]
    return [os.path.join(out_dir, name) for name in files] + [index_path]


# ---- Import ---------------------------------------------------------------------------------------------------------

#: safetensors dtype -> distckpt C enum name. F4, F6_* and F8_E8M0 have no distckpt dtype.
_ST_DTYPES = {
    "BOOL": "BOOL", "U8": "U8", "I8": "I8", "U16": "U16", "I16": "I16", "U32": "U32", "I32": "I32", "U64": "U64",
    "I64": "I64", "F16": "F16", "BF16": "BF16", "F32": "F32", "F64": "F64", "C64": "C64", "F8_E4M3": "F8_E4M3FN",
    "F8_E5M2": "F8_E5M2",
}  # fmt: skip
_MAX_HEADER = 100_000_000  # safetensors' own limit


def _safetensors_files(paths: Union[PathLike, Sequence[PathLike]]) -> List[str]:
    """A file, a directory (its *.safetensors), an index.json, or a list of any of those -> .safetensors files."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: List[str] = []
    for item in items:
        p = os.fspath(item)
        if os.path.isdir(p):
            found = sorted(os.path.join(p, n) for n in os.listdir(p) if n.endswith(".safetensors"))
            if not found:
                raise NotFoundError(f"directory '{p}' holds no .safetensors file")
            out.extend(found)
        elif p.endswith(".json"):
            with open(p, encoding="utf-8") as f:
                weight_map = json.load(f).get("weight_map", {})
            base = os.path.dirname(p)
            out.extend(os.path.join(base, n) for n in sorted(set(weight_map.values())))
        elif os.path.exists(p):
            out.append(p)
        else:
            raise NotFoundError(f"safetensors file '{p}' does not exist")
    return out


def _read_header(path: str) -> Tuple[Dict[str, Any], int, int]:
    """(header, data start, file size) of a safetensors file, with every offset checked before use."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CorruptCheckpointError(f"'{path}' is not a safetensors file: shorter than 8 bytes")
        n = int.from_bytes(head, "little")
        if n > _MAX_HEADER or 8 + n > size:
            raise CorruptCheckpointError(f"'{path}': header length {n} is invalid for a file of {size} bytes")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise CorruptCheckpointError(f"'{path}': the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"'{path}': the header is not a JSON object")
    data_size = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise CorruptCheckpointError(f"'{path}': __metadata__ must map strings to strings")
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise CorruptCheckpointError(f"'{path}': tensor '{name}' lacks dtype, shape or data_offsets") from None
        if dtype not in _ST_DTYPES:
            raise UnsupportedError(f"'{path}': tensor '{name}' has dtype {dtype}, which distckpt does not support")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise CorruptCheckpointError(f"'{path}': tensor '{name}' has an invalid shape {shape!r}")
        code = _dtypes.CODES[_ST_DTYPES[dtype]]
        nbytes = int(np.prod(shape, dtype=object)) * _dtypes.itemsize(code)
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_size):
            raise CorruptCheckpointError(f"'{path}': tensor '{name}' has data_offsets outside the file")
        if end - begin != nbytes:
            raise CorruptCheckpointError(
                f"'{path}': tensor '{name}' spans {end - begin} bytes; its shape and dtype need {nbytes}"
            )
    return header, 8 + n, size


def import_safetensors(
    paths: Union[PathLike, Sequence[PathLike]],
    ckpt_path: PathLike,
    *,
    overwrite: bool = False,
    user_metadata: Optional[Mapping[str, str]] = None,
    progress: Optional[ProgressFn] = None,
) -> SaveSummary:
    """Saves the tensors of safetensors files as a distckpt checkpoint.

    ``paths``: a .safetensors file, a directory, a ``*.safetensors.index.json``, or a list of those. Tensor names
    are kept as entry names (``load(None, ckpt)`` returns a flat dict of them). The files' ``__metadata__`` becomes
    the checkpoint's user metadata (``user_metadata`` wins on conflicts). Tensor bytes are memory-mapped, never
    copied into Python.
    """
    files = _safetensors_files(paths)
    state = _native.State()
    metadata: Dict[str, str] = {}
    seen: Dict[str, str] = {}
    items = []
    for path in files:
        header, start, size = _read_header(path)
        mm = np.memmap(path, dtype=np.uint8, mode="r") if size > 0 else np.empty(0, np.uint8)
        for name, info in header.items():
            if name == "__metadata__":
                for k, v in info.items():
                    metadata.setdefault(k, v)
                continue
            if name in seen:
                raise InvalidArgumentError(f"tensor '{name}' is in both '{seen[name]}' and '{path}'")
            seen[name] = path
            code = _dtypes.CODES[_ST_DTYPES[info["dtype"]]]
            begin, end = info["data_offsets"]
            shape = [int(d) for d in info["shape"]]
            state.add_tensor(name, code, shape)
            state.add_piece(name, [0] * len(shape), shape, mm[start + begin : start + end], False)
            items.append([name, {"array": name}])
    state.set_structure(_tree.dump_structure({"dict": items}))
    metadata.update(user_metadata or {})
    for k, v in metadata.items():
        state.set_user(k, v)
    ckpt_path = os.fspath(ckpt_path)
    info = _native.save(ckpt_path, state, None, 0, overwrite, True, 0, 0, progress)
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

    Caution: DCP's own metadata file and its non-tensor values are pickles, so reading a DCP checkpoint can run code
    from it: convert only checkpoints you trust. Needs torch; runs in one process and holds the state in memory.
    """
    try:
        from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner  # noqa: PLC0415
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # noqa: PLC0415
    except ImportError as e:
        raise UnsupportedError(f"import_torch_dcp needs torch with torch.distributed ({e})") from None

    dcp_dir = os.fspath(dcp_dir)
    if not os.path.isfile(os.path.join(dcp_dir, ".metadata")):
        raise NotFoundError(f"'{dcp_dir}' is not a torch.distributed.checkpoint directory (no .metadata file)")
    state: Dict[str, Any] = {}
    # What torch's own dcp_to_torch_save does: an empty state dict grown from the metadata, in one process.
    _load_state_dict(state, storage_reader=FileSystemReader(dcp_dir), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)  # fmt: skip
    meta = {"converted_from": "torch.distributed.checkpoint"}
    meta.update(user_metadata or {})
    return save(state, ckpt_path, overwrite=overwrite, allow_pickle=allow_pickle, user_metadata=meta,
                progress=progress)  # fmt: skip
