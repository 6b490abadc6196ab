"""healthy: a digits autoencoder (MSE) with AdamW + OneCycleLR (max_lr=1e-2 over 800 steps), checkpointed at
step 120, just after the warmup peak, while the reconstruction error keeps falling. Nothing is wrong."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import AutoEncoder, digit_autoencoder_batches, reconstruction_loss
from _zoo import write_run_checkpoint

ROOT_CAUSE = "healthy"
TOTAL_STEPS = 800


def setup() -> triage.Setup:
    model = AutoEncoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=TOTAL_STEPS)
    return triage.Setup(model=model, optimizer=optimizer, scheduler=scheduler, loss_fn=reconstruction_loss,
                        batches=digit_autoencoder_batches(), total_steps=TOTAL_STEPS)


fixed_setup = setup


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=120)
