"""label_bug: iris species exported 1-based (1, 2, 3, as a spreadsheet numbers them) into a 3-way classifier:
label 3 is out of range for the 3 logits and cross_entropy raises "Target 3 is out of bounds" on the first
batch that holds one. Fix: subtract 1 from the labels."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "label_bug"


def _setup(one_based: bool) -> triage.Setup:
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3))
    batches = [(x, y + 1 if one_based else y) for x, y in table_batches("iris", batch_size=16)]
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                        loss_fn=cross_entropy, batches=batches)


def setup() -> triage.Setup:
    return _setup(one_based=True)


def fixed_setup() -> triage.Setup:
    return _setup(one_based=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=0)  # the first step raised
