"""lr_too_high: a small patch transformer (ViT) on the digits with AdamW + OneCycleLR whose max_lr=0.1 is
ten times what a transformer tolerates: as the one-cycle warmup climbs to its peak the loss jumps back up
and the run stays near chance (ln 10). Fix: max_lr=0.01."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import PatchTransformer
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "lr_too_high"
TOTAL_STEPS = 400


def _setup(max_lr: float) -> triage.Setup:
    model = PatchTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=max_lr, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=TOTAL_STEPS,
                                                    pct_start=0.1)
    return triage.Setup(model=model, optimizer=optimizer, scheduler=scheduler, loss_fn=cross_entropy,
                        batches=digits_image_batches(), total_steps=TOTAL_STEPS)


def setup() -> triage.Setup:
    return _setup(0.1)


def fixed_setup() -> triage.Setup:
    return _setup(0.01)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=40)  # at the top of the warmup
