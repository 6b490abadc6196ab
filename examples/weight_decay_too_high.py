"""weight_decay_too_high: SGD with weight_decay=1.0 (an L2 term as strong as the loss) pulls every weight to zero
faster than the data pushes back: weight norms collapse ~100x, the loss sits at chance. Fix: weight_decay=5e-4."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "weight_decay_too_high"
FAULTY_WD, FIXED_WD = 1.0, 5e-4


def _setup(weight_decay: float) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=weight_decay)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=cross_entropy, batches=digits_batches())


def setup() -> triage.Setup:
    return _setup(FAULTY_WD)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_WD)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=40)
