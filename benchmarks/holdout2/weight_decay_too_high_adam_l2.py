"""weight_decay_too_high: torch.optim.Adam(weight_decay=0.5) on the wine table (a decoupled-AdamW value put into
Adam's coupled L2 term): the L2 gradient dominates Adam's normalised step, every weight is pulled toward zero
and the loss sits near chance. Fix: weight_decay=1e-4 (or AdamW)."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "weight_decay_too_high"


def _setup(weight_decay: float) -> triage.Setup:
    model = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2,
                                                                weight_decay=weight_decay),
                        loss_fn=cross_entropy, batches=table_batches("wine", batch_size=16))


def setup() -> triage.Setup:
    return _setup(0.5)


def fixed_setup() -> triage.Setup:
    return _setup(1e-4)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
