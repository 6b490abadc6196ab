"""A LightningModule digit classifier trained by a real `lightning.Trainer` on CPU; triage takes its `.ckpt`.

Follows the Lightning docs' LightningModule pattern and the Lightning tutorials' classifier baselines (e.g. the
"PyTorch Lightning CIFAR10 ~94% baseline" tutorial's `LitResnet`, read through the doc search): `training_step`
returns the cross-entropy and `self.log`s it, `validation_step` logs `val_loss` / `val_acc`,
`configure_optimizers` returns `{"optimizer": SGD(lr=0.05, momentum=0.9, weight_decay=5e-4), "lr_scheduler":
{"scheduler": ..., "interval": "step"}}` (a cosine schedule over `max_steps` here), and `Trainer(max_steps=...,
gradient_clip_val=..., callbacks=[ModelCheckpoint(every_n_train_steps=...)], logger=CSVLogger(...))`. The data is
scikit-learn's bundled 8x8 digits (1400 train / 397 validation, pixels scaled to [0, 1]) in DataLoaders of 32,
the model an MLP 64-128-128-10. The run's `metrics.csv` (CSVLogger) is returned as its history.

Runs
- healthy: gradient_clip_val=0.5 (the value of Lightning's docs example); the checkpoint is the step-150 one of
  450, while the validation loss still falls.
- clip_too_small: the user lowered `gradient_clip_val` step by step while chasing a loss spike on another dataset
  (0.5 -> 0.05 -> 0.005) and kept 0.005. The global grad norm is ~0.5-2 on every step, so every update is scaled
  down ~100-400x: SGD moves at lr * 0.005 per step and the loss creeps from 2.31 to ~2.27 in 450 steps.
  Over-tight clipping is a known silent stall: sktime/pytorch-forecasting PR #1750 fixes its own N-BEATS
  tutorial, whose Trainer had gradient_clip_val=0.01 and whose model "fails to learn (training loss doesn't
  decrease)" until the clip was raised to 0.1. Root cause:
  clipping_too_aggressive (the fix is the clip: back to 0.5, or none). Competing fixes a user tries first: a 3x
  larger LR (still ~100x too small a step) and twice the steps. The checkpoint is the step-300 one, once the
  slow crawl shows.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="lightning_classifier",
    kind="lightning",
    original="Lightning docs LightningModule/Trainer pattern (+ lightning tutorials' SGD classifier baselines)",
    runs={
        "healthy": Run(cause="healthy", story="Lightning MLP on digits, SGD + cosine schedule per step, clip 0.5; "
                                              "checkpoint at step 150 of 450 while val loss still falls."),
        "clip_too_small": Run(
            cause="clipping_too_aggressive",
            story="I set gradient_clip_val=0.005 while chasing spikes elsewhere; on this run the loss crawls from "
                  "2.31 to 2.27 in 450 steps and validation accuracy stays at ~25%.",
            fix="clip_0.5",
            competing=("lr_x3", "steps_x2"),
        ),
    },
)

MAX_STEPS = 450
BATCH = 32
LR = 0.05


def make_data(seed: int):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(X), generator=g)
    X = torch.tensor(X / 16.0, dtype=torch.float32)[perm]
    y = torch.tensor(y)[perm]
    return (X[:1400], y[:1400]), (X[1400:], y[1400:])


def _import_lightning():
    import lightning as L
    return L


def _lit_class():
    L = _import_lightning()

    class LitClassifier(L.LightningModule):
        def __init__(self, lr: float = LR, max_steps: int = MAX_STEPS, gradient_clip_val: float = 0.5):
            super().__init__()
            self.save_hyperparameters()
            self.model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                       nn.Linear(128, 10))

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            self.log("val_loss", F.cross_entropy(logits, y))
            self.log("val_acc", (logits.argmax(-1) == y).float().mean())

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=5e-4)
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.hparams.max_steps)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return LitClassifier


def _hparams(run, variant):
    clip = 0.005 if (run == "clip_too_small" and variant != "clip_0.5") else 0.5
    lr = LR * (3 if variant == "lr_x3" else 1)
    steps = MAX_STEPS * (2 if variant == "steps_x2" else 1)
    return lr, steps, clip


def _loaders(seed):
    from torch.utils.data import DataLoader, TensorDataset

    (xtr, ytr), (xva, yva) = make_data(seed)
    g = torch.Generator().manual_seed(seed)
    train = DataLoader(TensorDataset(xtr, ytr), batch_size=BATCH, shuffle=True, generator=g)
    val = DataLoader(TensorDataset(xva, yva), batch_size=128)
    return train, val


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    import logging

    L = _import_lightning()
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    out_dir = Path(out_dir)
    L.seed_everything(seed, verbose=False)
    lr, steps, clip = _hparams(run, variant)
    module = _lit_class()(lr=lr, max_steps=steps, gradient_clip_val=clip)
    train_dl, val_dl = _loaders(seed)
    ckpt_cb = ModelCheckpoint(dirpath=out_dir / "checkpoints", filename="{step}", every_n_train_steps=150,
                              save_top_k=-1)
    logger = CSVLogger(out_dir, name="logs", version=0)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, gradient_clip_val=clip, logger=logger,
                        callbacks=[ckpt_cb], log_every_n_steps=10, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train_dl, val_dl)
    ckpt = out_dir / "checkpoints" / f"step={150 if run == 'healthy' else 300}.ckpt"
    history = out_dir / "logs" / "version_0" / "metrics.csv"
    import csv

    rows = list(csv.DictReader(open(history)))
    train_losses = [float(r["train_loss"]) for r in rows if r.get("train_loss")]
    val_losses = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    val_accs = [float(r["val_acc"]) for r in rows if r.get("val_acc")]
    return Trained(checkpoint=ckpt, train_losses=train_losses, val_losses=val_losses,
                   metrics={"val_loss": val_losses[-1], "val_acc": val_accs[-1], "steps": steps},
                   history=history)


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["val_loss"] > 0.4:
            return f"healthy run failed to train: val loss {m['val_loss']:.2f}, val acc {m['val_acc']:.2f}"
        return None
    if m["val_loss"] > 1.0:
        return (f"train loss {trained.train_losses[0]:.2f} -> {trained.train_losses[-1]:.2f} over {m['steps']} "
                f"steps; val loss {m['val_loss']:.2f}, val acc {m['val_acc']:.2f} (the healthy run: ~0.15, 0.95)")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    torch.manual_seed(0)
    lr, steps, clip = _hparams(run, None)
    module = _lit_class()(lr=lr, max_steps=steps, gradient_clip_val=clip)
    conf = module.configure_optimizers()
    train_dl, val_dl = _loaders(0)
    batches = [b for b in train_dl] + [b for b in train_dl]       # two epochs' shuffles: 88 batches
    return triage.Setup(
        model=module, optimizer=conf["optimizer"], scheduler=conf["lr_scheduler"]["scheduler"],
        loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
        batches=batches[:64], val_batches=list(val_dl), grad_clip=clip, total_steps=steps,
    )


def setup_healthy():
    return _setup("healthy")


def setup_clip_too_small():
    return _setup("clip_too_small")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, symptom(r, tr), tr.checkpoint.exists(),
                      [round(x, 2) for x in tr.val_losses])
