"""clipping_too_aggressive: gradients clipped to a global norm of 1e-3 while their norm is ~1: every SGD step is
a thousand times too short and the loss crawls. Fix: clip at 1.0 (a bound on outliers, not on every step)."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "clipping_too_aggressive"
FAULTY_CLIP, FIXED_CLIP = 1e-3, 1.0


def _setup(clip: float) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_batches(), grad_clip=clip)


def setup() -> triage.Setup:
    return _setup(FAULTY_CLIP)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_CLIP)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
