"""One checkpoint, many frameworks: an FSDP2 torch model saved on 2 ranks restored into a JAX pytree with another
sharding and other names; a sharded JAX pytree loaded into a torch module; and the C++-written fixture checkpoint
(tests/fixtures/mlp, written through the C ABI) run as a torch module (through DCP) and as a JAX function. Names map
through load's ``rename`` hook (distckpt.interop.rename_rules); dtype checks and layouts (transposes) are the
caller's, after the load."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'jax[cpu]')")
pytest.importorskip("torch.distributed.fsdp", reason="this torch has no FSDP2")

import jax.numpy as jnp  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import _dcp_workers  # noqa: E402
import distckpt  # noqa: E402
import distckpt.jax  # noqa: E402
import distckpt.torch  # noqa: E402
from distckpt.interop import rename_rules  # noqa: E402
from test_multiprocess import run_ranks  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "mlp")

# torch nn.Sequential (Linear at 0, 2, 4, 6) <-> a Flax-style pytree (params.Dense_0 .. Dense_3).
TORCH_TO_FLAX = rename_rules([(r"model\.(\d+)\.weight", r"params.Dense_\1.kernel"),
                              (r"model\.(\d+)\.bias", r"params.Dense_\1.bias")])  # fmt: skip
LINEARS = (0, 2, 4, 6)


def _flax_to_torch(name: str) -> str:
    prefix, layer, leaf = name.split(".")
    index = LINEARS[int(layer.split("_")[1])]
    return f"model.{index}.{'weight' if leaf == 'kernel' else 'bias'}"


def _mesh(shape):
    devices = np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    return Mesh(devices, ("x", "y")[: len(shape)])


def test_fsdp2_torch_checkpoint_restores_into_a_jax_pytree_with_other_names_and_sharding(tmp_path):
    path, expected = tmp_path / "ckpt", tmp_path / "expected.pt"
    run_ranks(_dcp_workers.save_fsdp_rank, 2, f"file://{tmp_path}/rdv", str(path), str(tmp_path / "async"),
              str(expected))  # fmt: skip
    full = torch.load(expected, weights_only=False)["model"]  # "0.weight", ... (the model's own names)
    mesh = _mesh((2, 2))
    target = {"params": {}}
    for i, layer in enumerate(LINEARS):
        w = full[f"{layer}.weight"]
        sds = jax.ShapeDtypeStruct(tuple(w.shape), jnp.float32, sharding=NamedSharding(mesh, P(None, ("x", "y"))))
        target["params"][f"Dense_{i}"] = {"kernel": sds}  # stored layout (out, in); transposed below
        if f"{layer}.bias" in full:
            b = full[f"{layer}.bias"]
            target["params"][f"Dense_{i}"]["bias"] = jax.ShapeDtypeStruct(
                tuple(b.shape), jnp.bfloat16, sharding=NamedSharding(mesh, P("x"))
            )  # another dtype: converted
    out = distckpt.jax.restore(path, target, rename=_flax_to_torch)
    for i, layer in enumerate(LINEARS):
        kernel = out["params"][f"Dense_{i}"]["kernel"].T  # Flax layout (in, out), done by the caller
        assert out["params"][f"Dense_{i}"]["kernel"].sharding == target["params"][f"Dense_{i}"]["kernel"].sharding
        np.testing.assert_array_equal(np.asarray(kernel), full[f"{layer}.weight"].numpy().T)
        if f"{layer}.bias" in full:
            bias = out["params"][f"Dense_{i}"]["bias"]
            assert bias.dtype == jnp.bfloat16
            np.testing.assert_array_equal(np.asarray(bias.astype(jnp.float32)),
                                          full[f"{layer}.bias"].to(torch.bfloat16).float().numpy())  # fmt: skip


def test_sharded_jax_pytree_loads_into_a_torch_module(tmp_path):
    mesh = _mesh((2, 2))
    rng = np.random.default_rng(0)
    shapes = {0: (16, 24), 2: (24, 24), 4: (24, 24), 6: (24, 5)}  # Flax kernels: (in, out)
    params = {}
    for i, layer in enumerate(LINEARS):
        k = rng.standard_normal(shapes[layer]).astype(np.float32)
        params[f"Dense_{i}"] = {"kernel": jax.device_put(k, NamedSharding(mesh, P(("x", "y"), None)))}
        if layer != 6:
            b = rng.standard_normal(shapes[layer][1]).astype(np.float32)
            params[f"Dense_{i}"]["bias"] = jax.device_put(b, NamedSharding(mesh, P("y")))
    distckpt.save({"params": params, "step": 11}, tmp_path / "jax")

    model = _dcp_workers._model(seed=5)
    staged = {k: torch.empty(tuple(reversed(v.shape)) if k.endswith("weight") else v.shape)
              for k, v in model.state_dict().items()}  # fmt: skip
    state = {"model": staged, "step": 0}
    distckpt.load(state, tmp_path / "jax", rename=_torch_to_flax)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            p.copy_(staged[name].T if name.endswith("weight") else staged[name])  # the layout change: the caller's
    assert state["step"] == 11
    for i, layer in enumerate(LINEARS):
        np.testing.assert_array_equal(model.state_dict()[f"{layer}.weight"].numpy(),
                                      np.asarray(params[f"Dense_{i}"]["kernel"]).T)  # fmt: skip
        if layer != 6:
            np.testing.assert_array_equal(model.state_dict()[f"{layer}.bias"].numpy(),
                                          np.asarray(params[f"Dense_{i}"]["bias"]))  # fmt: skip


def _torch_to_flax(name: str) -> str:
    if name == "step":
        return name
    _, layer, leaf = name.split(".")
    return f"params.Dense_{LINEARS.index(int(layer))}.{'kernel' if leaf == 'weight' else 'bias'}"


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_cpp_written_checkpoint_runs_in_torch_through_dcp_and_in_jax():
    with distckpt.open(FIXTURE) as r:
        assert r.metadata.user["framework"]  # written through the C ABI by tests/fixtures/make_fixtures.cc
        x = r.read("input")
        reference = r.read("reference.output")  # computed in double by the C++ writer
    # torch: the module's own names match the checkpoint's; DCP's load planner, distckpt's reader.
    model = _Mlp()
    sd = model.state_dict()
    dcp.load(sd, storage_reader=distckpt.torch.StorageReader(FIXTURE))
    model.load_state_dict(sd)
    with torch.no_grad():
        y = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, reference, rtol=1e-5, atol=1e-5)
    # JAX: Flax-style names through rename_rules, weights sharded over 2 devices.
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    target = {"params": {f"Dense_{i}": {
        "kernel": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P("x", None))),
        "bias": jax.ShapeDtypeStruct(shape[:1], jnp.float32, sharding=NamedSharding(mesh, P()))}
        for i, shape in ((0, (64, 32)), (1, (10, 64)))}}  # fmt: skip
    rename = rename_rules(
        [
            (r"params\.Dense_0\.kernel", "fc1.weight"),
            (r"params\.Dense_0\.bias", "fc1.bias"),
            (r"params\.Dense_1\.kernel", "fc2.weight"),
            (r"params\.Dense_1\.bias", "fc2.bias"),
        ]
    )
    out = distckpt.jax.restore(FIXTURE, target, rename=rename)
    p = out["params"]
    h = jnp.maximum(jnp.asarray(x) @ p["Dense_0"]["kernel"].T + p["Dense_0"]["bias"], 0)
    y = h @ p["Dense_1"]["kernel"].T + p["Dense_1"]["bias"]
    np.testing.assert_allclose(np.asarray(y), reference, rtol=1e-5, atol=1e-5)


def test_rename_errors_name_both_sides(tmp_path):
    distckpt.save({"a": np.zeros(3), "b": np.ones(3)}, tmp_path / "c")
    with pytest.raises(distckpt.NotFoundError, match="'z'.*after rename"):
        distckpt.load({"x": np.empty(3)}, tmp_path / "c", rename=lambda n: "z")
    with pytest.raises(distckpt.InvalidArgumentError, match="both 'x' and 'y'"):
        distckpt.load({"x": np.empty(3), "y": np.empty(3)}, tmp_path / "c", rename=lambda n: "a")
    with pytest.raises(distckpt.InvalidArgumentError, match="no rule matches the name 'x'"):
        distckpt.load({"x": np.empty(3)}, tmp_path / "c", rename=rename_rules([("q", "a")]))
    out = {"b": np.empty(3), "x": np.empty(3)}
    distckpt.load(out, tmp_path / "c", rename=rename_rules([("x", "a")], strict=False))  # "b" kept as it is
    np.testing.assert_array_equal(out["b"], np.ones(3))
    np.testing.assert_array_equal(out["x"], np.zeros(3))
