"""Checkpointing a sharded JAX training state with Orbax's CheckpointManager and distckpt, then restoring it onto
another mesh.

Runs on CPU: it asks XLA for 4 host devices (``--xla_force_host_platform_device_count``) unless XLA_FLAGS is set.

    python examples/python/jax_orbax_example.py [ROOT]

1. A small MLP's parameters are sharded over a 2x2 mesh (``P("x", "y")``) and trained for a few steps.
2. Every step is saved asynchronously through ``ocp.CheckpointManager`` with ``distckpt.orbax.DistckptSave``; the
   manager keeps the last two steps.
3. The latest step is restored onto a 2-device mesh with other partition specs (``DistckptRestore`` with
   ``jax.ShapeDtypeStruct`` targets), and once more without a target (numpy arrays), and compared value by value.

Prints one line per step and ``OK`` at the end; exits non-zero if anything differs.
"""

from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import distckpt  # noqa: E402
from distckpt.orbax import SUBDIRECTORY, DistckptRestore, DistckptSave  # noqa: E402

STEPS = 4


def init_state(mesh: Mesh) -> dict:
    """Parameters sharded over both mesh axes, a replicated bias, and plain values next to them."""
    k1, k2 = jax.random.split(jax.random.key(0))
    shard = NamedSharding(mesh, P("x", "y"))
    params = {
        "layers": [
            {"kernel": jax.device_put(jax.random.normal(k1, (16, 8), jnp.float32), shard),
             "bias": jax.device_put(jnp.zeros(8, jnp.float32), NamedSharding(mesh, P()))},
            {"kernel": jax.device_put(jax.random.normal(k2, (8, 4), jnp.bfloat16), shard),
             "bias": jax.device_put(jnp.zeros(4, jnp.bfloat16), NamedSharding(mesh, P("y")))},
        ]
    }  # fmt: skip
    return {"params": params, "step": 0, "config": {"lr": 0.01, "activation": "relu", "widths": [16, 8, 4]}}


def loss_fn(params: dict, x: jax.Array) -> jax.Array:
    h = x
    for i, layer in enumerate(params["layers"]):
        h = h @ layer["kernel"].astype(jnp.float32) + layer["bias"].astype(jnp.float32)
        if i + 1 < len(params["layers"]):
            h = jax.nn.relu(h)
    return jnp.mean(h**2)


@jax.jit
def train_step(params: dict, x: jax.Array, lr: float) -> dict:
    grads = jax.grad(loss_fn)(params, x)
    return jax.tree_util.tree_map(lambda p, g: (p - lr * g.astype(jnp.float32)).astype(p.dtype), params, grads)


def main(root: str) -> int:
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))
    state = init_state(mesh)
    x = jnp.ones((2, 16), jnp.float32)

    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(root, options=options) as mngr:
        for step in range(1, STEPS + 1):
            state = dict(state, params=train_step(state["params"], x, state["config"]["lr"]), step=step)
            # Returns once distckpt has copied the arrays; the write and both commits run in the background.
            mngr.save(step, args=ocp.args.Composite(state=DistckptSave(state)))
            print(f"step {step}: loss {float(loss_fn(state['params'], x)):.6f}, saving")
        mngr.wait_until_finished()
        steps = list(mngr.all_steps())
        latest = mngr.latest_step()
    print(f"kept steps {steps}, latest {latest}")
    if steps != [STEPS - 1, STEPS] or latest != STEPS:
        print(f"FAILED: expected steps {[STEPS - 1, STEPS]}", file=sys.stderr)
        return 1
    item = os.path.join(root, str(latest), "state", SUBDIRECTORY)
    with distckpt.open(item) as reader:
        print(f"{item}: {len(reader)} entries: {', '.join(sorted(reader))}")

    # Restore onto 2 devices, split along the other dimension (or replicated).
    mesh2 = Mesh(np.array(jax.devices()[:2]), ("model",))

    def abstract(leaf: object) -> object:
        if not isinstance(leaf, jax.Array):
            return leaf
        spec = P(None, "model") if leaf.ndim == 2 else P()
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh2, spec))

    target = jax.tree_util.tree_map(abstract, state)
    with ocp.CheckpointManager(root) as mngr:
        restored = mngr.restore(latest, args=ocp.args.Composite(state=DistckptRestore(target))).state
        whole = mngr.restore(latest, args=ocp.args.Composite(state=DistckptRestore())).state

    failures = 0
    leaves = jax.tree_util.tree_leaves
    for (path, want), got, tgt in zip(jax.tree_util.tree_leaves_with_path(state), leaves(restored), leaves(target)):
        name = jax.tree_util.keystr(path)
        if isinstance(want, jax.Array):
            ok = got.sharding == tgt.sharding and got.dtype == want.dtype
            ok = ok and np.array_equal(np.asarray(got), np.asarray(want))
        else:
            ok = type(got) is type(want) and got == want
        failures += not ok
        print(f"{name}: {'restored' if ok else 'DIFFERS'}")
    w = state["params"]["layers"][0]["kernel"]
    if not np.array_equal(whole["params"]["layers"][0]["kernel"], np.asarray(w)) or whole["config"] != state["config"]:
        failures += 1
        print("restore without a target: DIFFERS")
    if failures:
        print(f"FAILED: {failures} leaves differ", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(main(sys.argv[1]))
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(os.path.join(tmp, "checkpoints")))
