"""Shards: a local piece of a larger (global) array, as one rank holds it."""

from __future__ import annotations

from typing import Any, Sequence, Tuple

from .errors import InvalidArgumentError

__all__ = ["Shard"]


def _shape_of(data: Any) -> Tuple[int, ...]:
    shape = getattr(data, "shape", None)
    if shape is None:  # a CUDA array that only has __cuda_array_interface__ (read without touching its memory)
        try:
            shape = getattr(data, "__cuda_array_interface__", {}).get("shape")
        except Exception:  # noqa: BLE001 - a property that raises for host data
            shape = None
    if shape is None:
        import numpy as np  # noqa: PLC0415

        shape = np.asarray(data).shape
    return tuple(int(d) for d in shape)


class Shard:
    """The box ``[offsets, offsets + local.shape)`` of an array of shape ``global_shape``, held in ``data``.

    ``data`` is any array distckpt accepts (numpy, torch, JAX, CuPy, ``__cuda_array_interface__``, DLPack or
    buffer-protocol objects). On save its values
    are written; on load they are filled in place (for JAX, a new array replaces it: JAX arrays are immutable).

    Under one name a state may hold a single Shard or a list of Shards (several local pieces of the same array).
    The same box on several ranks is a replica: distckpt writes it once. The shards of all ranks together must
    cover the global array exactly, or the save fails naming the tensor.

    Example: rank ``r`` of 4 holds rows ``[r*256, (r+1)*256)`` of a 1024 x 512 matrix::

        state = {"w": distckpt.Shard(local, global_shape=(1024, 512), offsets=(r * 256, 0))}
    """

    __slots__ = ("data", "global_shape", "offsets")

    data: Any
    global_shape: Tuple[int, ...]
    offsets: Tuple[int, ...]

    def __init__(self, data: Any, global_shape: Sequence[int], offsets: Sequence[int]) -> None:
        self.data = data
        self.global_shape = tuple(int(d) for d in global_shape)
        self.offsets = tuple(int(o) for o in offsets)
        local = _shape_of(data)
        if not (len(local) == len(self.global_shape) == len(self.offsets)):
            raise InvalidArgumentError(
                f"Shard: local shape {local}, global_shape {self.global_shape} and offsets {self.offsets} must have "
                "the same number of dimensions"
            )
        for d, (o, n, g) in enumerate(zip(self.offsets, local, self.global_shape)):
            if o < 0 or g < 0 or o + n > g:
                raise InvalidArgumentError(
                    f"Shard: dimension {d}: [{o}, {o + n}) is outside the global extent {g} "
                    f"(local shape {local}, global_shape {self.global_shape}, offsets {self.offsets})"
                )

    @property
    def local_shape(self) -> Tuple[int, ...]:
        """The shape of ``data``."""
        return _shape_of(self.data)

    @property
    def index(self) -> Tuple[slice, ...]:
        """The global index of this shard as slices (``global_array[shard.index]`` is the shard's data)."""
        return tuple(slice(o, o + n) for o, n in zip(self.offsets, self.local_shape))

    def __repr__(self) -> str:
        return (
            f"Shard({type(self.data).__module__}.{type(self.data).__name__} {self.local_shape}, "
            f"global_shape={self.global_shape}, offsets={self.offsets})"
        )
