"""A stand-in for a CUDA array, for the device-path tests on machines without a GPU.

``FakeCudaArray`` exposes only ``__cuda_array_interface__`` (v3): no buffer protocol, no ``__array__``, no DLPack, so
distckpt can reach its memory only through the device path. Its "device" memory is a numpy array's; with
``DCKPT_TEST_CUDA_ON_HOST=1`` the core treats CUDA pieces as host memory copied by its host copy engine (the real
staging pipeline with the copy engine swapped), so values can be checked.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np


class FakeCudaArray:
    def __init__(self, host: np.ndarray, *, stream: Any = 1, readonly: bool = False,
                 strides: Optional[Tuple[int, ...]] = None, typestr: Optional[str] = None) -> None:  # fmt: skip
        self.host = host  # the memory the core is told is on cuda:0
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": tuple(host.shape),
            "typestr": typestr or host.dtype.str,
            "data": (host.ctypes.data, readonly),
            "strides": strides,
            "stream": stream,
        }

    def __repr__(self) -> str:
        return f"FakeCudaArray({self.host.shape}, {self.host.dtype})"
