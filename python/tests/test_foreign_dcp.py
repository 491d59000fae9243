"""PyTorch DCP checkpoints, written here by the real torch.distributed.checkpoint (FSDP2 + Adam on 2 and 3 ranks),
read in place by the core (docs/foreign.md): every tensor equal to torch's own dcp.load, resharded loads on another
number of ranks, bytes items as DCP wrote them, and hostile .metadata pickles refused without running anything."""

from __future__ import annotations

import os
import pickle

import pytest

import _foreign_workers
import _workers
import distckpt

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

DEADLINE = 240


def _spawn(fn, world, *args):
    _workers.spawn(_workers.run_then_exit, world, lambda rank, results: (fn, rank, (world, *args), results), DEADLINE)


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def dcp_dir(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"dcp{request.param}")
    _spawn(_foreign_workers.dcp_save_rank, request.param, str(d / "store"), str(d / "ckpt"))
    return d / "ckpt"


def _torch_full_load(path):
    """Every tensor of the checkpoint as torch's own dcp.load assembles it (one process, no process group)."""
    meta = dcp.FileSystemReader(str(path)).read_metadata()
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    state = {
        fqn: torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for fqn, m in meta.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata)
    }
    dcp.load(state, checkpoint_id=str(path))
    return state


def test_every_tensor_equals_torchs_own_load(dcp_dir):
    want = _torch_full_load(dcp_dir)
    with distckpt.open(dcp_dir) as r:
        assert r.metadata.format == "torch-dcp" and not r.metadata.checksummed
        tensors = [n for n, e in r.metadata.items() if e.kind == "tensor"]
        assert set(tensors) == set(want)
        for name, t in want.items():
            got = r.read(name)
            assert got.shape == tuple(t.shape), name
            assert got.tobytes() == t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), name
        # Bytes items are the blobs DCP wrote (torch.save pickles): distckpt never unpickles them.
        blob = r.read_bytes("note")
        import io

        assert torch.load(io.BytesIO(blob), weights_only=True).endswith("ranks")
        with pytest.raises(distckpt.UnsupportedError, match="PyTorch DCP checkpoint.*no checksums"):
            r.verify()


def test_another_number_of_ranks_loads_row_shards(dcp_dir, tmp_path):
    want = _torch_full_load(dcp_dir)
    torch.save(want, tmp_path / "expected.pt")
    world = 3 if "dcp2" in str(dcp_dir) else 2
    _spawn(_foreign_workers.dcp_load_rank, world, f"file://{tmp_path}/rdv", str(dcp_dir), str(tmp_path / "expected.pt"))


def test_a_hostile_metadata_pickle_is_refused_without_running(dcp_dir, tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "bad"
    bad.mkdir()
    for f in os.listdir(dcp_dir):
        if f != ".metadata":
            os.link(dcp_dir / f, bad / f)
    (bad / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(distckpt.CorruptCheckpointError, match=r"\.metadata.*system"):
        distckpt.open(bad)
    assert not marker.exists()


FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "dcp")


@pytest.mark.parametrize("name", ["torch24_dtensor_2ranks", "dtensor_2ranks", "single_dtensor"])
def test_committed_fixtures_of_other_torch_versions_read_in_place(name, tmp_path):
    """tests/fixtures/dcp: checkpoints written by torch 2.4.1 (an older layout) and 2.15, against today's torch load."""
    path = os.path.join(FIXTURES, name)
    want = _torch_full_load(path)
    with distckpt.open(path) as r:
        assert r.metadata.format == "torch-dcp"
        # The .metadata's own version (issue 38); torch 2.4 wrote none.
        assert r.metadata.source_version == (None if name.startswith("torch24") else "1.0.0")
        for fqn, t in want.items():
            got = r.read(fqn)
            assert got.tobytes() == t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), fqn
