"""The shared value fixtures (tests/fixtures/values/, README.md there): Python's decoder gives each valid one its
expected result and rejects each invalid one with its error kind, and the encoder writes the valid ones it wrote
byte for byte again. Rust (rust/distckpt/tests/value_fixtures.rs) and Go (go/value_fixtures_test.go) read the same
files, so the three agree on FORMAT.md appendix A."""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any, Dict, List, Tuple

import pytest

from distckpt import _tree
from distckpt.errors import CorruptCheckpointError, PickleNotAllowedError, VersionError

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "values")
ERRORS = {"corrupt": CorruptCheckpointError, "version": VersionError, "pickle": PickleNotAllowedError}


def cases(kind: str) -> List[Tuple[str, str, Dict[str, Any]]]:
    """(name, input path, sidecar) for every fixture of ``kind`` ("value" or "structure")."""
    folder = os.path.join(FIXTURES, kind)
    out = []
    inputs = set()
    for f in sorted(os.listdir(folder)):
        for suffix in (".expected.json", ".invalid.json"):
            if f.endswith(suffix):
                name = f[: -len(suffix)]
                with open(os.path.join(folder, f), encoding="utf-8") as fh:
                    side = json.load(fh)
                side["valid"] = suffix == ".expected.json"
                ext = ".pickle" if side.get("encoding") == "pickle" else ".json"
                inputs.add(name + ext)
                out.append((name, os.path.join(folder, name + ext), side))
    stray = sorted(
        set(os.listdir(folder))
        - inputs
        - {f for f in os.listdir(folder) if f.endswith((".expected.json", ".invalid.json"))}
    )
    assert not stray, f"inputs without an .expected.json or .invalid.json: {stray}"
    return out


def _generator() -> Any:
    """tests/fixtures/values/generate.py, whose typed forms the expected files hold (one definition for both)."""
    spec = importlib.util.spec_from_file_location("_value_fixtures_generate", os.path.join(FIXTURES, "generate.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_GEN = _generator()
typed_node = _GEN.typed_node


def typed(v: Any) -> Any:
    """The typed form of a decoded value (strict: the decoder must give bytes, never bytearray)."""
    return _GEN.typed(v, strict=True)


VALUE_CASES = cases("value")
STRUCTURE_CASES = cases("structure")


def test_every_kind_of_fixture_is_there() -> None:
    assert sum(s["valid"] for _, _, s in VALUE_CASES) >= 50 and sum(not s["valid"] for _, _, s in VALUE_CASES) >= 50
    assert sum(s["valid"] for _, _, s in STRUCTURE_CASES) >= 15
    assert sum(not s["valid"] for _, _, s in STRUCTURE_CASES) >= 30
    kinds = json.dumps([s.get("decoded") for _, _, s in VALUE_CASES])
    for kind in ("none", "bool", "int", "float", "str", "bytes", "complex", "list", "tuple", "dict"):
        assert f'"{kind}":' in kinds, kind


@pytest.mark.parametrize("name,path,side", VALUE_CASES, ids=[c[0] for c in VALUE_CASES])
def test_value_fixture(name: str, path: str, side: Dict[str, Any]) -> None:
    with open(path, "rb") as f:
        data = f.read()
    encoding = side.get("encoding", "json")
    if not side["valid"]:
        err = ERRORS[side["error"]]
        with pytest.raises(err) as info:
            _tree.decode_object(data, encoding, name, "fixtures", allow_pickle=False)
        assert type(info.value) is err, f"{name}: {type(info.value).__name__}: {info.value}"
        assert f"'{name}'" in str(info.value), "the error names the entry"
        return
    value = _tree.decode_object(data, encoding, name, "fixtures", allow_pickle=False)
    assert typed(value) == side["decoded"]
    if side["encoder_output"]:
        assert _tree.encode_object(value, name, allow_pickle=False) == (data, "json"), "re-encoded byte for byte"


@pytest.mark.parametrize("name,path,side", STRUCTURE_CASES, ids=[c[0] for c in STRUCTURE_CASES])
def test_structure_fixture(name: str, path: str, side: Dict[str, Any]) -> None:
    with open(path, "rb") as f:
        raw = f.read()
    if not side["valid"]:
        err = ERRORS[side["error"]]
        with pytest.raises(err) as info:
            _tree.parse_structure(raw, "fixtures")
        assert type(info.value) is err, f"{name}: {type(info.value).__name__}: {info.value}"
        assert "'fixtures'" in str(info.value), "the error names the checkpoint"
        return
    root = _tree.parse_structure(raw, "fixtures")
    if side["decoded"] is None:
        assert root is None, "not a distckpt structure: the checkpoint has none"
        return
    assert root is not None
    assert typed_node(root) == side["decoded"]
    if side["encoder_output"]:
        assert _tree.dump_structure(root) == raw, "re-encoded byte for byte"


def test_the_encoder_refuses_what_readers_reject() -> None:
    """Appendix A's writer rules that the fixtures cannot show: nothing deeper than the limits, no lone surrogates."""
    deep: Any = ()
    for _ in range(101):
        deep = (deep,)
    with pytest.raises(PickleNotAllowedError, match="nested too deeply"):
        _tree.encode_object(deep, "deep", allow_pickle=False)
    with pytest.raises(PickleNotAllowedError, match="surrogate"):
        _tree.encode_object(["ok", "\ud800"], "s", allow_pickle=False)
    state: Any = {"leaf": 1}
    for i in range(_tree.MAX_STRUCTURE_DEPTH - 1):
        state = {f"k{i}": state}
    _tree.flatten(state, lambda x: False)  # the leaf is at depth 200
    with pytest.raises(Exception, match="deeper than 200"):
        _tree.flatten({"top": state}, lambda x: False)
