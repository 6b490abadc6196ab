"""dead_relu: a ReLU MLP on the breast-cancer table with Adagrad at lr=1.0 (Adagrad's first step moves every
weight by ~lr, whatever its gradient): the first steps push most hidden units' pre-activations negative for
every input, those units never fire again, and the loss stalls well above what the table allows.
Fix: lr=0.01."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "dead_relu"


def _setup(lr: float) -> triage.Setup:
    model = nn.Sequential(nn.Linear(30, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
    return triage.Setup(model=model, optimizer=torch.optim.Adagrad(model.parameters(), lr=lr),
                        loss_fn=cross_entropy, batches=table_batches("breast_cancer"))


def setup() -> triage.Setup:
    return _setup(1.0)


def fixed_setup() -> triage.Setup:
    return _setup(0.01)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=30)
