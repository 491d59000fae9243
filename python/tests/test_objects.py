"""Non-array leaves: the safe JSON encoding, and pickle only with allow_pickle=True on both sides."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest

import distckpt


class Custom:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, Custom) and other.x == self.x


def test_json_values_round_trip_exactly(ckpt):
    values = {
        "int": 12345678901234567890,
        "neg": -5,
        "float": 0.1,
        "nan": float("nan"),
        "inf": float("-inf"),
        "str": "héllo ✓",
        "bool": True,
        "none": None,
        "bytes": b"\x00\xffraw",
        "complex": 1 + 2j,
        "tuple": (1, "a", (2.5, None)),
        "list": [1, [2, [3]]],
        "int_keys": {"inner": [{1: "a", 2: "b"}]},
        "dollar": [{"$tuple": "not a tag"}],
    }
    distckpt.save(values, ckpt)
    out = distckpt.load(None, ckpt)
    assert math.isnan(out.pop("nan"))
    expected = dict(values)
    expected.pop("nan")
    assert out == expected
    assert isinstance(out["tuple"][2], tuple)


def test_object_entries_are_json_bytes_readable_by_any_language(ckpt):
    distckpt.save({"cfg": [{"lr": 0.1, "warmup": 100}]}, ckpt)
    with distckpt.open(ckpt) as r:
        assert r.metadata["cfg"].kind == "bytes"
        assert json.loads(r.read_bytes("cfg")) == [{"lr": 0.1, "warmup": 100}]
        assert r["cfg"] == [{"lr": 0.1, "warmup": 100}]


def test_pickle_is_refused_on_save_without_the_flag(ckpt):
    with pytest.raises(distckpt.PickleNotAllowedError, match=r"'obj'.*Custom.*allow_pickle=True"):
        distckpt.save({"obj": Custom(1)}, ckpt)
    with pytest.raises(distckpt.PickleNotAllowedError):
        distckpt.save({"s": {1, 2}}, ckpt)


def test_pickled_entries_need_the_flag_to_load(ckpt):
    distckpt.save({"obj": Custom(3), "w": np.ones(2)}, ckpt, allow_pickle=True)
    with pytest.raises(distckpt.PickleNotAllowedError, match="'obj'.*trust"):
        distckpt.load(None, ckpt)
    with pytest.raises(distckpt.PickleNotAllowedError):
        distckpt.load({"obj": None}, ckpt)
    # Arrays alone do not need it.
    target = {"w": np.zeros(2)}
    distckpt.load(target, ckpt)
    np.testing.assert_array_equal(target["w"], 1)
    with distckpt.open(ckpt) as r:
        with pytest.raises(distckpt.PickleNotAllowedError):
            r["obj"]
    assert distckpt.load(None, ckpt, allow_pickle=True)["obj"] == Custom(3)
    with distckpt.open(ckpt, allow_pickle=True) as r:
        assert r["obj"] == Custom(3)


class _Boom:
    def __reduce__(self):
        return (exec, ("raise SystemExit('pickle payload ran')",))


def test_a_pickle_payload_marked_json_is_never_unpickled(ckpt):
    """Only the structure's own 'pickle' marking (plus allow_pickle) ever leads to pickle.loads."""
    import distckpt._native as native

    state = native.State()
    state.add_bytes("evil", pickle.dumps(_Boom()), False)
    root = {"dict": [["evil", {"object": "evil", "encoding": "json"}]]}
    state.set_structure(json.dumps({"distckpt_structure": 1, "root": root}).encode())
    native.save(ckpt, state, None, 0, False, False, 0, 0, None)
    with pytest.raises(distckpt.CorruptCheckpointError, match="'evil' is not valid distckpt JSON"):
        distckpt.load(None, ckpt, allow_pickle=True)


def test_malformed_or_newer_structures(ckpt, tmp_path):
    import distckpt._native as native

    def write(path, structure: bytes):
        state = native.State()
        state.add_tensor("a", native.DTYPES["F32"], [2])
        state.add_piece("a", [0], [2], np.ones(2, np.float32).view(np.uint8), False)
        state.set_structure(structure)
        native.save(str(path), state, None, 0, False, False, 0, 0, None)

    write(tmp_path / "bad", b'{"distckpt_structure": 1, "root": {"dict": [["a", {"array": 5}]]}}')
    with pytest.raises(distckpt.CorruptCheckpointError, match="malformed structure"):
        distckpt.load(None, tmp_path / "bad")
    write(tmp_path / "dangling", b'{"distckpt_structure": 1, "root": {"dict": [["b", {"array": "b"}]]}}')
    with pytest.raises(distckpt.CorruptCheckpointError, match="'b', which is not an entry"):
        distckpt.load(None, tmp_path / "dangling")
    write(tmp_path / "newer", b'{"distckpt_structure": 99, "root": {}}')
    with pytest.raises(distckpt.VersionError, match="version 99"):
        distckpt.load(None, tmp_path / "newer")
    # Another binding's structure (the core keeps it opaque): ignored, the entries come back flat.
    write(tmp_path / "foreign", b"written by another binding")
    assert list(distckpt.load(None, tmp_path / "foreign")) == ["a"]
    write(tmp_path / "other_json", b'{"rust": true}')
    assert list(distckpt.load(None, tmp_path / "other_json")) == ["a"]


def test_key_rules(ckpt):
    with pytest.raises(distckpt.InvalidArgumentError, match="keys of dicts"):
        distckpt.save({"a": {(1, 2): np.ones(1)}}, ckpt)
    with pytest.raises(distckpt.InvalidArgumentError, match="'a.b'"):
        distckpt.save({"a.b": np.ones(1), "a": {"b": np.ones(1)}}, ckpt)
    with pytest.raises(distckpt.InvalidArgumentError, match="mapping"):
        distckpt.save([np.ones(1)], ckpt)


class Stateful:
    """Like a torch module: saved through state_dict(), restored with load_state_dict()."""

    def __init__(self):
        self.w = np.zeros(3)
        self.steps = 0
        self.loaded = None

    def state_dict(self):
        return {"w": self.w, "steps": self.steps}

    def load_state_dict(self, sd):
        self.loaded = sd
        self.steps = sd["steps"]


def test_stateful_objects(ckpt):
    src = Stateful()
    src.w[:] = [1, 2, 3]
    src.steps = 42
    distckpt.save({"m": src, "pair": (src, 1)}, ckpt)
    dst = Stateful()
    out = distckpt.load({"m": dst}, ckpt)
    assert out["m"] is dst and dst.steps == 42
    np.testing.assert_array_equal(dst.w, [1, 2, 3])  # filled in place through state_dict()
    dst2 = Stateful()
    out = distckpt.load({"pair": (dst2, 0)}, ckpt)
    assert out["pair"][0] is dst2 and dst2.steps == 42 and out["pair"][1] == 1
