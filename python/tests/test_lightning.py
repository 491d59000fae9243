"""Lightning: DistckptCheckpointIO with the real Trainer and Fabric, on CPU processes.

DDP runs start their ranks as torchrun would (spawned processes with the TorchElastic environment variables), so
Lightning neither re-executes pytest nor forks it. Every rank checks what it restored; the parent process compares
every value of each saved checkpoint with a torch.save copy of the dict Lightning handed to the plugin.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("lightning", reason="lightning is not installed (optional: pip install lightning)")
torch = pytest.importorskip("torch", reason="torch is not installed (optional: pip install torch)")

import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402

import distckpt  # noqa: E402
from distckpt.lightning import DistckptCheckpointIO, DistckptDDPStrategy, DistckptFabricDDPStrategy  # noqa: E402
from conftest import assert_same  # noqa: E402
from test_multiprocess import run_ranks  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "lightning_example.py"


# ---- the model and the checks ---------------------------------------------------------------------------------------


class TinyModule(L.LightningModule):
    def __init__(self, lr: float = 0.05, betas: tuple = (0.9, 0.99), reference_dir: str = "") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen += x.shape[0]
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, betas=self.hparams.betas)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}

    def on_save_checkpoint(self, checkpoint):
        # Values JSON cannot hold as they are: a tuple, NaN, bytes, an int key, and a Path (pickled).
        checkpoint["extras"] = {
            "pair": (1, 2.5),
            "nan": float("nan"),
            "raw": b"\x00\x01",
            7: "int key",
            "where": pathlib.PurePosixPath("/data/run"),
            "bf16": torch.arange(3).bfloat16(),
        }
        if self.hparams.reference_dir and self.trainer.is_global_zero:
            torch.save(checkpoint, os.path.join(self.hparams.reference_dir, f"step-{self.trainer.global_step}.pt"))


def loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 6, generator=g)
    y = torch.randn(32, 2, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


class CheckRestored(Callback):
    """At the start of a resumed fit: the weights, buffers, optimizer and scheduler states and the step are the
    ones of the reference checkpoint."""

    def __init__(self, reference: str) -> None:
        self.reference = reference
        self.checked = False

    def on_train_start(self, trainer, pl_module):
        ref = torch.load(self.reference, weights_only=False)
        assert trainer.global_step == ref["global_step"]
        assert_same(dict(pl_module.state_dict()), dict(ref["state_dict"]), "state_dict")
        assert_same(trainer.optimizers[0].state_dict(), ref["optimizer_states"][0], "optimizer")
        assert_same(trainer.lr_scheduler_configs[0].scheduler.state_dict(), ref["lr_schedulers"][0], "scheduler")
        self.checked = True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env(rank, world, port):
    """What torchrun sets: Lightning then runs as this rank instead of launching processes itself."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", NODE_RANK="0",
                      TORCHELASTIC_RUN_ID="distckpt-test")  # fmt: skip


def trainer(devices, strategy, io, max_steps, callbacks, root):
    return L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, plugins=[io], max_steps=max_steps,
                     callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=root)  # fmt: skip


# ---- workers (spawned by run_ranks) ---------------------------------------------------------------------------------


def fit_rank(rank, world, port, root, mode, resume_from, reference, max_steps):
    torchrun_env(rank, world, port)
    L.seed_everything(0, verbose=False)
    os.makedirs(os.path.join(root, "ref"), exist_ok=True)
    if mode == "collective":
        strategy, io = DistckptDDPStrategy(process_group_backend="gloo"), DistckptCheckpointIO(timeout=60)
    else:
        strategy, io = "ddp", DistckptCheckpointIO(async_save=True)
    callbacks = [ModelCheckpoint(dirpath=os.path.join(root, "ckpts"), every_n_train_steps=2, save_top_k=-1 if
                                 mode == "collective" else 2, monitor="step", mode="max")]  # fmt: skip
    check = CheckRestored(reference) if resume_from else None
    model = TinyModule(reference_dir=os.path.join(root, "ref"))
    t = trainer(world, strategy, io, max_steps, callbacks + ([check] if check else []), root)
    t.fit(model, loader(), ckpt_path=resume_from)
    assert t.global_step == max_steps
    if check is not None:
        assert check.checked
    if mode == "async":
        assert io.pending is None  # teardown waited for the last save
        assert (io.last_summary is not None) == (rank == 0)  # Lightning's strategies save on rank 0 only


def fabric_rank(rank, world, port, path):
    torchrun_env(rank, world, port)
    torch.manual_seed(1)
    strategy = DistckptFabricDDPStrategy(process_group_backend="gloo")
    fabric = L.Fabric(accelerator="cpu", devices=world, strategy=strategy, plugins=[DistckptCheckpointIO(timeout=60)])
    fabric.launch()
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = fabric.setup(model, opt)
    for i in range(3):
        x = torch.full((2, 5), float(i + fabric.global_rank))
        fabric.backward(model(x).sum())
        opt.step()
        opt.zero_grad()
    fabric.save(path, {"model": model, "optimizer": opt, "iteration": 3, "meta": {"note": "fabric", "ranks": world}})
    if fabric.global_rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.optimizer.state_dict()}, path + ".ref.pt")
    fabric.barrier()


# ---- tests ----------------------------------------------------------------------------------------------------------


def saved_matches_reference(ckpt_dir, ref_dir):
    """Loads every checkpoint with the plugin and compares it with the dict Lightning handed over."""
    names = sorted(os.listdir(ckpt_dir))
    for name in names:
        step = int(name.split("step=")[1].split(".")[0])
        got = DistckptCheckpointIO().load_checkpoint(os.path.join(ckpt_dir, name))
        assert_same(got, torch.load(os.path.join(ref_dir, f"step-{step}.pt"), weights_only=False), name)
    return names


def test_trainer_ddp_collective_save_resumes_on_one_process(tmp_path):
    start = time.monotonic()
    (tmp_path / "ref").mkdir()
    run_ranks(fit_rank, 2, free_port(), str(tmp_path), "collective", None, None, 4)
    names = saved_matches_reference(tmp_path / "ckpts", tmp_path / "ref")
    assert names == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    last = tmp_path / "ckpts" / names[-1]
    with distckpt.open(last) as r:
        assert r.user_metadata["global_step"] == "4" and r.user_metadata["epoch"] == "0"
        assert r.metadata["state_dict.net.0.weight"].dtype == "F32"
    # Both ranks wrote: the replicated bytes were split between them.
    assert len([f for f in os.listdir(last) if f.startswith("data-")]) == 2

    # Resume on one process (no DDP) with trainer.fit(ckpt_path=...): CheckRestored compares every value.
    check = CheckRestored(str(tmp_path / "ref" / "step-4.pt"))
    model = TinyModule()
    t = trainer(1, "auto", DistckptCheckpointIO(), 6, [check], str(tmp_path / "resumed"))
    t.fit(model, loader(), ckpt_path=str(last))
    assert check.checked and t.global_step == 6
    # Lightning's default ModelCheckpoint saved the end through the plugin too.
    (end,) = os.listdir(tmp_path / "resumed" / "checkpoints")
    assert DistckptCheckpointIO().load_checkpoint(tmp_path / "resumed" / "checkpoints" / end)["global_step"] == 6
    assert time.monotonic() - start < 120


def test_trainer_async_save_on_rank_zero_resumes_on_three_processes(tmp_path):
    (tmp_path / "ref").mkdir()
    run_ranks(fit_rank, 2, free_port(), str(tmp_path), "async", None, None, 8)
    # save_top_k=2 removed the older ones (each after its save was committed); the rest are complete.
    names = saved_matches_reference(tmp_path / "ckpts", tmp_path / "ref")
    assert names == ["epoch=1-step=6.ckpt", "epoch=1-step=8.ckpt"]
    # Resume with three ranks: every rank loads the whole (replicated) state and checks it.
    run_ranks(fit_rank, 3, free_port(), str(tmp_path / "resumed"), "collective",
              str(tmp_path / "ckpts" / names[-1]), str(tmp_path / "ref" / "step-8.pt"), 10)  # fmt: skip
    assert sorted(os.listdir(tmp_path / "resumed" / "ckpts")) == ["epoch=2-step=10.ckpt"]


def test_fabric_save_on_two_ranks_load_on_one(tmp_path):
    path = str(tmp_path / "fabric.ckpt")
    run_ranks(fabric_rank, 2, free_port(), path)
    ref = torch.load(path + ".ref.pt", weights_only=True)
    fabric = L.Fabric(accelerator="cpu", devices=1, plugins=[DistckptCheckpointIO()])
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.0)
    model, opt = fabric.setup(model, opt)
    state = {"model": model, "optimizer": opt, "iteration": 0}
    rest = fabric.load(path, state)
    assert state["iteration"] == 3 and rest == {"meta": {"note": "fabric", "ranks": 2}}
    assert_same(dict(model.module.state_dict()), dict(ref["model"]), "model")
    assert_same(opt.optimizer.state_dict(), ref["optimizer"], "optimizer")
    # The whole checkpoint, without targets.
    everything = fabric.load(path)
    assert list(everything) == ["model", "optimizer", "iteration", "meta"]
    assert_same(dict(everything["model"]), dict(ref["model"]), "model")


def test_pickle_policy_map_location_and_removal(tmp_path):
    io = DistckptCheckpointIO()
    ckpt = {"state_dict": {"w": torch.arange(4.0)}, "epoch": 1, "hyper_parameters": {"root": pathlib.Path("/x")}}
    io.save_checkpoint(ckpt, tmp_path / "a.ckpt")
    # Pickled entries are refused when Lightning asks for weights only, and by allow_pickle=False.
    with pytest.raises(distckpt.PickleNotAllowedError, match="hyper_parameters.root"):
        io.load_checkpoint(tmp_path / "a.ckpt", weights_only=True)
    with pytest.raises(distckpt.PickleNotAllowedError, match="hyper_parameters.root"):
        DistckptCheckpointIO(allow_pickle=False).save_checkpoint(ckpt, tmp_path / "b.ckpt")
    assert not (tmp_path / "b.ckpt").exists()
    got = io.load_checkpoint(tmp_path / "a.ckpt", map_location="cpu")
    assert_same(got, ckpt)
    with pytest.raises(distckpt.InvalidArgumentError, match="map_location"):
        io.load_checkpoint(tmp_path / "a.ckpt", map_location=lambda s, loc: s)
    with pytest.raises(distckpt.InvalidArgumentError, match="storage_options"):
        io.save_checkpoint(ckpt, tmp_path / "c.ckpt", storage_options={"compress": True})
    # Saving again to the same path replaces the checkpoint, as Lightning does with files.
    io.save_checkpoint({**ckpt, "epoch": 2}, tmp_path / "a.ckpt")
    assert io.load_checkpoint(tmp_path / "a.ckpt")["epoch"] == 2
    # Removal deletes a distckpt checkpoint (and its directory), and nothing else.
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()
    torch.save(ckpt, tmp_path / "plain.ckpt")
    with pytest.raises(distckpt.NotFoundError):
        io.remove_checkpoint(tmp_path / "plain.ckpt")
    assert (tmp_path / "plain.ckpt").is_file()
    with pytest.raises(distckpt.AlreadyExistsError):
        io.save_checkpoint(ckpt, tmp_path / "plain.ckpt")
    assert (tmp_path / "plain.ckpt").is_file()


def test_save_options_compress_sync_and_async_saves(tmp_path):
    w = (torch.randn(256, 256) * 0.02).to(torch.bfloat16)
    for async_save in (False, True):
        io = DistckptCheckpointIO(async_save=async_save, save_options={"compression": "zstd"})
        path = tmp_path / f"{async_save}.ckpt"
        io.save_checkpoint({"state_dict": {"w": w}, "global_step": 3}, path)
        io.teardown()
        assert io.last_summary.bytes_written < 0.8 * io.last_summary.total_bytes
        with distckpt.open(path) as r:
            assert r.metadata.format_version == (3, 0)
        got = io.load_checkpoint(path)
        assert torch.equal(got["state_dict"]["w"], w) and got["global_step"] == 3


def test_async_save_is_staged_before_returning(tmp_path):
    io = DistckptCheckpointIO(async_save=True)
    w = torch.arange(1 << 16, dtype=torch.float32)
    io.save_checkpoint({"state_dict": {"w": w}, "global_step": 5}, tmp_path / "s.ckpt")
    w.zero_()  # the save owns a copy already
    io.save_checkpoint({"state_dict": {"w": w}, "global_step": 6}, tmp_path / "t.ckpt")  # waits for the first
    assert io.last_summary is not None and io.last_summary.path == str(tmp_path / "s.ckpt")
    io.teardown()
    assert io.pending is None and io.last_summary.path == str(tmp_path / "t.ckpt")
    first = io.load_checkpoint(tmp_path / "s.ckpt")
    assert first["global_step"] == 5 and torch.equal(first["state_dict"]["w"], torch.arange(1 << 16).float())
    assert io.load_checkpoint(tmp_path / "t.ckpt")["state_dict"]["w"].count_nonzero() == 0


def test_example_runs(tmp_path):
    if not EXAMPLE.is_file():
        pytest.fail(f"missing {EXAMPLE}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(distckpt.__path__[0]), env.get("PYTHONPATH")] if p)
    res = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env=env)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "resumed at step 4 on 1 process" in res.stdout and "OK" in res.stdout, res.stdout
