"""lr_too_high (RMSprop, regression): a 16-64-64-1 MLP fitting a smooth synthetic tabular target with MSE,
trained by RMSprop at lr=0.03: the steps are far too long for the curvature, the loss jumps from ~3 to
hundreds and oscillates. Fix: lr=3e-3 (x0.1) trains."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import mlp, mse_loss, regression_batches
from _zoo import write_run_checkpoint

ROOT_CAUSE = "lr_too_high"
FAULTY_LR, FIXED_LR = 0.03, 3e-3


def _setup(lr: float) -> triage.Setup:
    model = mlp([16, 64, 64, 1])
    return triage.Setup(model=model, optimizer=torch.optim.RMSprop(model.parameters(), lr=lr),
                        loss_fn=mse_loss, batches=regression_batches(batch_size=128))


def setup() -> triage.Setup:
    return _setup(FAULTY_LR)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_LR)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=3)
