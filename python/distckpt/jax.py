"""JAX adapters: sharded ``jax.Array`` <-> distckpt Shards, and restoring with a target sharding.

``distckpt.save`` accepts JAX arrays anywhere in a state dict: each process saves the addressable shards it holds
(one copy of each replicated box). ``distckpt.load`` accepts JAX arrays and ``jax.ShapeDtypeStruct``s with a
``sharding`` as targets and returns new arrays with that sharding (JAX arrays are immutable), reading only the
boxes this process's devices hold. Importing this module imports jax.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Union

import jax
import numpy as np

from . import _arrays
from ._checkpoint import load
from .comm import Communicator
from .reader import Reader
from .reader import open as _open
from .sharding import Shard

__all__ = ["to_shards", "restore", "load_array"]


def to_shards(x: jax.Array) -> List[Shard]:
    """This process's pieces of ``x``: one Shard per distinct addressable box (replicas are skipped), as host
    arrays."""
    shape = tuple(int(d) for d in x.shape)
    out = []
    for s in x.addressable_shards:
        if s.replica_id != 0:
            continue
        offsets, _ = _arrays.normalize_index(s.index, shape)
        out.append(Shard(np.asarray(s.data), shape, offsets))
    return out


def restore(
    path: Union[str, "os.PathLike[str]"],
    target: Any,
    *,
    comm: Optional[Communicator] = None,
    **kwargs: Any,
) -> Any:
    """Loads a checkpoint into the structure of ``target``: a dict whose array leaves are ``jax.Array``s or
    ``jax.ShapeDtypeStruct(shape, dtype, sharding=...)``. Returns the same dict with new arrays, each with its
    target's sharding and dtype. Other keyword arguments go to :func:`distckpt.load`."""
    return load(target, path, comm=comm, **kwargs)


def load_array(
    source: Union[Reader, str, "os.PathLike[str]"],
    name: str,
    sharding: jax.sharding.Sharding,
    *,
    dtype: Any = None,
) -> jax.Array:
    """Creates a ``jax.Array`` for the stored tensor ``name`` with ``sharding``: each addressable device's box is
    read from disk (only those bytes). ``dtype`` converts (default: the stored dtype)."""
    reader = source if isinstance(source, Reader) else _open(source)
    try:
        view = reader[name]
        shape = view.shape
        stored = view.dtype
        target = np.dtype(dtype) if dtype is not None else stored

        def read(index: Any) -> np.ndarray:
            offsets, lengths = _arrays.normalize_index(index, shape)
            return view.read(offsets, lengths).astype(target, copy=False)

        return jax.make_array_from_callback(shape, sharding, read)
    finally:
        if reader is not source:
            reader.close()
