"""healthy (regression, RMSprop): a 16-64-64-1 MLP fitting a smooth synthetic tabular target with MSE, RMSprop at
lr=1e-3, with a validation set: it trains normally. Nothing to fix; fixed_setup() is the same run."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import mlp, mse_loss, regression_batches
from _zoo import write_run_checkpoint

ROOT_CAUSE = "healthy"


def setup() -> triage.Setup:
    model = mlp([16, 64, 64, 1])
    return triage.Setup(model=model, optimizer=torch.optim.RMSprop(model.parameters(), lr=1e-3),
                        loss_fn=mse_loss, batches=regression_batches(batch_size=128),
                        val_batches=regression_batches(batch_size=128, n_batches=4, seed=1))


def fixed_setup() -> triage.Setup:
    return setup()


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=10)
