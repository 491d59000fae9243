"""Shared fixtures. The package under test is the installed one (python/run_tests.sh installs it with pip)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Mapping, Optional

# JAX tests use several CPU devices; the flag must be set before jax is first imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest

import distckpt  # noqa: F401 - loaded before any test, so a broken build fails the collection

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is a test dependency
    ml_dtypes = None


def all_numpy_dtypes():
    """Every dtype distckpt stores, as numpy dtypes (bf16/fp8 through ml_dtypes)."""
    out = [
        np.bool_,
        np.uint8,
        np.int8,
        np.uint16,
        np.int16,
        np.uint32,
        np.int32,
        np.uint64,
        np.int64,
        np.float16,
        np.float32,
        np.float64,
        np.complex64,
        np.complex128,
    ]
    if ml_dtypes is not None:
        out += [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
    return [np.dtype(d) for d in out]


def sample(shape, dtype, seed=0):
    """Deterministic values of any dtype, with every byte pattern a value of that dtype can have."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype).reshape(shape)
    return (rng.standard_normal(n) * 4).astype(dtype).reshape(shape)


def same_bytes(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    )


def assert_same(got, want, where="root"):
    """Deep equality of torch state: the same types (dicts in the same key order, tuples as tuples), tensors of the
    same dtype and shape byte for byte (NaNs and FP8 patterns included), NaN floats as NaN."""
    import torch

    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: {type(got).__name__}, expected a tensor"
        assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), f"{where}: {got.dtype} {got.shape}"
        assert tensor_bytes(got) == tensor_bytes(want), f"{where}: values differ"
    elif isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: {type(got).__name__}, expected a dict"
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {got!r:.80} != {want!r:.80}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}.{i}")
    elif isinstance(want, float) and want != want:
        assert isinstance(got, float) and got != got, f"{where}: {got!r}"
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r} != {want!r}"


def tensor_bytes(t) -> bytes:
    """A torch tensor's bytes, in C order."""
    import torch

    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def run_python(body: str, *, emulate_cuda: bool = True, timeout: float = 180, drop_env: tuple = (),
               env: Optional[Mapping[str, str]] = None) -> str:  # fmt: skip
    """Runs ``body`` in a fresh interpreter (tests/ on sys.path), with DCKPT_TEST_CUDA_ON_HOST=1 or without it (the
    core reads the variable once per process, so each setting needs its own process), without the variables in
    ``drop_env`` and with those of ``env``. Fails with its output unless it exits 0; returns its stdout."""
    environ = dict(os.environ)
    for name in ("DCKPT_TEST_CUDA_ON_HOST", *drop_env):
        environ.pop(name, None)
    if emulate_cuda:
        environ["DCKPT_TEST_CUDA_ON_HOST"] = "1"
    environ.update(env or {})
    code = f"import sys\nsys.path.insert(0, {TESTS_DIR!r})\n" + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


# ---- GPU tests: each helper skips the test, saying why, where what it needs is missing ----------------------------


def torch_cuda():
    """torch, where it has a real GPU in this process; skips otherwise."""
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed (GPU tests need torch with CUDA)")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda.is_available() is False: no GPU here")
    if os.environ.get("DCKPT_TEST_CUDA_ON_HOST") == "1":
        pytest.skip("DCKPT_TEST_CUDA_ON_HOST=1: the host copy engine stands in for CUDA in this process")
    return torch


def cupy_gpu():
    """CuPy, where it sees a GPU; skips otherwise."""
    try:
        import cupy
    except ImportError:
        pytest.skip("cupy is not installed")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("cupy sees no GPU")
    except cupy.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"cupy sees no GPU: {e}")
    if os.environ.get("DCKPT_TEST_CUDA_ON_HOST") == "1":
        pytest.skip("DCKPT_TEST_CUDA_ON_HOST=1: the host copy engine stands in for CUDA in this process")
    return cupy


def gpus(n: int):
    """torch, where this process sees at least ``n`` GPUs; skips otherwise, saying how many there are."""
    torch = torch_cuda()
    have = torch.cuda.device_count()
    if have < n:
        pytest.skip(f"needs {n} GPUs; this machine has {have}")
    return torch


@pytest.fixture
def ckpt(tmp_path):
    """A path for a checkpoint that does not exist yet."""
    return str(tmp_path / "ckpt")


# ---- S3: a moto server on loopback (_s3_server.py), shared by test_s3.py and test_s3_faults.py --------------------

#: What the AWS CLI (and distckpt's S3 backend) would read from the environment besides what a test sets.
AWS_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
           "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")  # fmt: skip


@pytest.fixture(scope="session")
def moto_server():
    """A moto S3 server for the session; its buckets are made per test (``moto_server.new_bucket()``)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    import _s3_server

    server = _s3_server.MotoServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(moto_server, monkeypatch):
    """The server's endpoint and credentials in the environment (``s3://`` URLs reach it; spawned ranks inherit it),
    nothing else of AWS's. Yields a fresh bucket's name."""
    for name in AWS_ENV:
        monkeypatch.delenv(name, raising=False)
    for k, v in moto_server.env().items():
        monkeypatch.setenv(k, v)
    return moto_server.new_bucket()
