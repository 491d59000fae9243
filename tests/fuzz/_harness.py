"""Shared by the Python fuzz targets: imports distckpt's pure-Python parsers without the native extension.

If distckpt is already imported (pytest, python/tests/test_fuzz_regressions.py), its modules are used as they are;
otherwise an empty ``distckpt`` package pointing at python/distckpt/ is registered, so that importing a submodule does
not run distckpt/__init__.py (which loads the compiled extension).
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def module(name: str) -> Any:
    if "distckpt" not in sys.modules:
        pkg = types.ModuleType("distckpt")
        pkg.__path__ = [str(ROOT / "python" / "distckpt")]  # type: ignore[attr-defined]
        sys.modules["distckpt"] = pkg
    return importlib.import_module(f"distckpt.{name}")


def main(test_one_input: Any, make_seeds: Any) -> None:
    """``<target>.py --make-seeds DIR`` writes the seed corpus; anything else runs atheris with libFuzzer flags."""
    if len(sys.argv) == 3 and sys.argv[1] == "--make-seeds":
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        for name, data in make_seeds().items():
            (out / name).write_bytes(data)
        return
    import atheris  # noqa: PLC0415

    atheris.instrument_all()  # coverage of every Python function loaded so far: the parser, json, pickletools...
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
