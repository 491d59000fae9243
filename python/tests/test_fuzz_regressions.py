"""Replays the committed inputs of the Python fuzz targets (tests/fuzz/regressions/<target>/: every finding of
scripts/fuzz.sh, plus seeds) through the targets' own TestOneInput, against the installed distckpt. A target raises on
a violated property, so a regression fails here. The C++ targets' inputs are replayed by Bazel (tests/fuzz)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "tests" / "fuzz"
TARGETS = ("dcp_metadata",)  # safetensors_header is C++ now (core/foreign/fuzz), replayed by Bazel


def _target(name: str):
    sys.path.insert(0, str(FUZZ))
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_fuzz", FUZZ / f"{name}_fuzz.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(FUZZ))
    return mod


CASES = [(t, p) for t in TARGETS for p in sorted((FUZZ / "regressions" / t).iterdir()) if p.is_file()]


@pytest.mark.parametrize("target,path", CASES, ids=[f"{t}/{p.name}" for t, p in CASES])
def test_fuzz_regression(target, path):
    _target(target).TestOneInput(path.read_bytes())


def test_every_python_target_has_regression_inputs():
    for t in TARGETS:
        assert any(p.is_file() for p in (FUZZ / "regressions" / t).iterdir()), t
