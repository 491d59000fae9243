"""python -m distckpt: export-safetensors, import-safetensors, import-dcp (see test_torch.py), info."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np

import distckpt
from distckpt.__main__ import ProgressBar, main


def cli(*args, check=True):
    return subprocess.run([sys.executable, "-m", "distckpt", *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=check)  # fmt: skip


def test_export_import_and_info_from_the_command_line(tmp_path):
    w = np.arange(64, dtype=np.float32).reshape(8, 8)
    distckpt.save({"w": w, "b": np.ones(3, np.int16), "step": 3}, tmp_path / "c")

    r = cli("export-safetensors", tmp_path / "c", tmp_path / "hf", "--max-shard-size", "200B")
    assert r.stderr == ""  # not a terminal: no progress bar
    printed = r.stdout.split()
    assert printed[-1].endswith("model.safetensors.index.json") and all(os.path.exists(p) for p in printed)

    r = cli("import-safetensors", tmp_path / "hf", tmp_path / "c2")
    assert r.stderr == "" and "2 entries" in r.stdout
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "c2")["w"], w)

    r = cli("info", tmp_path / "c")
    assert "w  F32[8, 8]  1 chunk" in r.stdout and "step  bytes[1]" in r.stdout


def test_export_rename_flags(tmp_path):
    distckpt.save({"model": {"w": np.ones((2, 2), np.float32), "b": np.zeros(2, np.float32)}, "opt": {"m": np.ones(2)}},
                  tmp_path / "c")  # fmt: skip
    r = cli("export-safetensors", tmp_path / "c", tmp_path / "hf", "--rename", r"opt\..*=", "--rename",
            r"model\.(\w+)=layer.\1", "--buffer-size", "64KiB", "--io-threads", "2", "--json")  # fmt: skip
    assert json.loads(r.stdout)["tensors"] == 2
    with open(tmp_path / "hf" / "model.safetensors.index.json", encoding="utf-8") as f:
        assert sorted(json.load(f)["weight_map"]) == ["layer.b", "layer.w"]
    # Rules the core refuses, and a flag without '=': usage errors (2) naming the problem, as in the Go CLI.
    for rule, says in ((r"model\..=x", "'model.b'"), ("model.(=x", "rule 1"), ("no-equals", "PATTERN=REPLACEMENT")):
        r = cli("export-safetensors", tmp_path / "c", tmp_path / "bad", "--rename", rule, check=False)
        assert r.returncode == 2 and says in r.stderr, (rule, r.returncode, r.stderr)


def test_errors_exit_with_the_shared_status_and_the_message(tmp_path):
    # docs/cli.md's table, the Go CLI's (these exited 1 before the statuses were shared): 4 not found, 3 a failure.
    r = cli("info", tmp_path / "missing", check=False)
    assert r.returncode == 4 and r.stderr.startswith("distckpt: error: ") and "missing" in r.stderr
    distckpt.save({"z": np.ones(2, np.complex128)}, tmp_path / "c")
    r = cli("export-safetensors", tmp_path / "c", tmp_path / "out", check=False)
    assert r.returncode == 3 and "'z'" in r.stderr
    r = cli("no-such-command", check=False)
    assert r.returncode == 2


def test_progress_bar_draws_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = ProgressBar("export", stream=stream)
        bar(0, 2000)
        bar(2000, 2000)
        bar.close()
    assert "100.0%" in tty.getvalue() and tty.getvalue().endswith("\n")
    assert pipe.getvalue() == ""


def test_main_in_process(tmp_path, capsys):
    distckpt.save({"a": np.ones(2)}, tmp_path / "c")
    assert main(["-q", "info", str(tmp_path / "c")]) == 0
    assert "a  F64[2]" in capsys.readouterr().out
