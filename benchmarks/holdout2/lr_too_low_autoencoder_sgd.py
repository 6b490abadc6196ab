"""lr_too_low: a digits autoencoder (MSE reconstruction, sigmoid output) trained with plain SGD at lr=1e-3, a
value from an Adam recipe: the reconstruction error creeps down a fraction of a percent per hundred steps.
Fix: lr=0.5 for plain SGD on this loss scale (or Adam at 1e-3)."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import AutoEncoder, digit_autoencoder_batches, reconstruction_loss
from _zoo import write_run_checkpoint

ROOT_CAUSE = "lr_too_low"


def _setup(lr: float) -> triage.Setup:
    model = AutoEncoder()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                        loss_fn=reconstruction_loss, batches=digit_autoencoder_batches())


def setup() -> triage.Setup:
    return _setup(1e-3)


def fixed_setup() -> triage.Setup:
    return _setup(0.5)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=100)
