"""Orbax: distckpt as the checkpoint handler of ocp.CheckpointManager, with the real orbax-checkpoint package.

Sharded arrays are saved from a 2x2 mesh of CPU devices (conftest asks XLA for 4) and restored onto other meshes,
other partition specs, and in a process with 2 devices; every value is compared exactly.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (optional: pip install 'jax[cpu]')")
ocp = pytest.importorskip(
    "orbax.checkpoint", reason="orbax-checkpoint is not installed (optional: pip install orbax-checkpoint)"
)

import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import distckpt  # noqa: E402
from distckpt.orbax import (  # noqa: E402
    SUBDIRECTORY,
    DistckptCheckpointHandler,
    DistckptRestore,
    DistckptSave,
    entry_names,
)

pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 JAX devices (XLA_FLAGS host device count)")

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = Path(distckpt.__file__).resolve().parents[1]  # where the package under test is imported from


def mesh(shape, names):
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


def make_state(seed: int = 0) -> dict:
    """A pytree with arrays sharded over a 2x2 mesh, replicated and single-device arrays, and plain values."""
    m = mesh((2, 2), ("x", "y"))
    rng = np.random.default_rng(seed)
    return {
        "params": {
            "layers": [
                {"kernel": jax.device_put(rng.standard_normal((8, 6)).astype(np.float32),
                                          NamedSharding(m, P("x", "y"))),
                 "bias": jax.device_put(rng.standard_normal(6).astype(np.float32), NamedSharding(m, P()))},
                {"kernel": jax.device_put(jnp.asarray(rng.standard_normal((6, 4)), jnp.bfloat16),
                                          NamedSharding(m, P("y", "x"))),
                 "bias": jax.device_put(rng.integers(-9, 9, 4).astype(np.int32), NamedSharding(m, P("x")))},
            ],
            "embed": jnp.asarray(rng.standard_normal((5, 3)).astype(np.float32)),  # one device
        },
        "host": rng.standard_normal((3, 2)).astype(np.float32),  # a numpy array in the tree
        "step": 100 + seed,
        "lr": 0.125,
        "done": False,
        "name": "run-α",
        "schedule": [0.1, 0.01, 0.001],  # no arrays inside: stored as one value
        "nothing": None,  # an empty pytree node
    }  # fmt: skip


def kernel_bytes(state: dict, layer: int) -> bytes:
    return np.asarray(state["params"]["layers"][layer]["kernel"]).tobytes()


def assert_same_tree(got: Any, want: Any) -> None:
    """Same structure, same leaf types, every value equal (arrays byte for byte, with the same dtype)."""
    got_leaves, got_def = jax.tree_util.tree_flatten(got)
    want_leaves, want_def = jax.tree_util.tree_flatten(want)
    assert got_def == want_def
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, (jax.Array, np.ndarray, np.generic)):
            assert type(g) is type(w) or (isinstance(g, jax.Array) and isinstance(w, jax.Array))
            assert g.dtype == w.dtype and g.shape == w.shape
            assert np.asarray(g).tobytes() == np.asarray(w).tobytes()
        else:
            assert type(g) is type(w) and g == w


def abstract(tree: Any, sharding_of) -> Any:
    """The restore target: ShapeDtypeStructs with the shardings ``sharding_of(leaf)`` gives; values kept as they are."""

    def one(leaf):
        if isinstance(leaf, jax.Array):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding_of(leaf))
        return leaf

    return jax.tree_util.tree_map(one, tree)


def split(m: Mesh, prefer: int = -1):
    """A sharding function for :func:`abstract`: each leaf split over all of ``m``'s devices along dimension
    ``prefer`` where that divides evenly, else along another dimension that does, else replicated."""
    axis = m.axis_names[0] if len(m.axis_names) == 1 else tuple(m.axis_names)
    n = int(np.prod(m.devices.shape))

    def sharding_of(leaf) -> NamedSharding:
        dims = list(range(leaf.ndim))
        if dims:
            dims.insert(0, dims.pop(prefer))
        for d in dims:
            if leaf.shape[d] % n == 0:
                return NamedSharding(m, P(*[axis if i == d else None for i in range(leaf.ndim)]))
        return NamedSharding(m, P())

    return sharding_of


def assert_boxes(restored: Any, target: Any, original: Any) -> None:
    """Each restored array has its target's sharding, and each device's shard holds that box of the original."""
    for got, tgt, want in zip(*(jax.tree_util.tree_leaves(t) for t in (restored, target, original))):
        if isinstance(tgt, (jax.ShapeDtypeStruct, jax.Array)):
            assert isinstance(got, jax.Array) and got.sharding == tgt.sharding
            full = np.asarray(want)
            for s in got.addressable_shards:
                assert np.asarray(s.data).tobytes() == np.ascontiguousarray(full[s.index]).astype(got.dtype).tobytes()


def restore_step(root: Path, step: int, target: Any = None, item: str = "state") -> Any:
    with ocp.CheckpointManager(root) as mngr:
        return mngr.restore(step, args=ocp.args.Composite(**{item: DistckptRestore(target)}))[item]


def test_manager_saves_sharded_pytree_and_restores_onto_other_meshes(tmp_path):
    state = make_state()
    root = tmp_path / "ckpts"
    with ocp.CheckpointManager(root) as mngr:
        assert mngr.save(1, args=ocp.args.Composite(state=DistckptSave(state, user_metadata={"run": "a"})))
        mngr.wait_until_finished()

    # The item directory holds one ordinary distckpt checkpoint, named as distckpt.save names the same dicts.
    item = root / "1" / "state" / SUBDIRECTORY
    with distckpt.open(item) as r:
        assert sorted(r) == sorted(entry_names(state)) == [
            "done", "host", "lr", "name", "params.embed", "params.layers.0.bias", "params.layers.0.kernel",
            "params.layers.1.bias", "params.layers.1.kernel", "schedule", "step",
        ]  # fmt: skip
        assert [c.offsets for c in r.metadata["params.layers.0.kernel"].chunks] == [(0, 0), (0, 3), (4, 0), (4, 3)]
        assert len(r.metadata["params.layers.0.bias"].chunks) == 1  # replicated over 4 devices: written once
        assert r.metadata["params.layers.1.kernel"].dtype == "BF16"
        assert r.metadata.user["run"] == "a" and r.metadata.user["step"] == "100"
        assert r["params.layers.0.kernel"][...].tobytes() == kernel_bytes(state, 0)
    assert sorted(p.name for p in (root / "1" / "state").iterdir() if p.name.startswith(".")) == []  # no staging

    # Onto 2 of the devices, split the other way; then onto all 4 with other specs.
    m2 = mesh((2,), ("a",))
    m4 = mesh((4,), ("b",))
    for sharding_of in (split(m2, -1), split(m4, 0)):
        target = abstract(state, sharding_of)
        out = restore_step(root, 1, target)
        assert_same_tree(out, state)
        assert_boxes(out, target, state)
        assert out["nothing"] is None

    # Concrete arrays as targets: their sharding and dtype (f32 -> f16 converted as numpy's astype would).
    k_target = jax.device_put(jnp.zeros((8, 6), jnp.float16), NamedSharding(m2, P("a")))
    out = restore_step(root, 1, {"params": {"layers": [{"kernel": k_target}]}})
    k = out["params"]["layers"][0]["kernel"]
    assert k.sharding == k_target.sharding and k.dtype == jnp.float16
    assert np.asarray(k).tobytes() == np.asarray(state["params"]["layers"][0]["kernel"]).astype(np.float16).tobytes()
    assert not np.asarray(k_target).any()  # the target itself is untouched

    # No target: the whole item as nested dicts and lists of numpy arrays and values.
    whole = restore_step(root, 1)
    assert whole["params"]["layers"][1]["kernel"].dtype == jnp.bfloat16
    assert whole["params"]["layers"][1]["kernel"].tobytes() == kernel_bytes(state, 1)
    assert (whole["step"], whole["lr"], whole["done"], whole["name"]) == (100, 0.125, False, "run-α")
    assert whole["schedule"] == [0.1, 0.01, 0.001] and whole["host"].tobytes() == state["host"].tobytes()

    # A manager that knows the item's handler (Orbax needs it before any save or restore) gives its metadata.
    with ocp.CheckpointManager(root, item_handlers={"state": DistckptCheckpointHandler()}) as mngr:
        meta = mngr.item_metadata(1)["state"]
    assert meta["params.layers.1.kernel"] == jax.ShapeDtypeStruct((6, 4), jnp.bfloat16)
    assert meta["step"] == "bytes"


def test_manager_steps_max_to_keep_and_async_saves(tmp_path):
    root = tmp_path / "ckpts"
    options = ocp.CheckpointManagerOptions(max_to_keep=2, save_interval_steps=1)
    saved = {}
    with ocp.CheckpointManager(root, options=options) as mngr:
        assert mngr.latest_step() is None
        for step in range(5):
            state = make_state(seed=step)
            saved[step] = jax.tree_util.tree_map(lambda x: np.array(x) if isinstance(x, jax.Array) else x, state)
            assert mngr.save(step, args=ocp.args.Composite(state=DistckptSave(state)))
            # The save returned once distckpt copied the arrays: deleting them now cannot change the checkpoint.
            for leaf in jax.tree_util.tree_leaves(state):
                if isinstance(leaf, jax.Array):
                    leaf.delete()
        mngr.wait_until_finished()
        assert list(mngr.all_steps()) == [3, 4] and mngr.latest_step() == 4
    assert sorted(p.name for p in root.iterdir()) == ["3", "4"]  # finalized names only: no temporary directories

    template = make_state()
    m22 = mesh((2, 2), ("p", "q"))  # arrays split 4 ways over both axes, along their last dimension
    for step in (3, 4):
        target = abstract(template, split(m22, -1))
        out = restore_step(root, step, target)
        want = jax.tree_util.tree_map(lambda x: x, saved[step])
        for got, w in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(want)):
            if isinstance(w, np.ndarray):
                assert got.dtype == w.dtype and np.asarray(got).tobytes() == w.tobytes()
            else:
                assert type(got) is type(w) and got == w
        assert out["step"] == 100 + step

    # Another manager on the same root sees the same steps and continues from the latest.
    with ocp.CheckpointManager(root, options=options) as mngr:
        assert mngr.latest_step() == 4
        mngr.save(5, args=ocp.args.Composite(state=DistckptSave({"w": jnp.arange(6.0), "step": 5})))
        mngr.wait_until_finished()
        assert list(mngr.all_steps()) == [4, 5]
    assert restore_step(root, 5, {"w": jax.ShapeDtypeStruct((6,), jnp.float32), "step": 0})["step"] == 5


def test_handler_async_save_returns_a_commit_future(tmp_path):
    """The handler on its own: async_save starts distckpt.async_save, and the future it returns commits."""
    handler = DistckptCheckpointHandler()
    state = make_state(seed=7)
    want = np.asarray(state["params"]["layers"][0]["kernel"])
    directory = tmp_path / "item"
    directory.mkdir()
    futures = asyncio.run(handler.async_save(directory, args=DistckptSave(state)))
    assert len(futures) == 1
    summary = futures[0].result()
    assert isinstance(summary, distckpt.SaveSummary) and summary.num_entries == len(entry_names(state))
    assert (directory / SUBDIRECTORY / "metadata.dckpt").is_file()
    handler.finalize(directory)
    out = handler.restore(directory, args=DistckptRestore({"params": {"layers": [{"kernel": jax.ShapeDtypeStruct(
        (8, 6), jnp.float32, sharding=NamedSharding(mesh((4,), ("r",)), P("r", None)))}]}}))  # fmt: skip
    assert np.asarray(out["params"]["layers"][0]["kernel"]).tobytes() == want.tobytes()
    # The synchronous Checkpointer goes through save().
    ckptr = ocp.Checkpointer(DistckptCheckpointHandler())
    ckptr.save(tmp_path / "sync", args=DistckptSave(state))
    out = ckptr.restore(tmp_path / "sync", args=DistckptRestore(abstract(state, lambda x: x.sharding)))
    assert_same_tree(out, state)
    # A failed save raises through the future: distckpt refuses to replace a directory that is not a checkpoint.
    other = tmp_path / "other"
    (other / SUBDIRECTORY).mkdir(parents=True)
    (other / SUBDIRECTORY / "notes.txt").write_text("not a checkpoint")
    futures = asyncio.run(handler.async_save(other, args=DistckptSave(state)))
    with pytest.raises(distckpt.AlreadyExistsError, match="already exists"):
        futures[0].result()
    assert sorted(p.name for p in (other / SUBDIRECTORY).iterdir()) == ["notes.txt"]
    # The wrong args raise at once.
    with pytest.raises(distckpt.errors.InvalidArgumentError, match="DistckptSave"):
        asyncio.run(handler.async_save(directory, args=DistckptRestore(state)))


def test_orbax_restores_checkpoints_written_by_distckpt_save(tmp_path):
    """A checkpoint written by plain distckpt.save (no Orbax) restores through the handler: in an Orbax step layout
    (as <step>/<item>, or <step>/<item>/distckpt) and given directly."""
    state = make_state(seed=3)
    root = tmp_path / "ckpts"
    (root / "7").mkdir(parents=True)
    (root / "8" / "state").mkdir(parents=True)
    distckpt.save(state, root / "7" / "state")  # the item directory is the checkpoint itself
    distckpt.save(state, root / "8" / "state" / SUBDIRECTORY)
    m2 = mesh((2,), ("a",))
    target = abstract(state, split(m2, 0))
    with ocp.CheckpointManager(root) as mngr:
        assert list(mngr.all_steps()) == [7, 8]
        for step in (7, 8):
            out = mngr.restore(step, args=ocp.args.Composite(state=DistckptRestore(target))).state
            assert_same_tree(out, state)
            assert_boxes(out, target, state)
    plain = tmp_path / "plain"
    distckpt.save(state, plain)
    out = ocp.Checkpointer(DistckptCheckpointHandler()).restore(plain, args=DistckptRestore(target))
    assert_same_tree(out, state)
    # distckpt.load reads what the handler wrote, with the same names.
    with ocp.CheckpointManager(tmp_path / "orbax") as mngr:
        mngr.save(1, args=ocp.args.Composite(state=DistckptSave(state)))
    loaded = distckpt.load(None, tmp_path / "orbax" / "1" / "state" / SUBDIRECTORY)
    assert loaded["params"]["layers"][0]["kernel"].tobytes() == kernel_bytes(state, 0)
    assert loaded["name"] == "run-α" and loaded["schedule"] == [0.1, 0.01, 0.001]
    # A compressing handler: the options reach the save (format 3.0), and the item restores as before.
    packed = ocp.Checkpointer(DistckptCheckpointHandler(compression="zstd"))
    weights = {"w": np.tile(np.linspace(-1, 1, 512, dtype=np.float32), (256, 1)), "step": 3}
    packed.save(tmp_path / "packed", args=DistckptSave(weights))
    with distckpt.open(tmp_path / "packed" / SUBDIRECTORY) as r:
        assert r.metadata.format_version == (3, 0) and r.metadata.stored_bytes < weights["w"].nbytes
    out = ocp.Checkpointer(DistckptCheckpointHandler()).restore(tmp_path / "packed", args=DistckptRestore())
    assert np.array_equal(out["w"], weights["w"]) and out["step"] == 3
    with pytest.raises(distckpt.Error, match="compression level 99"):
        ocp.Checkpointer(DistckptCheckpointHandler(compression="zstd", compression_level=99)).save(
            tmp_path / "bad", args=DistckptSave(state)
        )


class AdamState(NamedTuple):
    count: Any
    mu: Any


def test_names_of_namedtuples_tuples_and_sparse_lists(tmp_path):
    """NamedTuple fields (optax states) are named by attribute, tuples like lists, and None elements leave gaps."""
    m = mesh((2, 2), ("x", "y"))
    w = jax.device_put(np.arange(16, dtype=np.float32).reshape(4, 4), NamedSharding(m, P("x", "y")))
    state = {
        "opt": (AdamState(count=np.int32(4), mu={"w": w}), None),
        "pairs": [(1, "a"), (2, "b")],
        "mixed": [w + 1, None, 3.5, {"k": 7}],
        "by_id": {0: np.float64(2.5), 7: "seven"},
    }
    assert entry_names(state) == [
        "by_id.0", "by_id.7", "mixed.0", "mixed.2", "mixed.3.k", "opt.0.count", "opt.0.mu.w", "pairs",
    ]  # fmt: skip
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.save(0, args=ocp.args.Composite(state=DistckptSave(state)))
        mngr.wait_until_finished()
    with distckpt.open(tmp_path / "0" / "state" / SUBDIRECTORY) as r:
        assert sorted(r) == sorted(entry_names(state))
    target = abstract(state, split(mesh((2,), ("a",)), -1))
    target["pairs"] = [(0, ""), (0, "")]
    out = restore_step(tmp_path, 0, target)
    assert isinstance(out["opt"][0], AdamState) and out["opt"][1] is None
    assert type(out["opt"][0].count) is np.int32 and out["opt"][0].count == 4
    assert np.asarray(out["opt"][0].mu["w"]).tobytes() == np.asarray(w).tobytes()
    assert out["pairs"] == [(1, "a"), (2, "b")] and out["by_id"] == {0: 2.5, 7: "seven"}
    assert type(out["by_id"][0]) is np.float64
    assert out["mixed"][1] is None and out["mixed"][2] == 3.5 and out["mixed"][3] == {"k": 7}
    assert np.asarray(out["mixed"][0]).tobytes() == np.asarray(w + 1).tobytes()


def test_clear_errors(tmp_path):
    state = {"w": jnp.arange(4.0), "sizes": [1, 2, 3]}
    with ocp.CheckpointManager(tmp_path / "c") as mngr:
        mngr.save(0, args=ocp.args.Composite(state=DistckptSave(state)))
        mngr.wait_until_finished()
    with pytest.raises(distckpt.NotFoundError, match="'b'"):
        restore_step(tmp_path / "c", 0, {"w": jax.ShapeDtypeStruct((4,), jnp.float32), "b": 0})
    with pytest.raises(distckpt.InvalidArgumentError, match="'sizes' is a list of 3 in the checkpoint, but a list of"):
        restore_step(tmp_path / "c", 0, {"sizes": [0, 0]})
    with pytest.raises(distckpt.InvalidArgumentError, match="single leaf"):
        DistckptCheckpointHandler().save(tmp_path / "x", args=DistckptSave(jnp.arange(3)))
    with pytest.raises(distckpt.InvalidArgumentError, match="two pytree paths give the distckpt name 'a.b'"):
        entry_names({"a.b": 1, "a": {"b": 2}})
    with pytest.raises(distckpt.InvalidArgumentError, match="str or int keys"):
        entry_names({(1, 2): jnp.zeros(1)})
    with pytest.raises(distckpt.InvalidArgumentError, match="'rng' is a typed PRNG key array.*key_data"):
        DistckptCheckpointHandler().save(tmp_path / "y", args=DistckptSave({"rng": jax.random.key(0)}))
    (tmp_path / "empty").mkdir()
    with pytest.raises(distckpt.NotFoundError, match="holds no distckpt checkpoint"):
        DistckptCheckpointHandler().restore(tmp_path / "empty", args=DistckptRestore({"w": 0}))


RESTORE_ON_TWO_DEVICES = textwrap.dedent(
    """
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from distckpt.orbax import DistckptRestore
    root, want = sys.argv[1], np.load(sys.argv[2])
    assert len(jax.devices()) == 2
    m = Mesh(np.array(jax.devices()), ("d",))
    target = {"params": {"w": jax.ShapeDtypeStruct(want.shape, want.dtype, sharding=NamedSharding(m, P("d", None)))},
              "step": 0}
    with ocp.CheckpointManager(root) as mngr:
        out = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(state=DistckptRestore(target))).state
    w = out["params"]["w"]
    assert w.sharding == target["params"]["w"].sharding and len(w.addressable_shards) == 2
    for s in w.addressable_shards:
        assert np.asarray(s.data).tobytes() == np.ascontiguousarray(want[s.index]).tobytes(), s.index
    assert out["step"] == 42 and type(out["step"]) is int
    print("restored on", len(jax.devices()), "devices")
    """
)


def test_restore_in_a_process_with_another_device_count(tmp_path):
    m = mesh((2, 2), ("x", "y"))
    full = np.arange(12 * 10, dtype=np.float32).reshape(12, 10) * 0.5
    state = {"params": {"w": jax.device_put(full, NamedSharding(m, P("x", "y")))}, "step": 42}
    with ocp.CheckpointManager(tmp_path / "ckpts") as mngr:
        mngr.save(42, args=ocp.args.Composite(state=DistckptSave(state)))
    np.save(tmp_path / "want.npy", full)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")]))
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-c", RESTORE_ON_TWO_DEVICES, str(tmp_path / "ckpts"), str(tmp_path / "want.npy")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "restored on 2 devices" in proc.stdout


def test_example_runs(tmp_path):
    example = REPO / "examples" / "python" / "jax_orbax_example.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")]))
    env.pop("XLA_FLAGS", None)  # the example asks for its own 4 devices
    root = tmp_path / "ckpts"
    proc = subprocess.run([sys.executable, str(example), str(root)], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "OK"
    assert "kept steps [3, 4], latest 4" in lines
    assert sum(line.endswith(": restored") for line in lines) == 10 and not any("DIFFERS" in line for line in lines)
    # What it left on disk is an ordinary distckpt checkpoint per kept step.
    for step in (3, 4):
        with distckpt.open(root / str(step) / "state" / SUBDIRECTORY) as r:
            assert r.read("step") == step and r.metadata["params.layers.0.kernel"].shape == (16, 8)
