"""overfitting (small noisy regression): a wide 8-512-512-1 MLP fits 64 noisy samples (4 batches of 16) of a
smooth 8-feature target with Adam; the train MSE falls to ~0 while the validation MSE, on 512 fresh samples,
climbs ~50% from its early minimum as the net fits the noise. Fix: 16x more data (and stop on the val minimum)."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import mlp, mse_loss, regression_batches
from _zoo import write_logged_checkpoint

ROOT_CAUSE = "overfitting"
NOISE, FEATURES = 0.5, 8


def _setup(n_batches: int) -> triage.Setup:
    model = mlp([FEATURES, 512, 512, 1])
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=mse_loss,
                        batches=regression_batches(batch_size=16, n_batches=n_batches, features=FEATURES,
                                                   noise=NOISE),
                        val_batches=regression_batches(batch_size=64, n_batches=8, features=FEATURES,
                                                       noise=NOISE, seed=1))


def setup() -> triage.Setup:
    return _setup(n_batches=4)


def fixed_setup() -> triage.Setup:
    return _setup(n_batches=64)


def write_checkpoint(path):
    return write_logged_checkpoint(setup, path, steps=300, val_every=10)
