"""The runnable framework examples (examples/python/{dcp,fsdp2,ddp}_example.py, documented in docs/frameworks/) run
as they would for a user: each as a subprocess that spawns its own gloo ranks, and each must print its OK line and
exit 0. Every example checks its own values (every loaded tensor against what was saved)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (optional: pip install torch)")
pytest.importorskip("torch.distributed.fsdp", reason="this torch has no FSDP2 (torch.distributed.fsdp)")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with gloo", allow_module_level=True)

import distckpt  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"
# Subprocesses import the distckpt this process imported (the installed package, or the sources on PYTHONPATH).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(distckpt.__file__)))
PYTHONPATH = os.pathsep.join(p for p in [_PACKAGE_DIR, os.environ.get("PYTHONPATH", "")] if p)


@pytest.mark.parametrize("name, ok", [("dcp_example.py", "dcp example OK"), ("fsdp2_example.py", "fsdp2 example OK"),
                                      ("ddp_example.py", "ddp example OK")])  # fmt: skip
def test_example_runs(tmp_path, name, ok):
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    p = subprocess.run([sys.executable, str(EXAMPLES / name), str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert p.returncode == 0, f"{name} exited with {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert ok in p.stdout, p.stdout
    # The checkpoint the example wrote is an ordinary one: distckpt opens it and every checksum verifies.
    with distckpt.open(tmp_path / "ckpt") as r:
        r.verify()
