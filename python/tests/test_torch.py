"""torch: tensors of every dtype, modules and optimizers, DTensors over a real gloo process group with
distckpt.comm.from_torch, and importing a checkpoint written by torch.distributed.checkpoint.save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (optional: pip install torch)")

import _workers  # noqa: E402
import distckpt  # noqa: E402
import distckpt.torch  # noqa: E402
from test_multiprocess import run_ranks  # noqa: E402

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]
DTYPES += [d for d in (getattr(torch, "uint16", None), getattr(torch, "uint32", None), getattr(torch, "uint64", None))
           if d is not None]  # fmt: skip


def make(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape + (torch.empty(0, dtype=dtype).element_size(),), dtype=torch.uint8,
                         generator=g).view(dtype).reshape(shape)  # fmt: skip


def as_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_torch_dtype_round_trips(ckpt, dtype):
    state = {"s": make(dtype, ()), "m": make(dtype, (3, 4), 1), "e": make(dtype, (0, 2), 2)}
    distckpt.save(state, ckpt)
    targets = {k: torch.zeros_like(v) for k, v in state.items()}
    ptrs = {k: v.data_ptr() for k, v in targets.items()}
    distckpt.load(targets, ckpt)
    for k, v in state.items():
        assert targets[k].data_ptr() == ptrs[k]  # filled in place
        assert as_bytes(targets[k]) == as_bytes(v), k


def test_strided_converted_and_grad_targets(ckpt):
    w = torch.randn(6, 4)
    distckpt.save({"a": w, "b": w, "c": w.t()}, ckpt)  # a transposed (non-contiguous) source is copied once
    wide = torch.zeros(4, 12)[:, ::2].t()  # non-contiguous target
    f16 = torch.zeros(6, 4, dtype=torch.float16)  # other dtype
    param = torch.nn.Parameter(torch.zeros(4, 6))
    distckpt.load({"a": wide, "b": f16, "c": param}, ckpt)
    assert torch.equal(wide, w) and torch.equal(f16, w.half()) and torch.equal(param.detach(), w.t())
    np.testing.assert_array_equal(distckpt.load(None, ckpt)["c"], w.t().numpy())


def test_module_and_optimizer_are_saved_through_state_dict(ckpt):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.95))
    model(torch.randn(5, 4)).sum().backward()
    optim.step()
    distckpt.save({"model": model, "optim": optim, "epoch": 3}, ckpt)

    model2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optim2 = torch.optim.AdamW(model2.parameters(), lr=1.0)
    for p in model2.parameters():  # the optimizer's state must exist to be filled, as with DCP
        p.grad = torch.zeros_like(p)
    optim2.step()
    state = {"model": model2, "optim": optim2, "epoch": 0}
    distckpt.load(state, ckpt)
    assert state["epoch"] == 3
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    s1, s2 = optim.state_dict(), optim2.state_dict()
    assert s2["param_groups"][0]["betas"] == (0.8, 0.95) and s2["param_groups"][0]["lr"] == 1e-3
    for k in s1["state"]:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s1["state"][k][name], s2["state"][k][name])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors(ckpt):
    t = torch.randn(64, 32, device="cuda")
    distckpt.save({"t": t}, ckpt)
    target = torch.zeros_like(t)
    distckpt.load({"t": target}, ckpt)
    assert target.is_cuda and torch.equal(target, t)


def test_dtensors_over_a_gloo_process_group_with_from_torch(tmp_path):
    run_ranks(_workers.torch_rank, 2, str(tmp_path / "pg_init"), str(tmp_path / "ckpt"))
    out = distckpt.load(None, tmp_path / "ckpt")
    np.testing.assert_array_equal(out["rows"], np.arange(70, dtype=np.float32).reshape(10, 7))
    with distckpt.open(tmp_path / "ckpt") as r:
        assert len(r.metadata["rows"].chunks) == 2 and len(r.metadata["replicated"].chunks) == 1


def test_async_save_over_from_torch_runs_beside_training_collectives(tmp_path):
    run_ranks(_workers.torch_async_rank, 2, str(tmp_path / "pg_init"), str(tmp_path / "ckpt"))
    for step in (1, 2):
        out = distckpt.load(None, f"{tmp_path / 'ckpt'}-{step}")
        want = np.concatenate([np.full((4, 8), r + 10 * step, np.float32) for r in range(2)])
        np.testing.assert_array_equal(out["w"], want)
        assert out["step"] == step


DCP_WRITER = """
import sys, warnings
import torch, torch.distributed.checkpoint as dcp
warnings.simplefilter("ignore")
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
state = {"model": model.state_dict(), "extra": {"step": 41, "history": [0.5, 0.25], "name": "run"},
         "bf": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "layers": [torch.ones(2), torch.zeros(3)]}
dcp.save(state, checkpoint_id=sys.argv[1])
torch.save(state, sys.argv[1] + ".pt")
"""


def test_import_a_checkpoint_written_by_torch_distributed_checkpoint(tmp_path):
    dcp_dir = tmp_path / "dcp"
    subprocess.run([sys.executable, "-c", DCP_WRITER, str(dcp_dir)], check=True, timeout=300)
    expected = torch.load(str(dcp_dir) + ".pt", weights_only=True)
    summary = distckpt.import_torch_dcp(dcp_dir, tmp_path / "c")
    assert summary.num_entries > 0
    out = distckpt.load(None, tmp_path / "c")
    np.testing.assert_array_equal(out["model"]["weight"], expected["model"]["weight"].numpy())
    np.testing.assert_array_equal(out["model"]["bias"], expected["model"]["bias"].numpy())
    assert out["extra"] == {"step": 41, "history": [0.5, 0.25], "name": "run"}
    assert as_bytes(torch.from_numpy(out["bf"].view(np.int16))) == as_bytes(expected["bf"])
    assert [x.tolist() for x in out["layers"]] == [[1.0, 1.0], [0.0, 0.0, 0.0]]
    with distckpt.open(tmp_path / "c") as r:
        assert r.user_metadata["converted_from"] == "torch.distributed.checkpoint"
        assert "model.weight" in r and r.metadata["bf"].dtype == "BF16"
    # The same through the command line.
    res = subprocess.run([sys.executable, "-m", "distckpt", "import-dcp", str(dcp_dir), str(tmp_path / "c2")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "c2")["model"]["weight"],
                                  expected["model"]["weight"].numpy())  # fmt: skip


def test_import_dcp_refuses_a_directory_without_metadata(tmp_path):
    os.makedirs(tmp_path / "empty")
    with pytest.raises(distckpt.NotFoundError, match=".metadata"):
        distckpt.import_torch_dcp(tmp_path / "empty", tmp_path / "c")


def test_a_program_whose_last_collective_is_distckpts_exits_cleanly(tmp_path):
    """torch's gloo thread drops a collective's tensors after the call returns; once the Python objects were gone,
    it freed them itself, taking the GIL during interpreter shutdown, and the process aborted ("terminate called
    without an active exception"; 4 of 20 two-rank saves on this machine). distckpt now holds them until torch lets
    go (distckpt._tensor_keeper). 15 save-then-load rounds of two ranks: 30 programs.

    torch's own teardown still aborts now and then with no distckpt in the program at all: 5 of 40 two-rank rounds of
    init_process_group, one all_gather and one broadcast, against 0 of 140 rounds of this test's save here (2026-11-29,
    torch 2.15) and 1 of 30 programs on a loaded CI host. So up to 2 of the 30 may abort; with the bug (about one
    program in five) 3 or more do in 19 runs of 20."""
    from conftest import TESTS_DIR  # noqa: PLC0415

    env = {**os.environ, "PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}  # fmt: skip
    failures, aborted = [], []
    for round_ in range(15):
        root = tmp_path / f"r{round_}"
        root.mkdir()
        for mode in ("save", "load"):
            procs = [subprocess.Popen([sys.executable, "-c", "import sys, _workers; _workers.last_collective_rank("
                                       f"{rank}, 2, {str(root)!r}, {mode!r})"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True) for rank in range(2)]  # fmt: skip
            for rank, p in enumerate(procs):
                out, _ = p.communicate(timeout=120)
                if p.returncode == 0:
                    continue
                line = f"round {round_} {mode} rank {rank}: exit {p.returncode}: {out[-400:]}"
                # An abort after the work was done and checked (a load compares every value) is the teardown's.
                done = f"rank {rank}: {mode} done" in out
                if p.returncode == -signal.SIGABRT and done and "terminate called without an active exception" in out:
                    aborted.append(line)
                else:
                    failures.append(line)
    assert failures == [], "\n".join(failures)
    assert len(aborted) <= 2, f"{len(aborted)} of 30 programs aborted at exit:\n" + "\n".join(aborted)
