"""Errors: the status table, C messages, corruption, callback failures, and the GIL being released for I/O."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import distckpt
from distckpt import _native, errors


def test_every_status_code_maps_to_an_error_class():
    codes = {name: code for name, code in _native.STATUS.items() if name != "OK"}
    assert set(codes.values()) == set(errors.STATUS_TO_ERROR)
    for code in codes.values():
        e = errors.error_from_status(code, "the C message")
        assert isinstance(e, distckpt.Error) and str(e) == "the C message" and e.code == code
        assert e.status == _native.status_name(code)
    assert isinstance(errors.error_from_status(-7, "x"), TimeoutError)  # the builtin, too
    assert isinstance(errors.error_from_status(-2, "x"), ValueError)
    assert isinstance(errors.error_from_status(-14, "x"), distckpt.StorageError)
    assert isinstance(errors.error_from_status(-999, "x"), distckpt.InternalError)


def test_messages_come_from_the_c_library(tmp_path):
    with pytest.raises(distckpt.NotFoundError) as info:
        distckpt.load(None, tmp_path / "missing")
    assert str(tmp_path / "missing") in str(info.value) and info.value.code == _native.STATUS["ENOTFOUND"]
    with pytest.raises(distckpt.InvalidArgumentError, match="9 dimensions"):
        distckpt.save({"a": np.zeros((1,) * 9)}, tmp_path / "c")


def test_a_wrong_shape_names_the_checkpoint_the_entry_and_both_shapes(tmp_path):
    """Regression: the message named the entry and the shapes, not the checkpoint."""
    path = tmp_path / "c"
    distckpt.save({"model": {"w": np.zeros((2, 3), np.float32)}}, path)
    with pytest.raises(distckpt.InvalidArgumentError) as info:
        distckpt.load({"model": {"w": np.zeros((3, 2), np.float32)}}, path)
    message = str(info.value)
    assert f"checkpoint '{path}'" in message and "entry 'model.w'" in message
    assert "(3, 2)" in message and "(2, 3)" in message
    shard = distckpt.Shard(np.zeros((1, 3), np.float32), (4, 3), (0, 0))  # a piece of a tensor of the wrong shape
    with pytest.raises(distckpt.InvalidArgumentError, match=r"checkpoint '.*', entry 'model.w': .*\(4, 3\).*\(2, 3\)"):
        distckpt.load({"model": {"w": shard}}, path)


def _data_file(path):
    (name,) = [n for n in os.listdir(path) if n.startswith("data-")]
    return os.path.join(path, name)


def test_flipped_byte_is_a_corrupt_checkpoint_naming_entry_and_file(ckpt):
    distckpt.save({"w": np.arange(1000, dtype=np.float64)}, ckpt)
    data = _data_file(ckpt)
    with distckpt.open(ckpt) as r:
        offset = r.metadata["w"].chunks[0].file_offset
    with open(data, "r+b") as f:
        f.seek(offset + 17)
        b = f.read(1)
        f.seek(offset + 17)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(distckpt.CorruptCheckpointError) as info:
        distckpt.load(None, ckpt)
    assert "'w'" in str(info.value) and os.path.basename(data) in str(info.value)
    with distckpt.open(ckpt) as r, pytest.raises(distckpt.CorruptCheckpointError):
        r.verify()
    # Without verification the (wrong) bytes are returned: the caller asked for that.
    assert distckpt.load(None, ckpt, verify=False)["w"][2] != 2.0


def test_truncated_data_and_garbage_metadata(tmp_path):
    distckpt.save({"w": np.ones(4096)}, tmp_path / "t")
    data = _data_file(tmp_path / "t")
    os.truncate(data, os.path.getsize(data) - 100)
    with pytest.raises(distckpt.CorruptCheckpointError, match="truncated|size"):
        distckpt.load(None, tmp_path / "t")
    distckpt.save({"w": np.ones(4)}, tmp_path / "g")
    with open(tmp_path / "g" / "metadata.dckpt", "r+b") as f:
        f.write(b"\xff" * 64)
    with pytest.raises(distckpt.CorruptCheckpointError):
        distckpt.open(tmp_path / "g")


def test_a_failing_callback_is_the_cause(tmp_path):
    class Stop(Exception):
        pass

    def progress(done, total):
        raise Stop("enough")

    with pytest.raises(distckpt.CallbackError) as info:
        distckpt.save({"a": np.ones(1 << 16)}, tmp_path / "c", progress=progress)
    assert isinstance(info.value.__cause__, Stop)
    assert not os.path.exists(tmp_path / "c")  # nothing appears after a failed save


def test_argument_errors(tmp_path):
    with pytest.raises(distckpt.InvalidArgumentError, match="comm must be"):
        distckpt.save({"a": np.ones(1)}, tmp_path / "c", comm=object())
    with pytest.raises(distckpt.InvalidArgumentError, match="timeout"):
        distckpt.save({"a": np.ones(1)}, tmp_path / "c", timeout=-1)
    with pytest.raises(distckpt.InvalidArgumentError, match="user_metadata"):
        distckpt.save({"a": np.ones(1)}, tmp_path / "c", user_metadata={"step": 3})


def _wakeups_during(call):
    """Runs call() on a thread while this thread wakes up every half millisecond; returns how many wake-ups
    completed while call() ran. Waking needs the GIL, so a call that holds it throughout allows none, apart from the
    interpreter's forced switches at its very ends (at most a couple). The sleeper needs a free core to wake on: the
    calls measured leave one.
    """
    marks = {}

    def run():
        marks["t0"] = time.perf_counter()
        call()
        marks["t1"] = time.perf_counter()

    stamps = []
    t = threading.Thread(target=run)
    t.start()
    while t.is_alive():
        time.sleep(0.0005)
        stamps.append(time.perf_counter())
    t.join()
    return sum(1 for s in stamps if marks["t0"] < s < marks["t1"])


def test_the_gil_is_released_during_native_io(tmp_path):
    # The extension's own calls, so that the timed window holds no Python work. One I/O thread each, so that a core
    # stays free for the waking thread on a 2-core machine (with a thread per core the sleeper waits for a core, not
    # for the GIL, and the count measures the scheduler).
    a = np.arange(32 << 20, dtype=np.float32)  # 128 MiB
    state = _native.State()
    state.add_tensor("a", _native.DTYPES["F32"], [a.size])
    state.add_piece("a", [0], [a.size], a.view(np.uint8), False)
    path = str(tmp_path / "c")
    assert _wakeups_during(lambda: _native.save(path, state, None, 1, False, False, 0, 0, None)) > 5
    reader = _native.Reader.open(path, None, True, 1, 0)
    out = np.empty_like(a)
    assert _wakeups_during(lambda: reader.read("a", [0], [a.size], out.view(np.uint8))) > 5
    np.testing.assert_array_equal(out, a)
    reader.close()
    state = _native.State()
    state.add_tensor("a", _native.DTYPES["F32"], [a.size])
    state.add_piece("a", [0], [a.size], out.view(np.uint8), True)
    assert _wakeups_during(lambda: _native.load(path, state, None, True, 1, 0, None)) > 5
    # The measure itself: a call that keeps the GIL (as long as the ones above) lets (almost) no wake-up through.
    big = np.ones(5_000_000)
    assert _wakeups_during(big.tolist) <= 3
