"""lr_schedule_decayed: MultiStepLR(milestones=[30, 60, 90], gamma=0.1) written for a 150-epoch run but stepped
after every batch: by step 90 the LR is 1e-3 of its peak and the patch transformer on the digits stops learning
after its first drop. Fix: milestones in steps (epochs x batches per epoch)."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import PatchTransformer
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "lr_schedule_decayed"
BATCHES_PER_EPOCH, EPOCHS = 16, 150
EPOCH_MILESTONES = [30, 60, 90]


def _setup(per_batch_milestones: bool) -> triage.Setup:
    model = PatchTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    scale = 1 if per_batch_milestones else BATCHES_PER_EPOCH
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, [m * scale for m in EPOCH_MILESTONES], gamma=0.1)
    return triage.Setup(model=model, optimizer=optimizer, scheduler=scheduler, loss_fn=cross_entropy,
                        batches=digits_image_batches(), total_steps=BATCHES_PER_EPOCH * EPOCHS)


def setup() -> triage.Setup:
    return _setup(per_batch_milestones=True)


def fixed_setup() -> triage.Setup:
    return _setup(per_batch_milestones=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=100)
