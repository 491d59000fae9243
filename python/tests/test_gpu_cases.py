"""The cases only a GPU settles (issue 26, "The GPU check's cases"), at one GPU; the kit's gpu_check.sh runs them as a
step of their own (docs/gpu.md). Every case skips, saying why, where there is no GPU (``torch.cuda.is_available()``
False), where CuPy or JAX is missing, or where it needs two GPUs and the machine has one.

- ordering: work queued on the caller's stream behind a long kernel (``torch.cuda._sleep`` or a CuPy spin kernel) is
  in what a save, an async save (pinned staging and device snapshot) saves, and a load or region read lands after it;
  on the legacy default stream, a torch side stream, a CuPy non-blocking stream and the per-thread default stream;
- no current context: save, async save, load and region read from a fresh thread, from a C program whose threads
  have no context (tests/_c_no_context.c, compiled here against the kit's header and library), and of JAX arrays;
- memory kinds: CUDA managed memory, torch's cudaMallocAsync backend and expandable segments work; pinned host
  memory declared as device memory, a wrong device ordinal and a piece larger than its allocation are clear errors;
- a stuck stream (a kernel spinning on a host-mapped flag) with ``timeout=5``: distckpt's TimeoutError within twice
  the timeout, with the waiting threads' CPU use recorded and well below one core;
- snapshots: 2,000 small tensors with the training stream busy; a GPU filled through torch's allocator, then
  ``async_save(device_snapshot=True)`` and a training step: no out-of-memory, the memory given back afterwards;
- a strided load (8192 x 8192 fp16 saved in row shards, loaded into 64-column shards) timed against loading row
  shards and a pinned host-to-device ``copy_`` of the same bytes (ratios recorded; values checked, no speed target);
- graph capture (``torch.cuda.graph``) on the main thread while a snapshot async save finishes in the background;
- NCCL at world size 1: a torch ``all_reduce`` loop of 100 iterations beside async saves (distckpt's own NCCL
  communicator conformance at world size 1 is bin/nccl_test's);
- two GPUs: a save from cuda:1 while cuda:0 is current, and a load into cuda:1.

Timings and counts go to the JUnit XML through ``record_property`` (and are printed, for the log).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import distckpt
from _fake_cuda import DeclaredCudaArray
from conftest import TESTS_DIR, cupy_gpu, gpus, run_python, torch_cuda
from distckpt import Shard

#: Cycles of the long kernel queued before the work a case checks: a few hundred milliseconds on an H100 (~2 GHz),
#: far longer than the Python between queueing it and the call under test. Every kernel a case queues behind it must
#: have run once before: with lazy module loading (CUDA 12.2+'s default) the first launch of a kernel loads its module,
#: which waits for the running kernel, so the work would be done before the call under test (seen on an H100).
SLEEP_CYCLES = 500_000_000

#: A CuPy kernel that spins for a number of clock cycles (torch.cuda._sleep for CuPy streams).
_SPIN_SOURCE = r"""
extern "C" __global__ void spin_cycles(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
"""

#: A kernel that spins until the host sets a flag in host-mapped pinned memory: a stream that never finishes until
#: the test lets it go.
_WAIT_FLAG_SOURCE = r"""
extern "C" __global__ void wait_for_flag(const volatile int* flag) {
  while (*flag == 0) {
  }
}
"""


def report(record_property, **values) -> None:
    """Records measurements in the JUnit XML and prints them for the log."""
    for k, v in values.items():
        record_property(k, v)
    print(" ".join(f"{k}={v}" for k, v in values.items()))


def result_of(out: str) -> dict:
    """The JSON a subprocess body printed on its "RESULT " line."""
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out
    return json.loads(lines[-1][len("RESULT ") :])


def current_context() -> int:
    """The calling thread's current CUDA context, from the driver (0: none)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    rc = cuda.cuCtxGetCurrent(ctypes.byref(ctx))
    assert rc == 0, f"cuCtxGetCurrent: {rc}"
    return ctx.value or 0


# ---- Ordering -------------------------------------------------------------------------------------------------------
#
# Each "lane" is a stream and the array library that queues work on it. The case makes the stream busy with a long
# kernel, queues the work it checks behind it (a write of the source, or of the destination), checks that the stream
# is indeed still busy, then calls distckpt with the stream current and without synchronising: distckpt must order
# its copies after that work by itself.


class _TorchLane:
    def __init__(self, side: bool) -> None:
        self.torch = torch = torch_cuda()
        self.stream = torch.cuda.Stream() if side else torch.cuda.default_stream()
        if not side:
            assert self.stream.cuda_stream == 0, "torch's default stream is not the legacy default stream here"

    def __enter__(self):
        self._ctx = self.torch.cuda.stream(self.stream)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)

    def full(self, shape, value):
        return self.torch.full(shape, value, dtype=self.torch.float32, device="cuda")

    def sleep(self) -> None:
        self.torch.cuda._sleep(SLEEP_CYCLES)

    def fill(self, x, value) -> None:
        x.fill_(value)

    def add(self, x, value) -> None:
        x.add_(value)

    def busy(self) -> bool:
        return not self.stream.query()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def numpy(self, x) -> np.ndarray:
        self.stream.synchronize()
        return x.cpu().numpy()


class _CupyLane:
    def __init__(self, per_thread: bool) -> None:
        self.cupy = cupy = cupy_gpu()
        if per_thread:
            self.stream = getattr(cupy.cuda.Stream, "ptds", None)
            if self.stream is None:
                pytest.skip("this CuPy has no cupy.cuda.Stream.ptds (the per-thread default stream)")
        else:
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self._spin = cupy.RawKernel(_SPIN_SOURCE, "spin_cycles")

    def __enter__(self):
        self.stream.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.stream.__exit__(*exc)

    def full(self, shape, value):
        return self.cupy.full(shape, value, dtype=self.cupy.float32)

    def sleep(self) -> None:
        self._spin((1,), (1,), (np.int64(SLEEP_CYCLES),))

    def fill(self, x, value) -> None:
        x.fill(value)

    def add(self, x, value) -> None:
        x += value

    def busy(self) -> bool:
        return not self.stream.done

    def synchronize(self) -> None:
        self.stream.synchronize()

    def numpy(self, x) -> np.ndarray:
        self.stream.synchronize()
        return self.cupy.asnumpy(x)


LANES = {
    "legacy-default-stream": lambda: _TorchLane(side=False),
    "torch-side-stream": lambda: _TorchLane(side=True),
    "cupy-non-blocking-stream": lambda: _CupyLane(per_thread=False),
    "per-thread-default-stream": lambda: _CupyLane(per_thread=True),
}

#: 32 MiB of fp32: several of the core's 16 MiB staging buffers.
_N = 1 << 23


@pytest.mark.parametrize("lane_name", list(LANES))
def test_save_waits_for_work_queued_on_the_stream(tmp_path, lane_name):
    lane = LANES[lane_name]()
    with lane:
        x = lane.full((_N,), 1.0)
        lane.synchronize()
        lane.sleep()
        lane.fill(x, 7.0)  # queued behind the long kernel: still to run when save is called
        assert lane.busy(), "the long kernel had finished before the save: the case would prove nothing"
        distckpt.save({"x": x}, tmp_path / "c")
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "c")["x"], np.full(_N, 7.0, np.float32))


@pytest.mark.parametrize("snapshot", [False, True], ids=["pinned", "device-snapshot"])
@pytest.mark.parametrize("lane_name", list(LANES))
def test_async_save_waits_for_queued_work_and_not_for_later_work(tmp_path, lane_name, snapshot):
    lane = LANES[lane_name]()
    with lane:
        x = lane.full((_N,), 1.0)
        lane.synchronize()
        lane.sleep()
        lane.fill(x, 7.0)
        assert lane.busy(), "the long kernel had finished before the save: the case would prove nothing"
        h = distckpt.async_save({"x": x}, tmp_path / "c", device_snapshot=snapshot)
        for _ in range(5):  # queued once the call has returned: must not reach the checkpoint
            lane.add(x, 1.0)
    h.result(timeout=120)
    np.testing.assert_array_equal(lane.numpy(x), np.full(_N, 12.0, np.float32))
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "c")["x"], np.full(_N, 7.0, np.float32))


@pytest.mark.parametrize("lane_name", list(LANES))
def test_load_lands_after_a_slow_kernel_writing_the_destination(tmp_path, lane_name):
    want = np.arange(_N, dtype=np.float32) * 0.5
    distckpt.save({"x": want}, tmp_path / "c")
    lane = LANES[lane_name]()
    with lane:
        dst = lane.full((_N,), 0.0)
        lane.synchronize()
        lane.sleep()
        lane.fill(dst, -1.0)  # a slow kernel's write of the destination, queued before the load: the load must win
        assert lane.busy(), "the long kernel had finished before the load: the case would prove nothing"
        distckpt.load({"x": dst}, tmp_path / "c")
    np.testing.assert_array_equal(lane.numpy(dst), want)


@pytest.mark.parametrize("lane_name", list(LANES))
def test_region_read_lands_after_a_slow_kernel_writing_the_destination(tmp_path, lane_name):
    full = np.arange(1024 * 2048, dtype=np.float32).reshape(1024, 2048)
    shards = [Shard(full[:512].copy(), (1024, 2048), (0, 0)), Shard(full[512:].copy(), (1024, 2048), (512, 0))]
    distckpt.save({"w": shards}, tmp_path / "c")
    lane = LANES[lane_name]()
    with distckpt.open(tmp_path / "c") as r, lane:
        out = lane.full((600, 1000), 0.0)
        lane.synchronize()
        lane.sleep()
        lane.fill(out, -1.0)
        assert lane.busy(), "the long kernel had finished before the read: the case would prove nothing"
        assert r["w"].read((200, 300), (600, 1000), out=out) is out  # both chunks, strided in each
    np.testing.assert_array_equal(lane.numpy(out), full[200:800, 300:1300])


# ---- No current context ---------------------------------------------------------------------------------------------


def test_save_load_and_read_from_a_thread_that_never_used_cuda(tmp_path, record_property):
    torch = torch_cuda()
    dev = torch.device("cuda", 0)
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(1024, 1536, device=dev, generator=g)
    dst = torch.full_like(x, float("nan"))
    region = torch.full((300, 500), float("nan"), device=dev)
    torch.cuda.synchronize()
    seen, errors = {}, []

    def body():
        try:
            seen["before"] = current_context()
            distckpt.save({"x": x}, tmp_path / "sync")
            distckpt.async_save({"x": x}, tmp_path / "snap", device_snapshot=True).result(timeout=120)
            distckpt.async_save({"x": x}, tmp_path / "pinned").result(timeout=120)
            distckpt.load({"x": dst}, tmp_path / "snap")
            with distckpt.open(tmp_path / "pinned") as r:
                r["x"].read((100, 200), (300, 500), out=region)
            seen["after"] = current_context()
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(e)

    t = threading.Thread(target=body, name="never-used-cuda")
    t.start()
    t.join(timeout=300)
    assert not t.is_alive(), "distckpt hung on a thread with no current CUDA context"
    if errors:
        raise errors[0]
    assert seen["before"] == 0, "a fresh thread had a current CUDA context: the case would prove nothing"
    report(record_property, context_after_calls=hex(seen["after"]))
    torch.cuda.synchronize()
    assert torch.equal(dst, x)
    assert torch.equal(region, x[100:400, 200:700])
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "sync")["x"], x.cpu().numpy())


def _c_abi_tree():
    """(include dir, lib dir) of an installed C ABI: the kit's (KIT/python/tests -> KIT/include, KIT/lib),
    DISTCKPT_PREBUILT's, or scripts/build_lib.sh's build/dist in a checkout; skips where there is none."""
    here = Path(TESTS_DIR).resolve()
    roots = []
    if os.environ.get("DISTCKPT_PREBUILT") not in (None, "", "pkg-config"):
        roots.append(Path(os.environ["DISTCKPT_PREBUILT"]))
    roots += [here.parents[1], here.parents[1] / "build" / "dist"]
    for root in roots:
        if (root / "include" / "distckpt" / "distckpt.h").is_file() and (root / "lib" / "libdistckpt.so").is_file():
            return root / "include", root / "lib"
    pytest.skip("no installed C ABI (include/distckpt/distckpt.h + lib/libdistckpt.so) next to the tests, in "
                "DISTCKPT_PREBUILT or in build/dist (scripts/build_lib.sh)")  # fmt: skip


def test_c_caller_with_no_current_context(tmp_path):
    torch_cuda()
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) here")
    include, lib = _c_abi_tree()
    exe = tmp_path / "c_no_context"
    build = subprocess.run(
        [cc, "-std=c99", "-O1", "-Wall", f"-I{include}", os.path.join(TESTS_DIR, "_c_no_context.c"), f"-L{lib}",
         "-ldistckpt", f"-Wl,-rpath,{lib}", "-ldl", "-lpthread", "-o", str(exe)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (tmp_path / "ckpts").mkdir()
    r = subprocess.run([str(exe), str(tmp_path / "ckpts")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("OK"), f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    # What the C program saved is what it computed (the same formula here).
    i = np.arange(1024 * 1536, dtype=np.uint64)
    want = ((i * np.uint64(2654435761)) % np.uint64(100003)).astype(np.float32) * np.float32(0.5) - np.float32(7)
    for name in ("sync", "async"):
        np.testing.assert_array_equal(distckpt.load(None, tmp_path / "ckpts" / name)["x"], want.reshape(1024, 1536))


def test_jax_gpu_arrays_from_the_main_thread_and_a_fresh_thread(tmp_path):
    # A fresh interpreter: conftest pins JAX to the CPU. XLA drives the GPU through contexts it makes current only
    # around its own calls, so the main thread of a JAX program usually has none.
    torch_cuda()
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    out = run_python(f"""
        import ctypes, json, threading, numpy as np, jax, jax.numpy as jnp, distckpt
        try:
            gpus = jax.devices("cuda")
        except RuntimeError as e:
            print("SKIP: JAX has no CUDA backend here:", e)
            raise SystemExit(0)
        cuda = ctypes.CDLL("libcuda.so.1")

        def current():
            c = ctypes.c_void_p()
            rc = cuda.cuCtxGetCurrent(ctypes.byref(c))
            return c.value or 0 if rc == 0 else -rc

        dev = gpus[0]
        arrays = {{
            "f32": jax.device_put(jnp.arange(1 << 20, dtype=jnp.float32).reshape(1024, 1024) * 0.25, dev),
            "bf16": jax.device_put(jnp.linspace(-3, 3, 4097, dtype=jnp.bfloat16), dev),
            "i32": jax.device_put(jnp.arange(1000, dtype=jnp.int32) * -3, dev),
            "scalar": jax.device_put(jnp.float32(2.5), dev),
        }}
        jax.block_until_ready(arrays)
        host = {{k: np.asarray(v) for k, v in arrays.items()}}
        result = {{"main_thread_context": current()}}
        distckpt.save(arrays, {str(tmp_path / "main")!r})
        errors = []

        def fresh():
            try:
                result["fresh_thread_context"] = current()
                distckpt.async_save(arrays, {str(tmp_path / "snap")!r}, device_snapshot=True).result(timeout=120)
                distckpt.save(arrays, {str(tmp_path / "fresh")!r})
            except BaseException as e:
                errors.append(repr(e))

        t = threading.Thread(target=fresh)
        t.start()
        t.join()
        assert not errors, errors
        sharding = jax.sharding.SingleDeviceSharding(dev)
        for name in ("main", "snap", "fresh"):
            target = {{k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in arrays.items()}}
            got = distckpt.load(target, {str(tmp_path)!r} + "/" + name)
            for k, v in host.items():
                assert got[k].devices() == {{dev}}, (name, k, got[k].devices())
                assert got[k].dtype == v.dtype, (name, k, got[k].dtype)
                np.testing.assert_array_equal(np.asarray(got[k]), v)
        print("RESULT " + json.dumps(result))
    """, emulate_cuda=False, drop_env=("JAX_PLATFORMS", "XLA_FLAGS"),
        env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})  # fmt: skip
    if out.startswith("SKIP: "):
        pytest.skip(out[len("SKIP: ") :].strip())
    r = result_of(out)
    assert r["fresh_thread_context"] == 0, r


# ---- Memory kinds ---------------------------------------------------------------------------------------------------


def test_managed_memory_saves_loads_and_reads(tmp_path):
    cupy = cupy_gpu()

    def managed(shape):
        mem = cupy.cuda.malloc_managed(int(np.prod(shape)) * 4)
        return cupy.ndarray(shape, cupy.float32, memptr=mem)

    src = managed((2048, 2048))
    src[...] = cupy.arange(2048 * 2048, dtype=cupy.float32).reshape(2048, 2048) * 0.25
    cupy.cuda.Device().synchronize()
    distckpt.save({"m": src}, tmp_path / "sync")
    for snapshot in (False, True):
        distckpt.async_save({"m": src}, tmp_path / f"async{int(snapshot)}", device_snapshot=snapshot).result(120)
    for name in ("sync", "async0", "async1"):
        dst = managed((2048, 2048))
        dst.fill(float("nan"))
        distckpt.load({"m": dst}, tmp_path / name)
        cupy.cuda.Device().synchronize()
        assert bool((dst == src).all()), name
    out = managed((100, 300))
    with distckpt.open(tmp_path / "sync") as r:
        r["m"].read((5, 7), (100, 300), out=out)
    cupy.cuda.Device().synchronize()
    assert bool((out == src[5:105, 7:307]).all())


@pytest.mark.parametrize("conf", ["backend:cudaMallocAsync", "expandable_segments:True"])
def test_torch_allocator_settings(tmp_path, conf):
    # In a fresh interpreter: PYTORCH_CUDA_ALLOC_CONF is read when torch's allocator starts.
    torch_cuda()
    out = run_python(f"""
        import json, torch, distckpt
        dev = torch.device("cuda", 0)
        g = torch.Generator(device=dev).manual_seed(5)
        # small and large tensors: several pools, blocks and segments (mappings, for expandable segments)
        state = {{f"t{{i}}": torch.randn(n, device=dev, generator=g) for i, n in
                  enumerate((17, 1 << 10, 1 << 20, 3 << 22, 1 << 24, 5 << 22))}}
        want = {{k: v.clone() for k, v in state.items()}}
        distckpt.save(state, {str(tmp_path / "sync")!r})
        for snapshot in (False, True):
            h = distckpt.async_save(state, {str(tmp_path)!r} + f"/async{{int(snapshot)}}", device_snapshot=snapshot)
            for v in state.values():
                v.mul_(3.0)  # after the call: not in the checkpoint
            h.result(timeout=120)
            for k, v in state.items():
                v.copy_(want[k])
        for name in ("sync", "async0", "async1"):
            got = {{k: torch.full_like(v, float("nan")) for k, v in want.items()}}
            distckpt.load(got, {str(tmp_path)!r} + "/" + name)
            for k in want:
                assert torch.equal(got[k], want[k]), (name, k)
        region = torch.empty(1000, device=dev)
        with distckpt.open({str(tmp_path / "sync")!r}) as r:
            r["t3"].read((12345,), (1000,), out=region)
        assert torch.equal(region, want["t3"][12345:13345])
        # memory_snapshot raises under cudaMallocAsync, which tracks no blocks (found on an H100)
        segments = torch.cuda.memory_snapshot() if torch.cuda.get_allocator_backend() == "native" else []
        expandable = [s.get("is_expandable") for s in segments if "is_expandable" in s]
        print("RESULT " + json.dumps({{"backend": torch.cuda.get_allocator_backend(),
                                       "expandable": any(expandable) if expandable else None}}))
    """, emulate_cuda=False, env={"PYTORCH_CUDA_ALLOC_CONF": conf})  # fmt: skip
    r = result_of(out)
    if conf.startswith("backend:"):
        assert r["backend"] == "cudaMallocAsync", r
    else:
        assert r["backend"] == "native" and r["expandable"] in (True, None), r


def test_pinned_host_memory_declared_as_device_memory_is_refused(tmp_path):
    torch = torch_cuda()
    pinned = torch.arange(4096, dtype=torch.float32).pin_memory()
    fake = DeclaredCudaArray(pinned.data_ptr(), (4096,), np.float32, device=0, owner=pinned)
    with pytest.raises(distckpt.InvalidArgumentError) as e:
        distckpt.save({"pinned_weights": fake}, tmp_path / "c")
    assert "pinned_weights" in str(e.value), str(e.value)
    assert not (tmp_path / "c").exists()
    distckpt.save({"pinned_weights": np.zeros(4096, np.float32)}, tmp_path / "d")
    with pytest.raises(distckpt.InvalidArgumentError) as e:
        distckpt.load({"pinned_weights": fake}, tmp_path / "d")
    assert "pinned_weights" in str(e.value), str(e.value)
    with distckpt.open(tmp_path / "d") as r, pytest.raises(distckpt.InvalidArgumentError) as e:
        r["pinned_weights"].read((0,), (4096,), out=fake)
    assert "pinned_weights" in str(e.value), str(e.value)
    assert torch.equal(pinned, torch.arange(4096, dtype=torch.float32))  # nothing was written into it


def test_a_wrong_device_ordinal_is_refused(tmp_path):
    torch = torch_cuda()
    x = torch.arange(4096, dtype=torch.float32, device="cuda:0")
    distckpt.save({"on_cuda0": np.zeros(4096, np.float32)}, tmp_path / "d")
    count = torch.cuda.device_count()
    ordinals = [count] + ([1] if count >= 2 else [])  # a device that does not exist; another device's memory
    for ordinal in ordinals:
        fake = DeclaredCudaArray(x.data_ptr(), (4096,), np.float32, device=ordinal, owner=x)
        with pytest.raises(distckpt.InvalidArgumentError) as e:
            distckpt.save({"on_cuda0": fake}, tmp_path / f"c{ordinal}")
        assert "on_cuda0" in str(e.value) and f"cuda:{ordinal}" in str(e.value), str(e.value)
        with pytest.raises(distckpt.InvalidArgumentError) as e:
            distckpt.load({"on_cuda0": fake}, tmp_path / "d")
        assert "on_cuda0" in str(e.value), str(e.value)
    assert torch.equal(x, torch.arange(4096, dtype=torch.float32, device="cuda:0"))


def test_a_piece_larger_than_its_allocation_is_refused(tmp_path):
    # In a fresh interpreter: an unchecked copy past the allocation may fault and poison the CUDA context.
    torch_cuda()
    out = run_python(f"""
        import json, numpy as np, torch, distckpt
        from _fake_cuda import DeclaredCudaArray
        x = torch.zeros(1 << 18, dtype=torch.float32, device="cuda")  # 1 MiB
        torch.cuda.synchronize()
        shape = (1 << 26,)  # declared as 256 MiB
        distckpt.save({{"overrun": np.zeros(shape, np.float32)}}, {str(tmp_path / "d")!r})
        result = {{}}
        for what in ("save", "load"):
            fake = DeclaredCudaArray(x.data_ptr(), shape, np.float32, owner=x)
            try:
                if what == "save":
                    distckpt.save({{"overrun": fake}}, {str(tmp_path / "c")!r})
                else:
                    distckpt.load({{"overrun": fake}}, {str(tmp_path / "d")!r})
                result[what] = None
            except Exception as e:
                result[what] = [type(e).__name__, str(e)]
        print("RESULT " + json.dumps(result))
    """, emulate_cuda=False)  # fmt: skip
    r = result_of(out)
    for what in ("save", "load"):
        assert r[what] is not None, f"{what}: a 256 MiB piece over a 1 MiB allocation was accepted"
        assert r[what][0] == "InvalidArgumentError" and "overrun" in r[what][1], (what, r[what])


# ---- A stuck stream -------------------------------------------------------------------------------------------------


def test_a_stuck_stream_times_out_without_spinning(tmp_path, record_property):
    # A kernel spins on a flag in host-mapped pinned memory, so the stream the tensor is ordered on never finishes
    # until the flag is set. save and async_save with timeout=5 must raise distckpt.TimeoutError within about twice
    # the timeout, their waiting threads asleep (process CPU time over the wait well below one core). A watchdog sets
    # the flag after 6x the timeout so that a save that does not time out still ends (and the case fails, saying so).
    # In a fresh interpreter: the stuck kernel and whatever the core leaves queued behind it end with it.
    cupy_gpu()
    timeout = 5
    out = run_python(f"""
        import ctypes, json, threading, time, numpy as np, cupy, distckpt
        TIMEOUT = {timeout}
        wait_for_flag = cupy.RawKernel({_WAIT_FLAG_SOURCE!r}, "wait_for_flag")
        pinned = cupy.cuda.alloc_pinned_memory(4096)
        flag = ctypes.c_int.from_address(pinned.ptr)
        flag.value = 0
        # With unified addressing (every 64-bit Linux GPU) page-locked memory has the same address on the device;
        # CuPy 14 no longer wraps cudaHostGetDevicePointer (found on an H100).
        get_device_pointer = getattr(cupy.cuda.runtime, "hostGetDevicePointer", None)
        device_flag = get_device_pointer(pinned.ptr, 0) if get_device_pointer else pinned.ptr
        released = threading.Event()

        def release():
            flag.value = 1
            released.set()

        watchdog = threading.Timer(6 * TIMEOUT, release)
        watchdog.daemon = True
        watchdog.start()
        x = cupy.arange(1 << 22, dtype=cupy.float32)
        x * 2  # loads the kernel now (see SLEEP_CYCLES)
        cupy.cuda.Device().synchronize()
        stream = cupy.cuda.Stream(non_blocking=True)
        result = {{}}
        with stream:
            wait_for_flag((1,), (1,), (np.uintp(device_flag),))
            y = x * 2  # queued behind the stuck kernel
            result["queued_behind"] = not stream.done
            for what in ("save", "async_save"):
                wall, cpu = time.monotonic(), time.process_time()
                error = None
                try:
                    if what == "save":
                        distckpt.save({{"y": y}}, {str(tmp_path / "s")!r}, timeout=TIMEOUT)
                    else:
                        h = distckpt.async_save({{"y": y}}, {str(tmp_path / "a")!r}, timeout=TIMEOUT)
                        h.result(timeout=20 * TIMEOUT)
                except Exception as e:
                    error = [type(e).__name__, isinstance(e, distckpt.TimeoutError), str(e)]
                result[what] = {{"error": error, "wall_s": time.monotonic() - wall,
                                 "cpu_s": time.process_time() - cpu, "released_by_watchdog": released.is_set()}}
        release()
        watchdog.cancel()
        stream.synchronize()  # the kernel ends once the flag is set
        cupy.cuda.Device().synchronize()
        result["kernel_ended"] = True
        print("RESULT " + json.dumps(result))
    """, emulate_cuda=False, timeout=240)  # fmt: skip
    r = result_of(out)
    assert r["kernel_ended"]
    assert r["queued_behind"], "the work to save had run before the save: the case would prove nothing"
    for what in ("save", "async_save"):
        c = r[what]
        report(record_property, **{f"{what}_wait_s": round(c["wall_s"], 2), f"{what}_cpu_s": round(c["cpu_s"], 3),
                                   f"{what}_cpu_cores": round(c["cpu_s"] / max(c["wall_s"], 1e-9), 3),
                                   f"{what}_error": c["error"][2][:300] if c["error"] else "none"})  # fmt: skip
    for what in ("save", "async_save"):
        c = r[what]
        assert c["error"] is not None, f"{what} did not time out: it waited {c['wall_s']:.1f} s until released"
        assert c["error"][1], f"{what} raised {c['error'][0]}, not distckpt.TimeoutError: {c['error'][2]}"
        assert c["wall_s"] < 2 * timeout, f"{what} took {c['wall_s']:.1f} s to time out (timeout={timeout})"
        assert c["cpu_s"] < 0.25 * c["wall_s"], f"{what} burned {c['cpu_s']:.2f} s of CPU in {c['wall_s']:.2f} s"


# ---- Snapshots ------------------------------------------------------------------------------------------------------


def test_snapshot_of_2000_small_tensors_with_the_training_stream_busy(tmp_path, record_property):
    torch = torch_cuda()
    dev = torch.device("cuda", 0)
    base = torch.randn(4096, device=dev, generator=torch.Generator(device=dev).manual_seed(4))
    sizes = [1 + (i * 7919) % 4096 for i in range(2000)]
    state = {f"t{i:04d}": torch.zeros(n, device=dev) for i, n in enumerate(sizes)}
    torch.cuda.synchronize()
    train = torch.cuda.Stream()
    tensors = list(state.values())
    for t in tensors:
        t.copy_(base[: t.numel()])
    torch._foreach_mul_(tensors, [1.0] * len(tensors))  # loads the kernels now (see SLEEP_CYCLES)
    torch._foreach_add_(tensors, 0.0)
    torch.cuda.synchronize()
    with torch.cuda.stream(train):
        train.wait_stream(torch.cuda.current_stream(dev))
        torch.cuda._sleep(SLEEP_CYCLES)
        # The step's writes, queued behind the long kernel: a few multi-tensor kernels rather than 2000 launches, which
        # could fill the stream's launch queue (about a thousand deep) and block here until the long kernel ended.
        torch._foreach_mul_(tensors, [float(i + 1) for i in range(len(tensors))])
        assert not train.query()
        t0 = time.monotonic()
        h = distckpt.async_save(state, tmp_path / "c", device_snapshot=True)
        call_s = time.monotonic() - t0
        torch._foreach_add_(tensors, 1.0)  # the next step: not in the checkpoint
    summary = h.result(timeout=300)
    report(record_property, call_s=round(call_s, 3), staging_s=round(h.staging_seconds, 3),
           host_staged_bytes=h.staged_bytes, tensors=len(state))  # fmt: skip
    out = {k: torch.empty_like(v) for k, v in state.items()}
    distckpt.load(out, tmp_path / "c")
    for i, (k, t) in enumerate(out.items()):
        assert torch.equal(t, base[: t.numel()] * (i + 1)), k
    host = distckpt.load(None, tmp_path / "c")
    assert len([k for k in host if k.startswith("t")]) == 2000
    assert summary is not None


def test_snapshot_on_a_full_gpu_then_a_training_step(tmp_path, record_property):
    # The GPU is filled through torch's allocator until 768 MiB are left, with 2 GiB of state (32 tensors of 64 MiB)
    # and the step's own inputs allocated, torch's cache emptied and cuBLAS set up. The snapshot cannot take the whole
    # state; async_save(device_snapshot=True) must not fail for want of memory, and a training step right after the
    # call (two new 64 MiB tensors) must not run out of memory: device memory distckpt takes must leave headroom.
    # Afterwards torch's allocated memory is what it was and the driver's free memory is back (within 128 MiB).
    torch_cuda()
    out = run_python(f"""
        import json, time, torch, distckpt
        MiB = 1 << 20
        dev = torch.device("cuda", 0)
        g = torch.Generator(device=dev).manual_seed(11)
        a = torch.randn(4096, 4096, device=dev, generator=g)
        b = torch.randn(4096, 4096, device=dev, generator=g)

        def step():
            return float(torch.relu(a @ b).sum())

        want = step()  # cuBLAS and its workspace set up before the GPU is full
        distckpt.save({{"warm": torch.ones(1024, device=dev)}}, {str(tmp_path / "warm")!r})  # the core's streams
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base_allocated = torch.cuda.memory_allocated()
        base_free, total = torch.cuda.mem_get_info()
        state = {{f"w{{i:02d}}": torch.randn(16 * MiB, device=dev, generator=g) for i in range(32)}}
        filler = []
        while True:
            free = torch.cuda.mem_get_info()[0]
            n = min(1 << 30, free - 768 * MiB)
            if n < 64 * MiB:
                break
            try:
                filler.append(torch.empty(n, dtype=torch.uint8, device=dev))
            except torch.cuda.OutOfMemoryError:
                break
        torch.cuda.synchronize()
        full_free = torch.cuda.mem_get_info()[0]
        t0 = time.monotonic()
        error = None
        try:
            h = distckpt.async_save(state, {str(tmp_path / "c")!r}, device_snapshot=True)
        except Exception as e:
            h, error = None, repr(e)
        call_s = time.monotonic() - t0
        during_free = torch.cuda.mem_get_info()[0]
        oom = None
        try:
            got = step()
        except torch.cuda.OutOfMemoryError as e:
            got, oom = None, str(e)[:400]
        if h is not None:
            h.result(timeout=600)
        del filler
        torch.cuda.empty_cache()
        loaded = {{k: torch.empty_like(v) for k, v in state.items()}}
        same = h is not None and (distckpt.load(loaded, {str(tmp_path / "c")!r}) is loaded) and all(
            torch.equal(loaded[k], state[k]) for k in state)
        staged = h.staged_bytes if h is not None else None
        del loaded, state, h
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        print("RESULT " + json.dumps({{
            "error": error, "oom": oom, "step_ok": got is not None and abs(got - want) <= 1e-3 * abs(want),
            "same": bool(same), "call_s": call_s, "host_staged_bytes": staged, "total": total,
            "base_free": base_free, "full_free": full_free, "during_free": during_free,
            "end_free": torch.cuda.mem_get_info()[0], "base_allocated": base_allocated,
            "end_allocated": torch.cuda.memory_allocated()}}))
    """, emulate_cuda=False, timeout=600)  # fmt: skip
    r = result_of(out)
    MiB = 1 << 20
    report(record_property, free_mib_when_full=r["full_free"] // MiB, free_mib_after_call=r["during_free"] // MiB,
           call_s=round(r["call_s"], 3), host_staged_bytes=r["host_staged_bytes"],
           free_mib_lost=(r["base_free"] - r["end_free"]) // MiB)  # fmt: skip
    assert r["error"] is None, f"async_save(device_snapshot=True) on a full GPU failed: {r['error']}"
    assert r["oom"] is None, f"the training step after the snapshot ran out of memory: {r['oom']}"
    assert r["step_ok"], r
    assert r["same"], "the checkpoint does not hold the state's values"
    assert r["end_allocated"] == r["base_allocated"], r
    assert r["end_free"] >= r["base_free"] - 128 * MiB, (r["base_free"] - r["end_free"]) // MiB


# ---- A strided load -------------------------------------------------------------------------------------------------


def test_strided_load_into_column_shards_against_row_shards_and_a_pinned_copy(tmp_path, record_property):
    torch = torch_cuda()
    dev = torch.device("cuda", 0)
    n, rows, cols = 8192, 1024, 64
    full = torch.randn(n, n, device=dev, generator=torch.Generator(device=dev).manual_seed(8)).to(torch.float16)
    distckpt.save({"w": [Shard(full[r : r + rows], (n, n), (r, 0)) for r in range(0, n, rows)]}, tmp_path / "c")
    col_shards = [torch.empty(n, cols, dtype=torch.float16, device=dev) for _ in range(n // cols)]
    row_shards = [torch.empty(rows, n, dtype=torch.float16, device=dev) for _ in range(n // rows)]
    views_of = torch.empty(n, n, dtype=torch.float16, device=dev)  # column views: non-contiguous destinations
    pinned = torch.empty(n * n, dtype=torch.float16).pin_memory()
    flat = torch.empty(n * n, dtype=torch.float16, device=dev)

    def load_cols():
        distckpt.load({"w": [Shard(c, (n, n), (0, i * cols)) for i, c in enumerate(col_shards)]}, tmp_path / "c")

    def load_rows():
        distckpt.load({"w": [Shard(s, (n, n), (i * rows, 0)) for i, s in enumerate(row_shards)]}, tmp_path / "c")

    def load_views():
        views = [views_of[:, i * cols : (i + 1) * cols] for i in range(n // cols)]
        distckpt.load({"w": [Shard(v, (n, n), (0, i * cols)) for i, v in enumerate(views)]}, tmp_path / "c")

    def pinned_copy():
        flat.copy_(pinned, non_blocking=True)

    def best(fn, times=3):
        seconds = []
        for _ in range(times):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
        return min(seconds)

    load_rows()  # warm: the file in the page cache, the staging pool allocated
    t_cols, t_rows, t_views, t_copy = best(load_cols, 2), best(load_rows), best(load_views, 2), best(pinned_copy)
    for i, c in enumerate(col_shards):
        assert torch.equal(c, full[:, i * cols : (i + 1) * cols]), i
    for i, s in enumerate(row_shards):
        assert torch.equal(s, full[i * rows : (i + 1) * rows]), i
    assert torch.equal(views_of, full)
    report(record_property, bytes=n * n * 2, cols_s=round(t_cols, 4), rows_s=round(t_rows, 4),
           col_views_s=round(t_views, 4), pinned_copy_s=round(t_copy, 5),
           cols_over_rows=round(t_cols / t_rows, 2), cols_over_pinned_copy=round(t_cols / t_copy, 2),
           rows_over_pinned_copy=round(t_rows / t_copy, 2), col_views_over_rows=round(t_views / t_rows, 2))  # fmt: skip


# ---- Graph capture --------------------------------------------------------------------------------------------------


def test_graph_capture_while_a_snapshot_save_finishes_in_the_background(tmp_path, record_property):
    torch = torch_cuda()
    dev = torch.device("cuda", 0)
    g = torch.Generator(device=dev).manual_seed(9)
    state = {f"p{i:02d}": torch.randn(16 << 20, device=dev, generator=g) for i in range(16)}  # 1 GiB
    want = {k: v.clone() for k, v in state.items()}
    a = torch.randn(1024, 1024, device=dev, generator=g)
    b = torch.randn(1024, 1024, device=dev, generator=g)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up before capture, as torch asks
        for _ in range(3):
            torch.relu(a @ b) + 1
    torch.cuda.current_stream().wait_stream(side)
    ref = torch.relu(a @ b) + 1
    torch.cuda.synchronize()

    h = distckpt.async_save(state, tmp_path / "c", device_snapshot=True)
    for v in state.values():
        v.zero_()  # after the call: the snapshot holds the values
    captures, overlapped, t0 = 0, 0, time.monotonic()
    while True:
        running = not h.done()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # capture_error_mode "global": unsafe calls from any thread break it
            static = torch.relu(a @ b) + 1
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, ref), f"capture {captures} replayed a wrong result"
        del graph, static
        captures += 1
        overlapped += running
        if (not running and captures >= 3) or time.monotonic() - t0 > 300:
            break
    h.result(timeout=60)
    report(record_property, captures=captures, captures_during_the_save=overlapped)
    assert overlapped >= 1, "the save had finished before the first capture: the case proved nothing"
    out = {k: torch.empty_like(v) for k, v in want.items()}
    distckpt.load(out, tmp_path / "c")
    for k in want:
        assert torch.equal(out[k], want[k]), k


# ---- NCCL at world size 1 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("comm", ["none", "from_torch"])
def test_nccl_all_reduce_loop_beside_async_saves(tmp_path, comm):
    # torch.distributed with NCCL at world size 1 (a file:// store): 100 iterations of all_reduce, an async save every
    # 10th (every other one with a device snapshot) while the step goes on changing the state; every all_reduce result
    # and every checkpoint checked. comm="from_torch" runs the saves over the training's process group (which
    # async_save replaces by a background gloo group of its own) and the loads over it.
    torch = torch_cuda()
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("torch.distributed has no NCCL backend here")
    out = run_python(f"""
        import json, torch, torch.distributed as dist, distckpt, distckpt.comm
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
        comm = distckpt.comm.from_torch() if {comm!r} == "from_torch" else None
        dev = torch.device("cuda", 0)
        g = torch.Generator(device=dev).manual_seed(7)
        state = {{f"p{{i}}": torch.randn(1 << 22, device=dev, generator=g) for i in range(8)}}  # 128 MiB
        x = torch.empty(1 << 20, device=dev)
        saves, wrong_sums = [], []
        for it in range(100):
            x.fill_(float(it))
            dist.all_reduce(x)  # world size 1: the sum is the value itself
            if it % 10 == 0:
                want = {{k: v.clone() for k, v in state.items()}}
                h = distckpt.async_save(state, "{tmp_path}/c" + str(it), comm=comm, device_snapshot=it % 20 == 0)
                saves.append((it, want, h))
            for v in state.values():
                v.mul_(0.5).add_(1.0)
            if not bool((x == float(it)).all()):
                wrong_sums.append(it)
        wrong_ckpts = []
        for it, want, h in saves:
            h.result(timeout=300)
            got = {{k: torch.empty_like(v) for k, v in want.items()}}
            distckpt.load(got, "{tmp_path}/c" + str(it), comm=comm)
            if not all(torch.equal(got[k], want[k]) for k in want):
                wrong_ckpts.append(it)
        dist.barrier()
        dist.destroy_process_group()
        print("RESULT " + json.dumps({{"wrong_sums": wrong_sums, "wrong_ckpts": wrong_ckpts, "saves": len(saves)}}))
    """, emulate_cuda=False, timeout=400)  # fmt: skip
    r = result_of(out)
    assert r == {"wrong_sums": [], "wrong_ckpts": [], "saves": 10}, r


# ---- Two GPUs -------------------------------------------------------------------------------------------------------


def test_save_from_cuda1_while_cuda0_is_current_and_load_into_cuda1(tmp_path):
    torch = gpus(2)
    torch.cuda.set_device(0)
    d1 = torch.device("cuda", 1)
    x = torch.zeros(_N, device=d1)
    dst = torch.zeros(_N, device=d1)
    torch.cuda.synchronize(d1)
    with torch.cuda.device(1):  # work queued on cuda:1's current (legacy default) stream
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(5.0)
    assert torch.cuda.current_device() == 0
    distckpt.save({"x": x}, tmp_path / "sync")
    for snapshot in (False, True):
        h = distckpt.async_save({"x": x}, tmp_path / f"async{int(snapshot)}", device_snapshot=snapshot)
        with torch.cuda.device(1):
            x.add_(1.0)  # after the call
        h.result(timeout=120)
        with torch.cuda.device(1):
            x.fill_(5.0)
    for name in ("sync", "async0", "async1"):
        with torch.cuda.device(1):
            torch.cuda._sleep(SLEEP_CYCLES)
            dst.fill_(-1.0)  # queued before the load on cuda:1's stream: the load must win
        assert torch.cuda.current_device() == 0
        distckpt.load({"x": dst}, tmp_path / name)
        torch.cuda.synchronize(d1)
        assert bool((dst == 5.0).all()), name
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "sync")["x"], np.full(_N, 5.0, np.float32))


def test_cupy_array_on_cuda1_saved_and_loaded_while_cuda0_is_current(tmp_path):
    # CuPy's __cuda_array_interface__ names the current device's current stream; the array's stream is cuda:1's
    # current stream, which distckpt must order after even while cuda:0 is the current device.
    gpus(2)
    cupy = cupy_gpu()
    spin = cupy.RawKernel(_SPIN_SOURCE, "spin_cycles")
    with cupy.cuda.Device(1):
        stream = cupy.cuda.Stream(non_blocking=True)
        x = cupy.zeros(_N, dtype=cupy.float32)
        dst = cupy.zeros(_N, dtype=cupy.float32)
        cupy.cuda.Device(1).synchronize()
        with stream:  # cuda:1's current stream from here on
            spin((1,), (1,), (np.int64(SLEEP_CYCLES),))
            x.fill(3.0)
            with cupy.cuda.Device(0):
                assert not stream.done, "the long kernel had finished before the save: the case would prove nothing"
                distckpt.save({"x": x}, tmp_path / "c")
            spin((1,), (1,), (np.int64(SLEEP_CYCLES),))
            dst.fill(-1.0)  # queued before the load: the load must win
            with cupy.cuda.Device(0):
                assert not stream.done, "the long kernel had finished before the load: the case would prove nothing"
                distckpt.load({"x": dst}, tmp_path / "c")
        stream.synchronize()
        assert bool((dst == 3.0).all())
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "c")["x"], np.full(_N, 3.0, np.float32))
