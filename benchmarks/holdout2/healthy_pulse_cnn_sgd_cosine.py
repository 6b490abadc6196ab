"""healthy: a 1-D CNN with BatchNorm on pulse traces, SGD with Nesterov momentum and a cosine schedule over 1000
steps, checkpointed at step 40. Nothing is wrong."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import PulseCNN, pulse_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "healthy"
TOTAL_STEPS = 1000


def setup() -> triage.Setup:
    model = PulseCNN(norm=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=TOTAL_STEPS)
    return triage.Setup(model=model, optimizer=optimizer, scheduler=scheduler, loss_fn=cross_entropy,
                        batches=pulse_batches(), total_steps=TOTAL_STEPS, grad_clip=5.0)


fixed_setup = setup


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=40)
