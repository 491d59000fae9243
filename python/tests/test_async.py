"""async_save: returns once the state is copied, so mutating the arrays right away cannot change what is saved."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import distckpt


def test_mutating_right_after_return_does_not_change_the_checkpoint(tmp_path):
    big = np.arange(4 << 20, dtype=np.float32)  # 16 MiB: the background write takes a while
    small = np.arange(10, dtype=np.int64)
    saves = []
    for step in range(3):
        before = (big.copy(), small.copy())
        handle = distckpt.async_save({"big": big, "small": small, "step": step}, tmp_path / f"s{step}")
        # The caller owns its arrays again at once: scribble over them before the save has finished.
        big += 1
        small[:] = -1 - step
        assert handle.staged() and handle.staged_bytes >= big.nbytes and handle.staging_seconds >= 0
        saves.append((handle, before))
    del big, small
    for step, (handle, (big_then, small_then)) in enumerate(saves):
        summary = handle.result(timeout=120)
        assert handle.done() and summary.path == str(tmp_path / f"s{step}")
        out = distckpt.load(None, tmp_path / f"s{step}")
        np.testing.assert_array_equal(out["big"], big_then)
        np.testing.assert_array_equal(out["small"], small_then)
        assert out["step"] == step


def test_result_reports_errors_and_timeouts(tmp_path):
    distckpt.save({"a": np.ones(2)}, tmp_path / "exists")
    h = distckpt.async_save({"a": np.ones(2)}, tmp_path / "exists")
    with pytest.raises(distckpt.AlreadyExistsError):
        h.result(timeout=60)
    assert isinstance(h.exception(), distckpt.AlreadyExistsError)
    with pytest.raises(distckpt.AlreadyExistsError):  # the same error again
        h.result()
    assert "failed" in repr(h)


def test_progress_callback_runs_on_the_background_thread(tmp_path):
    seen = []
    h = distckpt.async_save({"a": np.ones(1 << 18)}, tmp_path / "c", progress=lambda d, t: seen.append((d, t)))
    h.result(timeout=60)
    assert seen and seen[-1][0] == seen[-1][1] == 8 << 18


def test_pending_saves_are_completed_at_interpreter_exit(tmp_path):
    code = textwrap.dedent(f"""
        import numpy as np, distckpt
        distckpt.async_save({{"a": np.arange(1 << 20, dtype=np.float64)}}, {str(tmp_path / "c")!r})
        # exits without waiting: distckpt's atexit hook completes the save
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "c")["a"], np.arange(1 << 20))
    assert not [n for n in os.listdir(tmp_path) if "staging" in n]
