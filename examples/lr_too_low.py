"""lr_too_low: an MLP on the digits trained by plain SGD at lr=3e-3, whose loss creeps (a few % per 60 steps).
Fix: raise the learning rate (lr=0.1 trains within 40 steps; even lr x10 makes clear progress)."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "lr_too_low"
FAULTY_LR, FIXED_LR = 3e-3, 0.1


def _setup(lr: float) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr),
                        loss_fn=cross_entropy, batches=digits_batches())


def setup() -> triage.Setup:
    return _setup(FAULTY_LR)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_LR)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
