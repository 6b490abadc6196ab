"""healthy (MLP): a two-hidden-layer MLP on the digits, SGD with momentum at lr=0.05: it trains normally.
Nothing to fix; fixed_setup() is the same run."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "healthy"


def setup() -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_batches())


def fixed_setup() -> triage.Setup:
    return setup()


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=5)  # early: most of the progress is still ahead
