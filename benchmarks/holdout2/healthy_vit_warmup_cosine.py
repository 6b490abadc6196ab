"""healthy: a patch transformer on the digits, AdamW lr=2e-3 with 50 steps of linear warmup then cosine decay
over 1500 steps (SequentialLR), checkpointed at step 60. Nothing is wrong."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import PatchTransformer
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "healthy"
WARMUP, TOTAL_STEPS = 50, 1500


def setup() -> triage.Setup:
    model = PatchTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler
    scheduler = sched.SequentialLR(optimizer, [sched.LinearLR(optimizer, 0.01, 1.0, total_iters=WARMUP),
                                               sched.CosineAnnealingLR(optimizer, T_max=TOTAL_STEPS - WARMUP)],
                                   milestones=[WARMUP])
    return triage.Setup(model=model, optimizer=optimizer, scheduler=scheduler, loss_fn=cross_entropy,
                        batches=digits_image_batches(), total_steps=TOTAL_STEPS, grad_clip=1.0)


fixed_setup = setup


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
