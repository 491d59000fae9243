"""Round trips through save and load: every dtype and shape, nested state, in-place loads, shards and resharding."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import all_numpy_dtypes, ml_dtypes, same_bytes, sample

import distckpt

SHAPES = [(), (0,), (3, 0, 2), (7,), (4, 5), (2, 1, 3, 1, 2, 1, 2, 3)]  # 0-d, empty, 1-d, 2-d, 8-d


@pytest.mark.parametrize("dtype", all_numpy_dtypes(), ids=str)
def test_every_dtype_and_shape_round_trips_bit_exactly(tmp_path, dtype):
    state = {f"t{i}": sample(shape, dtype, seed=i) for i, shape in enumerate(SHAPES)}
    summary = distckpt.save(state, tmp_path / "c")
    assert summary.num_entries == len(SHAPES)
    assert summary.total_bytes == sum(a.nbytes for a in state.values())

    loaded = distckpt.load(None, tmp_path / "c")
    assert set(loaded) == set(state)
    for k, a in state.items():
        assert same_bytes(loaded[k], a), k

    # In place, into zeroed arrays of the same dtype (zero copy: the array itself is the destination).
    targets = {k: np.zeros_like(a) for k, a in state.items()}
    ids = {k: id(v) for k, v in targets.items()}
    out = distckpt.load(targets, tmp_path / "c")
    assert out is targets
    for k, a in state.items():
        assert id(targets[k]) == ids[k]
        assert same_bytes(targets[k], a), k


def test_nested_state_is_rebuilt_with_dotted_names(ckpt):
    w = sample((4, 3), np.float32)
    state = {
        "model": {"layers": [{"w": w, "b": np.arange(3.0)}, {"w": w * 2, "b": np.zeros(3)}], "scale": np.float32(2)},
        "optim": {
            "state": {0: {"exp_avg": np.ones(3)}, 1: {"exp_avg": np.full(3, 2.0)}},
            "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0, 1]}],
        },
        "step": 1000,
        "name": "run-7",
        "done": False,
        "nothing": None,
        "empty": {},
        "pair": (np.ones(2), "label"),
    }
    distckpt.save(state, ckpt)
    with distckpt.open(ckpt) as r:
        assert sorted(r.keys()) == sorted(
            [
                "done",
                "model.layers.0.b",
                "model.layers.0.w",
                "model.layers.1.b",
                "model.layers.1.w",
                "model.scale",
                "name",
                "nothing",
                "optim.param_groups",
                "optim.state.0.exp_avg",
                "optim.state.1.exp_avg",
                "pair.0",
                "pair.1",
                "step",
            ]
        )
    out = distckpt.load(None, ckpt)
    assert out["step"] == 1000 and out["name"] == "run-7" and out["done"] is False and out["nothing"] is None
    assert out["empty"] == {}
    assert out["optim"]["param_groups"] == [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0, 1]}]
    assert list(out["optim"]["state"]) == [0, 1]  # int keys stay ints
    assert isinstance(out["pair"], tuple) and out["pair"][1] == "label"
    np.testing.assert_array_equal(out["model"]["layers"][1]["w"], w * 2)
    assert isinstance(out["model"]["scale"], np.float32) and out["model"]["scale"] == 2


def test_load_into_converts_dtypes_and_fills_strided_targets(ckpt):
    a = sample((6, 8), np.float32)
    distckpt.save({"a": a, "b": a, "c": a}, ckpt)
    wide = np.zeros((6, 8), np.float64)  # different dtype: through a temporary, converted like astype
    backing = np.zeros((6, 16), np.float32)
    strided = backing[:, ::2]  # not contiguous
    fortran = np.asfortranarray(np.zeros((6, 8), np.float32))
    distckpt.load({"a": wide, "b": strided, "c": fortran}, ckpt)
    np.testing.assert_array_equal(wide, a.astype(np.float64))
    np.testing.assert_array_equal(strided, a)
    np.testing.assert_array_equal(backing[:, 1::2], 0)
    np.testing.assert_array_equal(fortran, a)


def test_load_subset_and_missing_entries(ckpt):
    distckpt.save({"a": np.ones(3), "b": {"c": np.zeros(2)}, "step": 3}, ckpt)
    target = {"b": {"c": np.full(2, 7.0)}}
    distckpt.load(target, ckpt)  # 'a' and 'step' are not requested: not read
    np.testing.assert_array_equal(target["b"]["c"], 0)
    with pytest.raises(distckpt.NotFoundError, match="'nope'"):
        distckpt.load({"nope": np.zeros(3)}, ckpt)
    with pytest.raises(distckpt.InvalidArgumentError, match=r"\(4,\).*\(3,\)"):
        distckpt.load({"a": np.zeros(4)}, ckpt)
    with pytest.raises(distckpt.InvalidArgumentError, match="read-only"):
        ro = np.zeros(3)
        ro.flags.writeable = False
        distckpt.load({"a": ro}, ckpt)


def test_plain_value_target_receives_a_new_array(ckpt):
    distckpt.save({"a": np.arange(4), "step": 9}, ckpt)
    target = {"a": None, "step": 0}
    distckpt.load(target, ckpt)
    np.testing.assert_array_equal(target["a"], np.arange(4))
    assert target["step"] == 9


def test_shards_reshard_between_layouts_in_one_process(ckpt):
    full = sample((10, 6), np.int32)
    # Saved as three uneven row shards plus one replica of the middle shard.
    rows = [(0, 3), (3, 7), (7, 10)]
    shards = [distckpt.Shard(full[a:b], (10, 6), (a, 0)) for a, b in rows]
    distckpt.save({"w": shards}, ckpt)
    with distckpt.open(ckpt) as r:
        assert [c.offsets for c in r.metadata["w"].chunks] == [(0, 0), (3, 0), (7, 0)]
    # Loaded as two column shards.
    left, right = np.zeros((10, 4), np.int32), np.zeros((10, 2), np.int32)
    distckpt.load({"w": [distckpt.Shard(left, (10, 6), (0, 0)), distckpt.Shard(right, (10, 6), (0, 4))]}, ckpt)
    np.testing.assert_array_equal(left, full[:, :4])
    np.testing.assert_array_equal(right, full[:, 4:])
    np.testing.assert_array_equal(distckpt.load(None, ckpt)["w"], full)


def test_shard_validation():
    with pytest.raises(distckpt.InvalidArgumentError, match="outside"):
        distckpt.Shard(np.zeros((4, 4)), (6, 4), (3, 0))
    with pytest.raises(distckpt.InvalidArgumentError, match="number of dimensions"):
        distckpt.Shard(np.zeros((4, 4)), (6,), (0, 0))
    s = distckpt.Shard(np.zeros((2, 4)), (6, 4), (2, 0))
    assert s.index == (slice(2, 4), slice(0, 4)) and s.local_shape == (2, 4)


def test_incomplete_tiling_fails_and_names_the_tensor(ckpt):
    with pytest.raises(distckpt.Error, match="'w'"):
        distckpt.save({"w": distckpt.Shard(np.zeros((2, 4)), (6, 4), (0, 0))}, ckpt)


def test_big_endian_memoryview_and_scalar_sources(ckpt):
    be = np.arange(5, dtype=">i4")
    mv = memoryview(np.arange(6, dtype=np.float64))
    distckpt.save({"be": be, "mv": mv, "s": np.int16(-3)}, ckpt)
    out = distckpt.load(None, ckpt)
    np.testing.assert_array_equal(out["be"], np.arange(5))
    assert out["be"].dtype == np.int32
    np.testing.assert_array_equal(out["mv"], np.arange(6.0))
    assert out["s"] == -3 and isinstance(out["s"], np.int16)


def test_unsupported_array_dtypes_are_refused_by_name(ckpt):
    with pytest.raises(distckpt.UnsupportedError, match="'when'.*datetime64"):
        distckpt.save({"when": np.array(["2024-01-01"], dtype="datetime64[D]")}, ckpt)


def test_overwrite_and_existing_checkpoints(ckpt):
    distckpt.save({"a": np.ones(2)}, ckpt)
    with pytest.raises(distckpt.AlreadyExistsError):
        distckpt.save({"a": np.zeros(2)}, ckpt)
    distckpt.save({"a": np.zeros(2)}, ckpt, overwrite=True)
    np.testing.assert_array_equal(distckpt.load(None, ckpt)["a"], 0)


def test_user_metadata_and_progress(ckpt):
    seen = []
    distckpt.save(
        {"a": np.ones(1 << 16)},
        ckpt,
        user_metadata={"step": "7", "framework": "numpy"},
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen and seen[-1][0] == seen[-1][1] == 8 << 16
    with distckpt.open(ckpt) as r:
        assert r.user_metadata == {"step": "7", "framework": "numpy"}
    loaded = []
    distckpt.load({"a": np.zeros(1 << 16)}, ckpt, progress=lambda d, t: loaded.append(d))
    assert loaded and loaded[-1] == 8 << 16


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")
def test_bfloat16_values_survive_conversion_on_load(ckpt):
    a = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)
    distckpt.save({"a": a}, ckpt)
    f32 = np.zeros(3, np.float32)
    distckpt.load({"a": f32}, ckpt)
    np.testing.assert_array_equal(f32, [1.5, -2.25, 3.0])


class DLPackOnly:
    """An array from some other library that speaks only DLPack."""

    def __init__(self, a):
        self._a = a
        self.shape = a.shape

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_sources(ckpt):
    a = sample((3, 5), np.int16)
    shards = [distckpt.Shard(DLPackOnly(a), (6, 5), (0, 0)), distckpt.Shard(a, (6, 5), (3, 0))]
    distckpt.save({"x": DLPackOnly(a), "s": shards}, ckpt)
    out = distckpt.load(None, ckpt)
    np.testing.assert_array_equal(out["x"], a)
    np.testing.assert_array_equal(out["s"], np.concatenate([a, a]))


def test_top_level_scalars_are_recorded_in_user_metadata(ckpt):
    state = {
        "model": {"w": np.ones(4, np.float32), "depth": 12},  # nested scalars stay entries only
        "step": 100,
        "epoch": np.int64(3),
        "lr": 1e-4,
        "warm": True,
        "run": "run-7",
        "loss": np.array(0.25, np.float32),  # a 0-d host array
        "notes": "x" * 300,  # too long to copy
        "tags": ["a", "b"],  # a container
        "missing": None,
        "nul": "a\x00b",  # C readers would cut it at the NUL: not copied
        "framework": 1,  # given explicitly below: the explicit value wins
    }
    distckpt.save(state, ckpt, user_metadata={"framework": "numpy"})
    with distckpt.open(ckpt) as r:
        assert r.user_metadata == {
            "step": "100",
            "epoch": "3",
            "lr": "0.0001",
            "warm": "true",
            "run": "run-7",
            "loss": "0.25",
            "framework": "numpy",
        }
    # The values themselves still load as they were saved.
    back = distckpt.load(None, ckpt)
    assert back["step"] == 100 and back["lr"] == 1e-4 and back["warm"] is True and back["run"] == "run-7"
    assert back["model"]["depth"] == 12 and back["tags"] == ["a", "b"] and back["missing"] is None
    assert back["nul"] == "a\x00b"
    with pytest.raises(distckpt.InvalidArgumentError, match="NUL"):
        distckpt.save({"a": np.ones(1)}, ckpt, overwrite=True, user_metadata={"k": "a\x00b"})


def test_the_callers_arrays_are_freed_when_dropped_without_the_garbage_collector(tmp_path):
    """Found on an H100: a load left the destination tensors (2 GiB of GPU memory) in reference cycles of its own
    (recursive closures), freed only whenever Python's collector next ran. Neither save nor load may keep an array
    alive past the call."""
    import gc
    import weakref

    class Stateful:
        def __init__(self) -> None:
            self.sd = {"w": np.arange(5.0)}

        def state_dict(self):
            return self.sd

        def load_state_dict(self, sd) -> None:
            self.sd = sd

    def make():
        return {"a": np.ones(8), "nested": {"l": [np.zeros(3), (np.full(2, 3.0), 7)]}, "m": Stateful()}

    def arrays(state):
        return [state["a"], state["nested"]["l"][0], state["nested"]["l"][1][0], state["m"].sd["w"]]

    gc.collect()
    gc.disable()
    try:
        for what in ("save", "async_save", "load", "load_none"):
            state = make()
            if what == "save":
                distckpt.save(state, tmp_path / "s")
            elif what == "async_save":
                distckpt.async_save(state, tmp_path / "a").result()
            elif what == "load":
                distckpt.load(state, tmp_path / "s")
            refs = [weakref.ref(a) for a in arrays(state)]
            if what == "load_none":
                loaded = distckpt.load(None, tmp_path / "s")
                refs = [weakref.ref(loaded["a"]), weakref.ref(loaded["nested"]["l"][0])]
                del loaded
            del state
            alive = [i for i, r in enumerate(refs) if r() is not None]
            assert alive == [], f"{what}: arrays {alive} outlived the call and the caller's last reference"
    finally:
        gc.enable()
