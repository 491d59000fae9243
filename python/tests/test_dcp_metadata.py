"""The restricted reader of DCP .metadata pickles (distckpt._dcp_metadata) and import_torch_dcp's use of it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import distckpt
from distckpt import _dcp_metadata

REGRESSIONS = Path(__file__).resolve().parents[2] / "tests" / "fuzz" / "regressions" / "dcp_metadata"

try:
    import torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


class _RunsCommand:
    """Pickles as a call of os.system (posix.system on Linux): what a hostile .metadata does."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _hostile(tmp_path: Path, protocol: int) -> Path:
    marker = tmp_path / "ran"
    dcp_dir = tmp_path / "dcp"
    dcp_dir.mkdir()
    (dcp_dir / ".metadata").write_bytes(pickle.dumps(_RunsCommand(f"touch {marker}"), protocol=protocol))
    return dcp_dir


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_hostile_metadata_is_refused_and_runs_nothing(tmp_path, protocol):
    dcp_dir = _hostile(tmp_path, protocol)
    data = (dcp_dir / ".metadata").read_bytes()
    assert b"system" in data
    with pytest.raises(distckpt.errors.UnsafePickleError, match=r"posix\.system") as e:
        _dcp_metadata.parse(data, str(dcp_dir / ".metadata"))
    assert str(dcp_dir / ".metadata") in str(e.value)
    assert isinstance(e.value, distckpt.CorruptCheckpointError)
    # import_torch_dcp refuses it before importing torch: the same error with or without torch installed.
    with pytest.raises(distckpt.errors.UnsafePickleError, match=r"posix\.system"):
        distckpt.import_torch_dcp(dcp_dir, tmp_path / "out")
    assert not (tmp_path / "ran").exists()
    assert not (tmp_path / "out").exists()


def test_a_hostile_metadata_hidden_inside_a_valid_one_is_refused(tmp_path):
    # A DCP metadata pickle written by torch, one of whose file names is replaced by a call of os.system.
    data = (REGRESSIONS / "sharded-4-ranks-proto2.metadata").read_bytes()
    evil = pickle.dumps(_RunsCommand(f"touch {tmp_path / 'ran'}"), protocol=2)[2:-1]  # no PROTO, no STOP
    name = b"X\x0c\x00\x00\x00__0_0.distcp"  # BINUNICODE '__0_0.distcp'
    assert name in data
    with pytest.raises(distckpt.errors.UnsafePickleError, match=r"posix\.system"):
        _dcp_metadata.parse(data.replace(name, evil, 1), "x/.metadata")
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("name", ["torch-2.15-save.metadata", "sharded-4-ranks-proto2.metadata",
                                  "sharded-4-ranks-proto5.metadata"])  # fmt: skip
def test_metadata_written_by_torch_parses_without_torch(name):
    meta = _dcp_metadata.parse((REGRESSIONS / name).read_bytes(), name)
    if name.startswith("sharded"):
        w = meta.entries["layer.w"]
        assert w.dtype == "float16" and w.size == (8, 6) and len(w.chunks) == 4
        assert w.chunks[3].offsets == (6, 0) and w.chunks[3].sizes == (2, 6)
        assert meta.entries["opt.step"] is None
        assert meta.planner_data["layer.w"] == ("layer", "w")
        assert sorted(s.relative_path for s in meta.storage if s.fqn == "layer.w") == [
            f"__{r}_0.distcp" for r in range(4)
        ]
    else:
        assert meta.entries["model.w"].size == (4, 3) and meta.entries["model.b"].dtype == "bfloat16"
        assert meta.entries["model.n"].size == () and meta.entries["step"] is None


@pytest.mark.parametrize(
    "data,match",
    [
        (b"", "not a valid pickle"),
        (b"\x80\x04\x95\xff\xff\xff\xff\x00\x00\x00\x00N.", "frame"),
        (b"\x80\x04N\x94r\xff\xff\xff\x7f.", "memo index"),  # LONG_BINPUT 2^31-1: a huge memo table
        (b"\x80\x05\x8e\xff\xff\xff\xff\xff\xff\xff\x7f.", "not a valid pickle"),  # BINBYTES8 of 2^63-1 bytes
        (b"\x80\x04}\x94.", "not a Metadata"),
        (b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.", "builtins.eval"),
        (b"\x80\x04\x8c\x05torch\x8c\x04load\x93.", "torch.load"),
        (b"\x80\x02X\x01\x00\x00\x00ab\x00\x00\x00.", "not a valid pickle"),
        (b"\x80\x04(\x8c\x05torch\x8c\x07float32\x93}b.", "changes the state"),
    ],
)
def test_malformed_metadata_is_a_corrupt_checkpoint(data, match):
    with pytest.raises(distckpt.CorruptCheckpointError, match=match):
        _dcp_metadata.parse(data, "bad/.metadata")


@pytest.mark.skipif(not HAVE_TORCH, reason="torch with torch.distributed is not installed")
def test_metadata_from_a_real_dcp_save_parses_and_converts(tmp_path):
    writer = (
        "import sys, warnings, torch, torch.distributed.checkpoint as dcp\n"
        "warnings.simplefilter('ignore')\n"
        "dcp.save({'m': {'w': torch.ones(5, 2), 'h': torch.zeros(3, dtype=torch.float16)}, 'step': 3,"
        " 'cfg': {'lr': 0.1}}, checkpoint_id=sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", writer, str(tmp_path / "dcp")], check=True, timeout=300)
    data = (tmp_path / "dcp" / ".metadata").read_bytes()
    meta = _dcp_metadata.parse(data, "x")
    assert meta.entries["m.w"].size == (5, 2) and meta.entries["m.h"].dtype == "float16"
    assert meta.entries["step"] is None and meta.planner_data["m.w"] == ("m", "w")
    real = _dcp_metadata.to_torch(data, "x")
    assert type(real).__name__ == "Metadata" and tuple(real.state_dict_metadata["m.w"].size) == (5, 2)
    distckpt.import_torch_dcp(tmp_path / "dcp", tmp_path / "c")
    out = distckpt.load(None, tmp_path / "c")
    assert out["m"]["w"].tolist() == [[1.0, 1.0]] * 5 and out["step"] == 3 and out["cfg"] == {"lr": 0.1}
