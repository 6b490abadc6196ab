"""dead_relu: a ReLU MLP on the breast-cancer table fed in raw units (areas up to ~4000) with SGD at lr=0.01: the
first step's gradient is huge, it throws the first layer's weights so that ~98% of its units are negative for
every patient; they never fire again and the loss sits at the class-prior entropy (~0.66).
Fix: standardise the inputs (the same net and lr then train)."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "dead_relu"


def _setup(standardise: bool) -> triage.Setup:
    model = nn.Sequential(nn.Linear(30, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                        loss_fn=cross_entropy, batches=table_batches("breast_cancer", standardise=standardise))


def setup() -> triage.Setup:
    return _setup(standardise=False)


def fixed_setup() -> triage.Setup:
    return _setup(standardise=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=40)
