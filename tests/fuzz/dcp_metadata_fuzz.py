"""Fuzz target (atheris) for the restricted reader of DCP .metadata pickles, distckpt._dcp_metadata.parse.

Run by scripts/fuzz.sh; python/tests/test_fuzz_regressions.py replays tests/fuzz/regressions/dcp_metadata/ (which
also holds .metadata files written by torch, the seeds). Needs no torch. Properties: on any bytes, parse either raises
a distckpt error or returns a DcpMetadata whose fields have the documented types and ranges; it never resolves a
global outside its allow-list, so it never runs code from the file (any global it meets is either a stand-in of its
own or refused); anything else (an exception of another type, a huge allocation, a hang) is a finding.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

dm = _harness.module("_dcp_metadata")
errors = _harness.module("errors")


def _index_tuple(x: object) -> bool:
    return isinstance(x, tuple) and all(type(d) is int and 0 <= d < 2**63 for d in x)


def TestOneInput(data: bytes) -> None:  # noqa: N802 - atheris' name
    try:
        meta = dm.parse(data, "fuzz/.metadata")
    except errors.Error:
        return
    assert isinstance(meta, dm.DcpMetadata)
    for fqn, t in meta.entries.items():
        assert isinstance(fqn, str)
        if t is None:
            continue
        assert isinstance(t, dm.DcpTensor) and t.dtype in dm.TORCH_DTYPES and _index_tuple(t.size)
        for c in t.chunks:
            assert _index_tuple(c.offsets) and _index_tuple(c.sizes)
            assert len(c.offsets) == len(c.sizes) == len(t.size)
            assert all(o + n <= s for o, n, s in zip(c.offsets, c.sizes, t.size))
    for fqn, keys in meta.planner_data.items():
        assert isinstance(fqn, str) and isinstance(keys, tuple)
        assert all(isinstance(k, str) or type(k) is int for k in keys)
    for s in meta.storage:
        assert s.fqn in meta.entries
        assert s.relative_path and "/" not in s.relative_path and s.relative_path not in (".", "..")
        assert type(s.file_offset) is int and type(s.length) is int and s.file_offset >= 0 and s.length >= 0
        assert s.offset is None or _index_tuple(s.offset)


def make_seeds() -> Dict[str, bytes]:
    """The .metadata files in the regression directory, written by torch.distributed.checkpoint."""
    d = _harness.ROOT / "tests" / "fuzz" / "regressions" / "dcp_metadata"
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.metadata"))}


if __name__ == "__main__":
    _harness.main(TestOneInput, make_seeds)
