"""healthy (converged): a 64-128-10 MLP on the digits trained by SGD with momentum at lr=0.05 for 400 steps: it has
converged (train loss ~0.01) and the validation loss sits at its minimum. A finished, good run must not be called
a fault. Nothing to fix; fixed_setup() is the same run."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import mlp
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "healthy"
VAL_OFFSET = 1024  # held-out digits come after the 16 training batches of 64


def setup() -> triage.Setup:
    model = mlp([64, 128, 10])
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_batches(),
                        val_batches=digits_batches(batch_size=64, n_batches=8, offset=VAL_OFFSET))


def fixed_setup() -> triage.Setup:
    return setup()


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=400)
