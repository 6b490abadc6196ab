"""lr_schedule_decayed: ExponentialLR(gamma=0.9) stepped every batch (meant per epoch) for a 2000-step run: the
loss drops early, then the LR is ~2e-4 of its peak by step 80 and the run stalls. Fix: cosine over total_steps."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "lr_schedule_decayed"
PEAK_LR, TOTAL_STEPS = 0.1, 2000


def _setup(make_scheduler) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=PEAK_LR, momentum=0.9)
    return triage.Setup(model=model, optimizer=optimizer, scheduler=make_scheduler(optimizer),
                        loss_fn=cross_entropy, batches=digits_batches(), total_steps=TOTAL_STEPS)


def per_batch_exponential(optimizer):
    return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)  # the bug: a per-epoch gamma


def cosine_over_run(optimizer):
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=TOTAL_STEPS)


def setup() -> triage.Setup:
    return _setup(per_batch_exponential)


def fixed_setup() -> triage.Setup:
    return _setup(cosine_over_run)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=80)
