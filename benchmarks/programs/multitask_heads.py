"""Multi-task network: a shared trunk with a classification head and a regression head, weighted sum of losses.

Written after the hard-parameter-sharing recipe of LibMTL (median-research-group/LibMTL: `architecture/HPS.py`,
an encoder shared by task-specific decoders, the `Trainer`'s losses combined by a weighting method, `EW`
equal/fixed weights here) and the common Kaggle multi-task notebooks: the targets of each batch held in a dict
by task name, `loss = w_cls * cross_entropy + w_reg * mse`, Adam over the model's parameters, a cosine schedule
stepped each iteration. A batch is `{"features": float (B, 20), "targets": {"segment": long (B,),
"spend": float (B,)}}`. Checkpoint: `{"state_dict", "optimizer", "lr_scheduler", "global_step", "epoch"}`.

Data: a customer-table-like input, a 4-class "segment" target and a continuous standardised "spend" target,
both non-linear functions of shared latent factors (so the shared trunk helps both).

Runs
- healthy: everything trains, 10 epochs; checkpoint after epoch 4 (both task losses still falling).
- trunk_frozen: the owner started from a fine-tuning notebook and kept its "freeze the backbone" line
  (`for p in model.encoder.parameters(): p.requires_grad_(False)`), which is meant for a pretrained encoder;
  theirs is randomly initialised, so only the two small heads learn, on random features. Both task losses
  stall far above the healthy run's (segment accuracy ~0.5 against ~0.8). Freezing a backbone by mistake, or
  forgetting to unfreeze it, is a staple of forum threads ("loss not decreasing, requires_grad False on the
  backbone"). Root cause `frozen_parameters` (the fix, training the encoder, removes it; the encoder holds
  most of the weights). Competing fix a user tries first: a 10x higher LR (`lr_x10`), which leaves it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="multitask_heads",
    kind="multitask",
    original="LibMTL (median-research-group): LibMTL/architecture/HPS.py + trainer.py with EW weighting; "
             "Kaggle multi-task notebooks (dict targets, weighted loss sum)",
    runs={
        "healthy": Run(cause="healthy", story="Shared encoder, segment + spend heads, 1.0*CE + 0.5*MSE, Adam + "
                       "per-step cosine; checkpoint at epoch 4 of 10 with both losses still falling."),
        "trunk_frozen": Run(
            cause="frozen_parameters",
            story="Kept the notebook's freeze-the-backbone line though my encoder is trained from scratch; "
                  "both task losses stall (segment accuracy ~0.5).",
            fix="unfreeze", competing=("lr_x10",)),
    },
)

N_IN, N_CLASSES, N_TRAIN, N_VALID, BS, EPOCHS = 20, 4, 3072, 1024, 64, 10
W_CLS, W_REG = 1.0, 0.5


def make_data(seed):
    rng = np.random.default_rng(7000 + seed)
    n = N_TRAIN + N_VALID
    z = rng.normal(size=(n, 6))
    A = rng.normal(size=(6, N_IN)) / np.sqrt(6)
    x = (np.tanh(z @ A) + 0.1 * rng.normal(size=(n, N_IN))).astype(np.float32)
    f = np.stack([np.sin(2 * z[:, 0]) + z[:, 1] * z[:, 2], z[:, 3] ** 2 - 1 + np.cos(2 * z[:, 4]),
                  np.abs(z[:, 5]) - z[:, 0] * z[:, 4]], 1)
    W = rng.normal(size=(3, N_CLASSES)) * 1.5
    seg = (f @ W + rng.gumbel(size=(n, N_CLASSES)) * 0.3).argmax(1)
    spend = f[:, 0] * 0.8 - f[:, 1] * 0.6 + 0.5 * f[:, 2] * f[:, 0] + 0.1 * rng.normal(size=n)
    spend = (spend - spend[:N_TRAIN].mean()) / spend[:N_TRAIN].std()
    mk = lambda s: {"features": torch.tensor(x[s]),
                    "targets": {"segment": torch.tensor(seg[s]), "spend": torch.tensor(spend[s], dtype=torch.float32)}}
    return mk(slice(0, N_TRAIN)), mk(slice(N_TRAIN, n))


class HPS(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(N_IN, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                     nn.Linear(256, 64), nn.ReLU())
        self.decoders = nn.ModuleDict({"segment": nn.Linear(64, N_CLASSES), "spend": nn.Linear(64, 1)})

    def forward(self, x):
        h = self.encoder(x)
        return {task: dec(h) for task, dec in self.decoders.items()}


def task_losses(out, targets):
    return {"segment": F.cross_entropy(out["segment"], targets["segment"]),
            "spend": F.mse_loss(out["spend"].squeeze(-1), targets["spend"])}


def loss_fn(model, batch):
    losses = task_losses(model(batch["features"]), batch["targets"])
    return W_CLS * losses["segment"] + W_REG * losses["spend"]


def loader(ds, bs, shuffle, seed):
    n = len(ds["features"])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(n)
    out = []
    for j in range(0, n, bs):
        i = order[j:j + bs]
        out.append({"features": ds["features"][i], "targets": {k: v[i] for k, v in ds["targets"].items()}})
    return out


def build(seed, run, variant):
    train_ds, valid_ds = make_data(seed)
    model = HPS()
    if run == "trunk_frozen" and variant != "unfreeze":
        for p in model.encoder.parameters():   # "freeze the backbone, train the heads"
            p.requires_grad_(False)
    lr = 1e-2 if variant == "lr_x10" else 1e-3
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    total = EPOCHS * math.ceil(N_TRAIN / BS)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total, eta_min=lr * 0.01)
    return model, opt, sched, train_ds, valid_ds, total


@torch.no_grad()
def evaluate(model, ds):
    model.eval()
    out = model(ds["features"])
    model.train()
    losses = task_losses(out, ds["targets"])
    acc = float((out["segment"].argmax(1) == ds["targets"]["segment"]).float().mean())
    return float(W_CLS * losses["segment"] + W_REG * losses["spend"]), acc, float(losses["spend"])


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    model, opt, sched, train_ds, valid_ds, total = build(seed, run, variant)
    ckpt = Path(out_dir) / "last.ckpt.pt"
    ckpt_epoch = 4 if run == "healthy" else EPOCHS
    losses, vls, accs, mses, step = [], [], [], [], 0
    for epoch in range(EPOCHS):
        for batch in loader(train_ds, BS, True, seed * 1000 + epoch):
            opt.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            losses.append(loss.item())
        vl, acc, mse = evaluate(model, valid_ds)
        vls.append(vl)
        accs.append(acc)
        mses.append(mse)
        if epoch + 1 == ckpt_epoch:
            torch.save({"state_dict": model.state_dict(), "optimizer": opt.state_dict(),
                        "lr_scheduler": sched.state_dict(), "global_step": step, "epoch": epoch + 1}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vls,
                   metrics={"val_acc": accs[-1], "val_mse": mses[-1]})


def symptom(run: str, trained: Trained) -> str | None:
    acc, mse = trained.metrics["val_acc"], trained.metrics["val_mse"]
    tl = trained.train_losses
    if acc < 0.65 or mse > 0.55:
        return (f"segment accuracy {acc:.3f} and spend MSE {mse:.3f} (standardised target) after "
                f"{len(trained.val_losses)} epochs; weighted train loss {np.mean(tl[:20]):.3f} -> {np.mean(tl[-20:]):.3f}")
    return None


def _setup(run):
    import triage

    model, opt, sched, train_ds, valid_ds, total = build(0, run, None)
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=loss_fn,
                        batches=loader(train_ds, BS, True, 31)[:48],
                        val_batches=loader(valid_ds, 256, False, 0),
                        total_steps=total, scheduler_interval="step")


def setup_healthy():
    return _setup("healthy")


def setup_trunk_frozen():
    return _setup("trunk_frozen")
