"""Lightning + distckpt: train on 2 CPU processes saving distckpt checkpoints, then resume on 1 process.

    python examples/python/lightning_example.py [OUTPUT_DIR]

1. ``Trainer(devices=2, strategy=DistckptDDPStrategy(...), plugins=[DistckptCheckpointIO(async_save=True)])`` trains
   for 4 steps; ModelCheckpoint saves every 2 steps. Both ranks take part in each save (one collective distckpt save:
   the replicated DDP state is written once, split between them), in the background while training goes on.
2. A new Trainer on 1 process resumes with ``trainer.fit(ckpt_path=...)`` and checks that the weights, optimizer state
   and step are the saved ones before training 2 more steps.
"""

from __future__ import annotations

import os
import sys
import tempfile

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from distckpt.lightning import DistckptCheckpointIO, DistckptDDPStrategy


class Regressor(L.LightningModule):
    def __init__(self, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


class CheckResumed(Callback):
    """Compares the restored state with the checkpoint, read back through the plugin."""

    def __init__(self, path: str) -> None:
        self.saved = DistckptCheckpointIO().load_checkpoint(path)

    def on_train_start(self, trainer, module):
        assert trainer.global_step == self.saved["global_step"]
        for name, value in module.state_dict().items():
            assert torch.equal(value, self.saved["state_dict"][name]), name
        restored = trainer.optimizers[0].state_dict()["state"]
        for index, state in self.saved["optimizer_states"][0]["state"].items():
            for key, value in state.items():
                assert torch.equal(restored[index][key], value), (index, key)
        print(f"resumed at step {trainer.global_step} on {trainer.world_size} process")


def main(out: str) -> None:
    ckpt_dir = os.path.join(out, "checkpoints")
    common = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir=out)

    # 1. Two processes, collective async saves.
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        devices=2,
        strategy=DistckptDDPStrategy(start_method="spawn", process_group_backend="gloo"),
        plugins=[DistckptCheckpointIO(async_save=True)],
        callbacks=[ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=2, save_top_k=-1)],
        max_steps=4,
        **common,
    )
    trainer.fit(Regressor(), data())  # teardown waits for the last background save
    saved = sorted(os.listdir(ckpt_dir))
    print("saved:", ", ".join(saved))
    last = os.path.join(ckpt_dir, "epoch=0-step=4.ckpt")

    # 2. One process resumes from the last checkpoint.
    check = CheckResumed(last)
    resumed = L.Trainer(devices=1, plugins=[DistckptCheckpointIO()], callbacks=[check], max_steps=6, **common)
    resumed.fit(Regressor(), data(), ckpt_path=last)
    assert resumed.global_step == 6
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="distckpt-lightning-"))
