"""torch adapters: DTensor and ShardedTensor <-> distckpt Shards.

``distckpt.save`` and ``distckpt.load`` already accept DTensors and ShardedTensors anywhere in a state dict (each rank
saves its local shard; loading fills the local shards in place, resharding from however the checkpoint was saved).
This module exposes the conversion, creates new DTensors from a checkpoint with any mesh and placements, and
provides DCP's ``StorageWriter`` / ``StorageReader`` over the distckpt format (``dcp.save(sd,
storage_writer=distckpt.torch.StorageWriter(path))``). Importing it imports torch.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Union

import torch

from . import _arrays
from .errors import InvalidArgumentError, UnsupportedError
from .reader import Reader
from .reader import open as _open
from .sharding import Shard
from ._dcp_storage import StorageReader, StorageWriter  # noqa: E402 - after torch

__all__ = ["is_sharded", "to_shards", "load_dtensor", "StorageWriter", "StorageReader"]

try:
    from torch.distributed.tensor import DTensor  # torch >= 2.4
except ImportError:  # pragma: no cover - older torch
    try:
        from torch.distributed._tensor import DTensor  # type: ignore[no-redef]
    except ImportError:
        DTensor = None  # type: ignore[assignment,misc]

try:
    from torch.distributed._shard.sharded_tensor import ShardedTensor
except ImportError:  # pragma: no cover - removed in some torch versions
    ShardedTensor = None  # type: ignore[assignment,misc]


def is_sharded(x: Any) -> bool:
    """True for a DTensor or a ShardedTensor."""
    return (DTensor is not None and isinstance(x, DTensor)) or (
        ShardedTensor is not None and isinstance(x, ShardedTensor)
    )


def to_shards(x: Any) -> List[Shard]:
    """This rank's pieces of a DTensor or ShardedTensor, as Shards sharing the local tensors' memory.

    A DTensor replicated over a mesh dimension gives the same box on several ranks: distckpt writes it once. A
    DTensor with a Partial placement has no stored value yet: reduce it first (``redistribute`` to Replicate).
    """
    global_shape = tuple(int(d) for d in x.shape)
    if DTensor is not None and isinstance(x, DTensor):
        if any(p.is_partial() for p in x.placements):
            raise InvalidArgumentError(
                f"a DTensor with placements {x.placements} holds partial sums; redistribute it to Replicate or Shard "
                "before saving"
            )
        with torch.no_grad():
            local = x.to_local()
        chunks = x.__create_chunk_list__()  # DCP's own protocol: the local box(es) of this rank
        if len(chunks) != 1:
            raise UnsupportedError(f"a DTensor whose local tensor has {len(chunks)} chunks is not supported")
        return [Shard(local, global_shape, tuple(int(o) for o in chunks[0].offsets))]
    if ShardedTensor is not None and isinstance(x, ShardedTensor):
        return [
            Shard(s.tensor, global_shape, tuple(int(o) for o in s.metadata.shard_offsets)) for s in x.local_shards()
        ]
    raise InvalidArgumentError(f"to_shards takes a DTensor or a ShardedTensor, not {type(x).__name__}")


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
        entry = reader._entry(name)
        code = entry._code
        shape = entry.shape
        local_shape, offsets = compute_local_shape_and_global_offset(shape, device_mesh, placements)
        if device_mesh.device_type == "cuda" and torch.version.hip is None:  # straight to the device (read_ex)
            device = torch.device("cuda", torch.cuda.current_device())
            local = torch.empty(tuple(local_shape), dtype=_arrays.torch_dtype(code), device=device)
            reader[name].read(tuple(offsets), tuple(local_shape), out=local)
        else:
            local = torch.empty(tuple(local_shape), dtype=_arrays.torch_dtype(code))
            reader._read_into(name, tuple(offsets), tuple(local_shape), _arrays._torch_raw_numpy(local))
    finally:
        if reader is not source:
            reader.close()
    if dtype is not None:
        local = local.to(dtype)
    local = local.to(device_mesh.device_type)  # a no-op for CUDA
    return DTensor.from_local(local, device_mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=torch.empty(shape, device="meta").stride())  # fmt: skip
