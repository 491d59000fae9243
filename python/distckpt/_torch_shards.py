"""DTensor and ShardedTensor -> distckpt Shards: this rank's pieces of a sharded torch tensor.

Below the rest of the package (it imports only torch, sharding and errors), so that _arrays can turn a DTensor into
Shards without importing distckpt.torch, which sits above _checkpoint. Public as distckpt.torch.is_sharded /
to_shards. Importing it imports torch.
"""

from __future__ import annotations

from typing import Any, List

import torch

from .errors import InvalidArgumentError, UnsupportedError
from .sharding import Shard

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
