"""Tiny Lightning runs built in code: an MLP on scikit-learn's bundled digits (no download)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning", reason="the lightning extra is not installed")


def digits(n_batches: int = 16, batch_size: int = 64):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    n = n_batches * batch_size
    return torch.utils.data.TensorDataset(x[:n], torch.tensor(y[:n]))


def loader(shuffle: bool = False, n_batches: int = 16):
    return torch.utils.data.DataLoader(digits(n_batches), batch_size=64, shuffle=shuffle)


class LitMLP(L.LightningModule):
    """SGD at `lr`; the schedule multiplies it by `jump` from step `jump_at` on (a schedule bug), stepped
    per step by Lightning."""

    def __init__(self, lr: float = 0.05, jump: float = 20.0, jump_at: int = 40, hidden: int = 128):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 64), nn.ReLU(),
                                 nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        jump, at = self.hparams.jump, self.hparams.jump_at
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if s < at else jump)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self):
        return loader(shuffle=False)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.Subset(digits(20), range(1024, 1280)), batch_size=64)


class LitManual(LitMLP):
    """The same run under manual optimization."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.lr_schedulers().step()
        self.log("train_loss", loss)
        return loss


class DigitsData(L.LightningDataModule):
    def train_dataloader(self):
        return loader(shuffle=False)


class LitNoData(LitMLP):
    """A module whose data comes from a datamodule."""

    train_dataloader = L.LightningModule.train_dataloader
    val_dataloader = L.LightningModule.val_dataloader


def module_with_data():
    return LitNoData(), DigitsData()


def fit(module, root, callbacks=(), max_steps=120, datamodule=None, **trainer_args):
    settings = dict(max_steps=max_steps, default_root_dir=str(root), callbacks=list(callbacks),
                    enable_progress_bar=False, enable_model_summary=False, logger=False,
                    enable_checkpointing=False, accelerator="cpu", devices=1, num_sanity_val_steps=0,
                    limit_val_batches=0)
    settings.update(trainer_args)
    trainer = L.Trainer(**settings)
    trainer.fit(module, datamodule=datamodule)
    return trainer
