"""distckpt as torch.distributed.checkpoint's storage layer (distckpt.torch.StorageWriter / StorageReader), with the
real torch: FSDP2 models on CPU ranks over gloo, saved on 3 ranks and loaded on 2 with every value checked; async
save; the result an ordinary distckpt checkpoint; and DCP loading checkpoints distckpt wrote by itself."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="this torch has no torch.distributed.checkpoint")
pytest.importorskip("torch.distributed.fsdp", reason="this torch has no FSDP2")

import _dcp_workers  # noqa: E402
import distckpt  # noqa: E402
import distckpt.torch  # noqa: E402
from test_multiprocess import run_ranks  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP warns when torch.distributed is not set up


def _flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, name + "."))
        else:
            out[name] = v
    return out


def test_fsdp2_saved_on_three_ranks_loads_on_two(tmp_path):
    path, async_path, expected = tmp_path / "ckpt", tmp_path / "ckpt_async", tmp_path / "expected.pt"
    run_ranks(_dcp_workers.save_fsdp_rank, 3, f"file://{tmp_path}/rdv_save", str(path), str(async_path),
              str(expected))  # fmt: skip
    run_ranks(_dcp_workers.load_fsdp_rank, 2, f"file://{tmp_path}/rdv_load", str(path), str(expected))
    run_ranks(_dcp_workers.load_fsdp_rank, 1, f"file://{tmp_path}/rdv_load1", str(async_path), str(expected))
    # An ordinary distckpt checkpoint: checksums verify, and distckpt alone reads the nested state.
    ex = torch.load(expected, weights_only=False)
    with distckpt.open(path) as r:
        r.verify()
        assert len(r.metadata["model.0.weight"].chunks) == 3  # one row block per saving rank
    out = distckpt.load(None, path)
    assert out["step"] == 2 and out["note"] == "fsdp2"
    with distckpt.open(path) as r:
        assert r.user_metadata["step"] == "2"  # whichever rank DCP gave "step" to
    for name, value in _flat(ex["model"]).items():
        np.testing.assert_array_equal(_flat(out["model"])[name], value.numpy(), err_msg=name)


def test_single_process_module_optimizer_and_objects(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).sum().backward()
    optim.step()
    sd = {"model": model.state_dict(), "optim": optim.state_dict(), "step": 7, "extra": [1, 2.5, {"a": "x"}]}
    dcp.save(sd, storage_writer=distckpt.torch.StorageWriter(tmp_path / "ck"))

    torch.manual_seed(1)
    model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optim2 = torch.optim.Adam(model2.parameters(), lr=5.0)
    model2(torch.randn(3, 8)).sum().backward()
    optim2.step()
    sd2 = {"model": model2.state_dict(), "optim": optim2.state_dict(), "step": 0, "extra": [0, 0.0, {"a": ""}]}
    dcp.load(sd2, storage_reader=distckpt.torch.StorageReader(tmp_path / "ck"))
    model2.load_state_dict(sd2["model"])
    optim2.load_state_dict(sd2["optim"])
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    for k, state in optim.state_dict()["state"].items():
        for kk, v in state.items():
            assert torch.equal(v, optim2.state_dict()["state"][k][kk]), (k, kk)
    assert optim2.param_groups[0]["lr"] == 1e-3 and optim2.param_groups[0]["betas"] == (0.9, 0.999)
    assert sd2["step"] == 7 and sd2["extra"] == [1, 2.5, {"a": "x"}]
    # The objects are JSON in the checkpoint: readable without Python, no pickle.
    with distckpt.open(tmp_path / "ck") as r:
        assert r["optim.param_groups.0.lr"] == 1e-3 and r["extra.2.a"] == "x"
        assert r.user_metadata["step"] == "7"  # top-level scalars are user metadata, as distckpt.save records them


def test_dcp_loads_what_distckpt_saved_with_other_dtypes_and_resharding(tmp_path):
    # A checkpoint written by distckpt.save (as JAX, C++, Rust or Go would write one) read through DCP: regions of a
    # tensor saved as row shards, converted to the target's dtype, into a non-contiguous target.
    w = np.arange(12 * 10, dtype=np.float32).reshape(12, 10)
    state = {"layer": {"w": [distckpt.Shard(w[:5], w.shape, (0, 0)), distckpt.Shard(w[5:], w.shape, (5, 0))],
                       "b": np.linspace(0, 1, 7)},
             "epoch": 3}  # fmt: skip
    distckpt.save(state, tmp_path / "ck")
    target_w = torch.zeros(10, 12).t()  # non-contiguous
    target = {"layer": {"w": target_w, "b": torch.zeros(7, dtype=torch.float16)}, "epoch": 0}
    dcp.load(target, storage_reader=distckpt.torch.StorageReader(tmp_path / "ck"))
    assert torch.equal(target_w, torch.from_numpy(w))
    assert torch.equal(target["layer"]["b"], torch.from_numpy(np.linspace(0, 1, 7)).half())
    assert target["epoch"] == 3


def test_overwrite_checkpoint_id_and_errors(tmp_path):
    sd = {"w": torch.arange(10.0)}
    writer = distckpt.torch.StorageWriter()
    dcp.save(sd, checkpoint_id=tmp_path / "a", storage_writer=writer)
    assert writer.summary is not None and writer.summary.num_entries == 1
    sd["w"] += 1
    dcp.save(sd, checkpoint_id=tmp_path / "a", storage_writer=distckpt.torch.StorageWriter())  # DCP overwrites
    out = {"w": torch.zeros(10)}
    dcp.load(out, checkpoint_id=tmp_path / "a", storage_reader=distckpt.torch.StorageReader())
    assert torch.equal(out["w"], torch.arange(10.0) + 1)
    # DCP reports a rank's error as a CheckpointException (a BaseException) carrying its text.
    with pytest.raises(CheckpointException, match="already exists"):
        dcp.save(sd, storage_writer=distckpt.torch.StorageWriter(tmp_path / "a", overwrite=False))
    # A damaged checkpoint: DCP's load fails with distckpt's error naming the entry and file.
    (data,) = (tmp_path / "a").glob("data-*.bin")
    raw = bytearray(data.read_bytes())
    raw[8] ^= 0x40
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointException, match="checksum|corrupt") as info:
        dcp.load(out, storage_reader=distckpt.torch.StorageReader(tmp_path / "a"))
    assert "'w'" in str(info.value) and "data-" in str(info.value)
    with pytest.raises(CheckpointException, match="missing. does not exist"):  # no checkpoint at all
        dcp.load(out, storage_reader=distckpt.torch.StorageReader(tmp_path / "missing"))


def test_an_incremental_writer_writes_only_what_changed(tmp_path):
    # The training loop is DCP's own; only the writer changes.
    frozen = torch.randn(256, 256)
    writer = distckpt.torch.StorageWriter(incremental=True)
    for step in (100, 200, 300):
        sd = {"frozen": frozen, "head": torch.full((64,), float(step))}
        dcp.save(sd, checkpoint_id=tmp_path / f"step-{step}", storage_writer=writer)
        assert writer.summary.bytes_reused == (0 if step == 100 else frozen.numel() * 4), writer.summary
    with distckpt.open(tmp_path / "step-300") as r:
        assert r.metadata.bases == ("step-100",)
    out = {"frozen": torch.zeros(256, 256), "head": torch.zeros(64)}
    dcp.load(out, checkpoint_id=tmp_path / "step-300", storage_reader=distckpt.torch.StorageReader())
    assert torch.equal(out["frozen"], frozen) and torch.equal(out["head"], torch.full((64,), 300.0))


def test_a_compressing_writer_stores_smaller_and_dcp_loads_it_back(tmp_path):
    sd = {"w": (torch.randn(512, 512) * 0.02).to(torch.bfloat16), "step": torch.tensor(7)}
    writer = distckpt.torch.StorageWriter(compression="zstd")
    dcp.save(sd, checkpoint_id=tmp_path / "c", storage_writer=writer)
    assert writer.summary.bytes_written < 0.8 * writer.summary.total_bytes, writer.summary
    with distckpt.open(tmp_path / "c") as r:
        assert r.metadata.format_version == (3, 0)
    out = {"w": torch.zeros(512, 512, dtype=torch.bfloat16), "step": torch.tensor(0)}
    dcp.load(out, checkpoint_id=tmp_path / "c", storage_reader=distckpt.torch.StorageReader())
    assert torch.equal(out["w"], sd["w"]) and int(out["step"]) == 7
    with pytest.raises(ValueError, match="compression='gzip'"):
        distckpt.torch.StorageWriter(compression="gzip")
