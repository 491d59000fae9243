"""The Gloo plugin (libdistckpt_gloo.so) as the installed package ships and loads it.

The core behind the extension loads Gloo from the plugin on the first Gloo communicator only, from beside the binary
that holds the core (the extension module, or the package's libdistckpt.so): saving, loading and reading with a single
process never map it. A missing plugin raises UnsupportedError naming the file and the alternatives. Each check runs
in a fresh interpreter, whose /proc/self/maps shows what it loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import distckpt

PACKAGE = Path(distckpt.__file__).resolve().parent

# Prints the mapped files whose names mention gloo (one a line) at the marks the script sets with `mapped(label)`.
PRELUDE = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import distckpt

    def mapped(label):
        with open("/proc/self/maps") as f:
            files = sorted({l.split(None, 5)[5].strip() for l in f if len(l.split(None, 5)) == 6})
        for name in files:
            if "gloo" in os.path.basename(name) or "hiredis" in os.path.basename(name):
                print(label, name)
    """
)


def _run(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "DCKPT_GLOO_PLUGIN"}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script), str(tmp_path)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )


def test_the_package_ships_the_plugin_beside_the_core():
    plugin = PACKAGE / "libdistckpt_gloo.so"
    assert plugin.is_file(), sorted(p.name for p in PACKAGE.iterdir())


def test_only_a_gloo_communicator_loads_the_plugin_from_the_package(tmp_path):
    out = _run(
        """
        tmp = sys.argv[1]
        distckpt.save({"w": np.arange(12.0).reshape(3, 4), "step": 3}, tmp + "/ckpt")
        state = distckpt.load(None, tmp + "/ckpt")
        assert state["step"] == 3
        distckpt.open(tmp + "/ckpt")["w"][1:2]
        mapped("before")
        with distckpt.comm.gloo(0, 1, rendezvous="file://" + tmp + "/rdv", hostname="127.0.0.1", timeout=60) as c:
            distckpt.save({"w": np.ones(4)}, tmp + "/ckpt-gloo", comm=c)
        mapped("after")
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert not [line for line in lines if line.startswith("before ")], lines
    after = {Path(line.split(" ", 1)[1]) for line in lines if line.startswith("after ")}
    assert PACKAGE / "libdistckpt_gloo.so" in {p.resolve() for p in after}, after
    assert any(p.name.startswith("libgloo") for p in after), after


def test_a_missing_plugin_is_an_unsupported_error_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "libdistckpt_gloo.so"
    out = _run(
        """
        try:
            distckpt.comm.gloo(0, 1, rendezvous="file://" + sys.argv[1] + "/rdv", timeout=10)
        except distckpt.UnsupportedError as e:
            print(e)
        else:
            print("no error")
        mapped("after")
        """,
        tmp_path,
        DCKPT_GLOO_PLUGIN=str(missing),
    )
    assert out.returncode == 0, out.stderr
    for words in (str(missing), "No such file or directory", "DCKPT_GLOO_PLUGIN", "distckpt.comm.from_torch"):
        assert words in out.stdout, out.stdout
    assert "after " not in out.stdout, out.stdout
