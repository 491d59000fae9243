"""A JAX job on two nodes that checkpoints every step with ``distckpt.CheckpointManager``, loses a node, and resumes
on the node that is left, with another mesh.

Runs on CPU: two processes (``jax.distributed`` over loopback, two host devices each) stand for two nodes; each has
its own node-local tier directory and node id.

    python examples/python/manager_jax_example.py [ROOT]

1. The job: an MLP's parameters are sharded over a 4-device mesh that spans both processes (``P("x")``: each process
   holds half the rows). Each step, every process hands its shards to ``mgr.save(step, state)``, which returns once
   they are copied; the core writes each process's part to its node's tier, replicates it to the other node over the
   manager's own Gloo communicator, and persists every third step.
2. Node 1 is lost: its processes end and its local tier is deleted.
3. One process with four devices (the surviving node, another mesh: 2x2, ``P("x", "y")``) restores with
   ``jax.ShapeDtypeStruct`` targets. The newest step comes from node 0's tier: its own part, and the replica of node
   1's. Every value is compared with what the job saved, and training goes on.

Prints "manager jax example OK" and exits 0, or raises.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile

STEPS, PERSIST_EVERY = 6, 3
DIM, HIDDEN = 16, 8


def init_params(jax, jnp):
    k1, k2 = jax.random.split(jax.random.key(0))
    return {
        "w1": jax.random.normal(k1, (DIM, HIDDEN), jnp.float32),
        "w2": jax.random.normal(k2, (HIDDEN, 4), jnp.float32),
        "b1": jnp.zeros(HIDDEN, jnp.float32),
    }


def make_train_step(jax, jnp):
    def loss(params, x):
        return jnp.mean((jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"]) ** 2)

    @jax.jit
    def train_step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)

    return train_step


def job(process: int, root: str) -> None:
    """One process of the 2-node job (node ``process``), devices 2 per process."""
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import distckpt

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    with open(f"{root}/port") as f:
        port = f.read().strip()
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process)
    mesh = Mesh(np.array(jax.devices()).reshape(4), ("x",))
    rows = NamedSharding(mesh, P("x"))
    params = jax.tree_util.tree_map(lambda a: jax.device_put(a, rows), init_params(jax, jnp))
    train_step = make_train_step(jax, jnp)
    x = jax.device_put(jnp.ones((8, DIM), jnp.float32), NamedSharding(mesh, P()))

    # The manager's communicator is its own: its collectives run on the manager's background thread.
    comm = distckpt.comm.gloo(process, 2, rendezvous=f"file://{root}/rendezvous", timeout=60)
    with distckpt.CheckpointManager(
        comm,
        local_dir=f"{root}/node{process}",  # on a real cluster: the default, /dev/shm/distckpt-<job>
        node_id=f"node{process}",  # on a real cluster: the default, the host name
        persistent=f"{root}/persistent",
        persist_every=PERSIST_EVERY,
    ) as mgr:
        for step in range(1, STEPS + 1):
            params = train_step(params, x)
            mgr.save(step, {"params": params, "step": step})  # returns once this process's shards are copied
        mgr.wait_until_finished()
        if process == 0:
            print(f"job: saved steps 1..{STEPS}; newest complete step {mgr.latest_step()}")
    comm.close()
    full = multihost_utils.process_allgather(params, tiled=True)  # for the check only
    if process == 0:
        np.savez(f"{root}/expected.npz", **{k: np.asarray(v) for k, v in full.items()})


def resume(root: str) -> None:
    """The surviving node: one process, 4 devices, a 2x2 mesh."""
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import distckpt

    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))

    def target(a):
        spec = P("x", "y") if a.ndim == 2 else P("y")
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, spec))

    state = {"params": jax.tree_util.tree_map(target, init_params(jax, jnp)), "step": 0}
    # One node left: no other node to keep replicas on (replicas=0) until the job grows again.
    with distckpt.CheckpointManager(local_dir=f"{root}/node0", node_id="node0", replicas=0,
                                    persistent=f"{root}/persistent") as mgr:  # fmt: skip
        result = mgr.restore(state)  # fills state: JAX arrays are replaced by new ones with the target's sharding
    print(f"resume: restored step {result.step} from the {result.tier} tier "
          f"({result.bytes_local} bytes local, {result.bytes_from_persistent} from persistent storage)")  # fmt: skip
    print(result.report.strip())
    assert result.step == STEPS and result.tier == "local" and result.bytes_from_persistent == 0, result
    expected = np.load(f"{root}/expected.npz")
    for name, a in state["params"].items():
        assert isinstance(a, jax.Array) and a.sharding == target(a).sharding, name
        np.testing.assert_array_equal(np.asarray(a), expected[name], err_msg=name)
    assert state["step"] == STEPS
    params = make_train_step(jax, jnp)(state["params"], jnp.ones((8, DIM), jnp.float32))  # and training goes on
    assert np.isfinite(np.asarray(params["w1"])).all()


def main(root: str) -> None:
    with socket.socket() as s:  # a free port for jax.distributed's coordinator
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(f"{root}/port", "w") as f:
        f.write(str(port))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, __file__, "--job", str(p), root], env=env) for p in range(2)]
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0, 0], f"job processes exited with {codes}"
    shutil.rmtree(f"{root}/node1")  # node 1 is lost, and its /dev/shm with it
    subprocess.run([sys.executable, __file__, "--resume", root], env=env, check=True, timeout=300)
    print("manager jax example OK")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--job":
        job(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--resume":
        resume(sys.argv[2])
    elif len(sys.argv) > 1:
        os.makedirs(sys.argv[1], exist_ok=True)
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
