"""lr_schedule_decayed (StepLR stepped per batch): a CNN without normalisation on the digits, SGD with momentum at
0.05 and StepLR(step_size=30, gamma=0.1) meant as "x0.1 every 30 epochs" but stepped after every batch: by step
120 the LR is 1e-4 of its peak and the run, 1% into its planned 12000 steps, has stalled.
Fix: step the scheduler per epoch (here: a StepLR over batches, step_size=3000)."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import PlainCNN
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "lr_schedule_decayed"
TOTAL_STEPS = 12000


def _setup(step_size: int) -> triage.Setup:
    model = PlainCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return triage.Setup(model=model, optimizer=optimizer,
                        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=0.1),
                        loss_fn=cross_entropy, batches=digits_image_batches(batch_size=32, n_batches=24),
                        total_steps=TOTAL_STEPS)


def setup() -> triage.Setup:
    return _setup(step_size=30)  # the bug: an epoch count used as a batch count


def fixed_setup() -> triage.Setup:
    return _setup(step_size=3000)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=120)
