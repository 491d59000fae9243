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


class DeclaredCudaArray:
    """An object that declares the memory at ``ptr`` to be a C-contiguous CUDA array of ``shape`` and ``dtype`` on
    device ``device``, through ``__cuda_array_interface__`` and ``__dlpack_device__``, whatever that memory really is
    (pinned host memory, another device's memory, an allocation smaller than the shape says): for the GPU cases that
    check that the core refuses a wrong declaration (tests/test_gpu_cases.py). ``owner`` keeps the memory alive."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], dtype: Any, *, device: int = 0, owner: Any = None,
                 readonly: bool = False) -> None:  # fmt: skip
        self.owner = owner
        self.device = device
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": tuple(shape),
            "typestr": np.dtype(dtype).str,
            "data": (int(ptr), readonly),
            "strides": None,
            "stream": 1,
        }

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (2, self.device)  # kDLCUDA

    def __repr__(self) -> str:
        cai = self.__cuda_array_interface__
        return f"DeclaredCudaArray({cai['shape']}, {cai['typestr']}, cuda:{self.device})"
