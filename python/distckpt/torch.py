"""torch adapters: DTensor and ShardedTensor <-> distckpt Shards.

``distckpt.save`` and ``distckpt.load`` already accept DTensors and ShardedTensors anywhere in a state dict (each rank
saves its local shard; loading fills the local shards in place, resharding from however the checkpoint was saved).
This module exposes the conversion, creates new DTensors from a checkpoint with any mesh and placements, and
provides DCP's ``StorageWriter`` / ``StorageReader`` over the distckpt format (``dcp.save(sd,
storage_writer=distckpt.torch.StorageWriter(path))``). Importing it imports torch.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import torch

from . import _arrays, _dtypes
from ._torch_shards import DTensor, ShardedTensor, is_sharded, to_shards  # noqa: F401 (public here)
from .errors import NotFoundError
from .reader import Reader
from .reader import open as _open
from ._dcp_storage import StorageReader, StorageWriter  # noqa: E402 - after torch

__all__ = ["is_sharded", "to_shards", "load_dtensor", "StorageWriter", "StorageReader"]


def load_dtensor(
    source: Union[Reader, str, "os.PathLike[str]"],
    name: str,
    device_mesh: Any,
    placements: Sequence[Any],
    *,
    dtype: Optional[torch.dtype] = None,
) -> Any:
    """Creates a DTensor for the stored tensor ``name`` with the given mesh and placements, reading only this rank's
    local shard from disk. ``source`` is an open Reader or a checkpoint path; ``dtype`` converts (default: stored).
    """
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC0415

    reader = source if isinstance(source, Reader) else _open(source)
    try:
        entry = reader.metadata.get(name)
        if entry is None:
            raise NotFoundError(f"checkpoint '{reader.path}' has no entry '{name}'")
        code = _dtypes.code_of_name(entry.dtype)
        shape = entry.shape
        local_shape, offsets = compute_local_shape_and_global_offset(shape, device_mesh, placements)
        if device_mesh.device_type == "cuda" and torch.version.hip is None:  # straight to the device (read_ex)
            device = torch.device("cuda", torch.cuda.current_device())
            local = torch.empty(tuple(local_shape), dtype=_arrays.torch_dtype(code), device=device)
            reader[name].read(tuple(offsets), tuple(local_shape), out=local)
        else:
            local = torch.empty(tuple(local_shape), dtype=_arrays.torch_dtype(code))
            reader.readinto(name, _arrays.torch_raw_numpy(local), tuple(offsets), tuple(local_shape))
    finally:
        if reader is not source:
            reader.close()
    if dtype is not None:
        local = local.to(dtype)
    local = local.to(device_mesh.device_type)  # a no-op for CUDA
    return DTensor.from_local(local, device_mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=torch.empty(shape, device="meta").stride())  # fmt: skip
