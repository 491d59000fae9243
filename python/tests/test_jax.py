"""JAX: sharded arrays over several (CPU) devices saved shard by shard and restored with another sharding."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (optional: pip install 'jax[cpu]')")

import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import distckpt  # noqa: E402
import distckpt.jax  # noqa: E402

pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 JAX devices (XLA_FLAGS host device count)")


def mesh(shape, names):
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


def test_sharded_arrays_restore_with_another_sharding(ckpt):
    m4 = mesh((4,), ("x",))
    full = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    rows = jax.device_put(full, NamedSharding(m4, P("x", None)))
    rep = jax.device_put(jnp.ones(6, jnp.bfloat16), NamedSharding(m4, P()))
    distckpt.save({"params": {"w": rows, "b": rep}, "step": jnp.int32(3)}, ckpt)
    with distckpt.open(ckpt) as r:
        assert [c.offsets for c in r.metadata["params.w"].chunks] == [(0, 0), (2, 0), (4, 0), (6, 0)]
        assert len(r.metadata["params.b"].chunks) == 1  # replicated on 4 devices, written once
        assert r.metadata["params.b"].dtype == "BF16"

    m22 = mesh((2, 2), ("a", "b"))
    cols = NamedSharding(m22, P("b", "a"))
    target = {
        "params": {
            "w": jax.ShapeDtypeStruct((8, 6), jnp.float32, sharding=cols),
            "b": jax.device_put(jnp.zeros(6, jnp.float32), NamedSharding(m22, P("a"))),  # converted from BF16
        },
        "step": None,
    }
    out = distckpt.jax.restore(ckpt, target)
    w, b = out["params"]["w"], out["params"]["b"]
    assert isinstance(w, jax.Array) and w.sharding == cols
    np.testing.assert_array_equal(np.asarray(w), full)
    assert b.dtype == jnp.float32 and b.sharding == NamedSharding(m22, P("a"))
    np.testing.assert_array_equal(np.asarray(b), np.ones(6))
    assert int(out["step"]) == 3


def test_load_array_reads_each_devices_box(ckpt):
    full = np.arange(16 * 4, dtype=np.int32).reshape(16, 4)
    distckpt.save({"w": full}, ckpt, checksum_block_size=4096)
    sharding = NamedSharding(mesh((4,), ("x",)), P("x"))
    with distckpt.open(ckpt) as r:
        a = distckpt.jax.load_array(r, "w", sharding, dtype=jnp.float32)
        assert r.io_stats.bytes_delivered == full.nbytes  # each box once
    assert a.sharding == sharding and a.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(a), full.astype(np.float32))
    for s in a.addressable_shards:
        np.testing.assert_array_equal(np.asarray(s.data), full[s.index].astype(np.float32))


def test_to_shards_skips_replicas():
    m22 = mesh((2, 2), ("a", "b"))
    x = jax.device_put(np.arange(12.0).reshape(4, 3), NamedSharding(m22, P("a")))  # replicated over "b"
    shards = distckpt.jax.to_shards(x)
    assert sorted(s.offsets for s in shards) == [(0, 0), (2, 0)]
    assert all(s.global_shape == (4, 3) for s in shards)


def test_single_device_array_and_load_none(ckpt):
    distckpt.save({"x": jnp.arange(5), "y": jnp.float32(2.5)}, ckpt)
    out = distckpt.load(None, ckpt)
    np.testing.assert_array_equal(out["x"], np.arange(5))
    assert out["y"] == 2.5
