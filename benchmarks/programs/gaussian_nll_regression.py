"""Heteroscedastic regression: a network predicting a mean and a variance, trained with GaussianNLLLoss.

Written after the usual PyTorch recipe for aleatoric-uncertainty regression (the `torch.nn.GaussianNLLLoss`
documentation: `loss(input, target, var)` with `var` the predicted variance, positive; Nix & Weigend 1994 /
Lakshminarayanan et al.'s deep-ensembles member network: a shared body, a mean head and a variance head
through softplus plus a small constant). Adam with a `StepLR` stepped once an epoch, mini-batches of
`(x, y)` from a `TensorDataset`, checkpoint in the PyTorch tutorial's "saving a general checkpoint" format:
`{"epoch", "model_state_dict", "optimizer_state_dict", "scheduler_state_dict", "loss"}`.

The loss is negative by nature: -log N(y; mu, var) drops below zero wherever the predicted variance is small
and right, and it has no floor at 0 (the healthy run ends around -0.6).

Data: 6 input features, a smooth non-linear mean, noise whose standard deviation grows with the first feature
(0.05 to ~0.45).

Runs
- healthy: target as `(B, 1)` like the model's outputs; 15 epochs; checkpoint after epoch 6 (still falling,
  already negative).
- target_broadcast: the owner's dataset yields `y` of shape `(B,)` while the heads output `(B, 1)`.
  `GaussianNLLLoss` checks the variance's shape but not the target's (its input/target shape check was
  removed to allow broadcasting, pytorch/pytorch PR #56469), so `(input - target)` broadcasts to `(B, B)`
  silently, with no warning unlike `MSELoss`: every prediction is scored against every target of the batch,
  the network learns the marginal distribution, and the mean head predicts ~the global mean with a large
  variance. Validation RMSE stays at the spread of y. Root cause `wrong_loss` (the fix, `y.view(-1, 1)`,
  removes it). Competing fix a user tries first: a 10x lower LR (`lr_lower`), which leaves it.
"""

from __future__ import annotations

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
    name="gaussian_nll_regression",
    kind="probabilistic",
    original="PyTorch docs torch.nn.GaussianNLLLoss + deep-ensembles style mean/variance network "
             "(Lakshminarayanan et al. 2017); PyTorch tutorial 'saving and loading a general checkpoint'",
    runs={
        "healthy": Run(cause="healthy", story="Mean + softplus-variance heads, GaussianNLLLoss, Adam + StepLR per "
                       "epoch; the loss is below zero by epoch 3 and still falling at the epoch-6 checkpoint."),
        "target_broadcast": Run(
            cause="wrong_loss",
            story="My dataset returns y as shape (B,), the model (B, 1); GaussianNLLLoss gave no error and the "
                  "loss plateaued at a positive value, predictions all near the mean of y.",
            fix="target_view", competing=("lr_lower",)),
    },
)

N_IN, N_TRAIN, N_VALID, BS, EPOCHS = 6, 3072, 1024, 64, 15


def make_data(seed):
    rng = np.random.default_rng(6000 + seed)
    n = N_TRAIN + N_VALID
    x = rng.uniform(-1, 1, size=(n, N_IN)).astype(np.float32)
    mean = np.sin(2.5 * x[:, 0]) + 0.8 * x[:, 1] * x[:, 2] + 0.5 * np.cos(3 * x[:, 3]) + 0.4 * x[:, 4]
    std = 0.05 + 0.2 * (x[:, 0] + 1) ** 1.2
    y = (mean + std * rng.normal(size=n)).astype(np.float32)
    return ((torch.tensor(x[:N_TRAIN]), torch.tensor(y[:N_TRAIN])),
            (torch.tensor(x[N_TRAIN:]), torch.tensor(y[N_TRAIN:])))


class MeanVarianceNet(nn.Module):
    def __init__(self, n_in=N_IN, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_in, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.mean_head = nn.Linear(hidden, 1)
        self.var_head = nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.body(x)
        return self.mean_head(h), F.softplus(self.var_head(h)) + 1e-6


criterion = nn.GaussianNLLLoss()


def make_loss_fn(view_target: bool):
    def loss_fn(model, batch):
        x, y = batch
        mean, var = model(x)
        if view_target:
            y = y.view(-1, 1)
        return criterion(mean, y, var)
    return loss_fn


def build(seed, run, variant):
    train_ds, valid_ds = make_data(seed)
    model = MeanVarianceNet()
    lr = 3e-4 if variant == "lr_lower" else 3e-3
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    view_target = not (run == "target_broadcast" and variant != "target_view")
    return model, opt, sched, make_loss_fn(view_target), train_ds, valid_ds


def loader(ds, bs, shuffle, seed):
    x, y = ds
    n = len(y)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(n)
    return [(x[i], y[i]) for i in (order[j:j + bs] for j in range(0, n, bs))]


@torch.no_grad()
def evaluate(model, valid_ds):
    model.eval()
    x, y = valid_ds
    mean, var = model(x)
    model.train()
    nll = float(criterion(mean, y.view(-1, 1), var))
    rmse = float((mean.view(-1) - y).pow(2).mean().sqrt())
    return nll, rmse


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    model, opt, sched, loss_fn, train_ds, valid_ds = build(seed, run, variant)
    ckpt = Path(out_dir) / "checkpoint.tar"
    ckpt_epoch = 6 if run == "healthy" else EPOCHS
    losses, vls, rmses = [], [], []
    for epoch in range(EPOCHS):
        for batch in loader(train_ds, BS, True, seed * 1000 + epoch):
            opt.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        sched.step()
        nll, rmse = evaluate(model, valid_ds)
        vls.append(nll)
        rmses.append(rmse)
        if epoch + 1 == ckpt_epoch:
            torch.save({"epoch": epoch + 1, "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": opt.state_dict(), "scheduler_state_dict": sched.state_dict(),
                        "loss": losses[-1]}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vls,
                   metrics={"val_rmse": rmses[-1], "y_std": float(valid_ds[1].std()), "val_nll": vls[-1]})


def symptom(run: str, trained: Trained) -> str | None:
    rmse, ystd = trained.metrics["val_rmse"], trained.metrics["y_std"]
    tl = trained.train_losses
    if rmse > 0.6 * ystd:
        return (f"validation RMSE {rmse:.3f} against a target spread of {ystd:.3f} after "
                f"{len(trained.val_losses)} epochs; train NLL {np.mean(tl[:20]):.3f} -> {np.mean(tl[-20:]):.3f}")
    if run == "healthy" and trained.metrics["val_nll"] > 0:
        return f"validation NLL {trained.metrics['val_nll']:.3f} never went below zero"
    return None


def _setup(run):
    import triage

    model, opt, sched, loss_fn, train_ds, valid_ds = build(0, run, None)
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=loss_fn,
                        batches=loader(train_ds, BS, True, 99)[:48],
                        val_batches=loader(valid_ds, 256, False, 0),
                        scheduler_interval="epoch", steps_per_epoch=N_TRAIN // BS,
                        total_steps=EPOCHS * (N_TRAIN // BS))


def setup_healthy():
    return _setup("healthy")


def setup_target_broadcast():
    return _setup("target_broadcast")
