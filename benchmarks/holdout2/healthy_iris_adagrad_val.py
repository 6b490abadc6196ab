"""healthy: a small tanh MLP on iris (120 training rows, 30 held-out for validation), Adagrad lr=0.1,
checkpointed at step 40 with validation batches: train and validation loss fall together. Nothing is wrong."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "healthy"


def setup() -> triage.Setup:
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    return triage.Setup(model=model, optimizer=torch.optim.Adagrad(model.parameters(), lr=0.1),
                        loss_fn=cross_entropy, batches=table_batches("iris", batch_size=16, stop=120),
                        val_batches=table_batches("iris", batch_size=15, start=120))


fixed_setup = setup


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=40)
