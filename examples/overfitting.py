"""overfitting: a 64-256-256-10 MLP memorises 128 training digits (8 batches of 16, a fifth mislabelled, as real
annotations are): train loss goes to ~0 while validation loss climbs from its early minimum.
Fix: 7x more data and weight decay (and stop on the validation minimum)."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_logged_checkpoint


ROOT_CAUSE = "overfitting"
VAL_OFFSET = 1024  # validation digits come after every training example this zoo uses
NOISE = 0.2


def noisy_labels(batches, fraction: float = NOISE):
    """Replace `fraction` of the labels with random classes (seeded): annotation noise."""
    g = torch.Generator().manual_seed(2)
    out = []
    for x, y in batches:
        flip = torch.rand(len(y), generator=g) < fraction
        out.append((x, torch.where(flip, torch.randint(0, 10, y.shape, generator=g), y)))
    return out


def _setup(batch_size: int, weight_decay: float) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    return triage.Setup(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3,
                                                                 weight_decay=weight_decay),
                        loss_fn=cross_entropy, batches=noisy_labels(digits_batches(batch_size=batch_size, n_batches=8)),
                        val_batches=digits_batches(batch_size=64, n_batches=8, offset=VAL_OFFSET))


def setup() -> triage.Setup:
    return _setup(batch_size=16, weight_decay=0.0)


def fixed_setup() -> triage.Setup:
    return _setup(batch_size=112, weight_decay=1.0)  # 896 training digits, still disjoint from validation


def write_checkpoint(path):
    return write_logged_checkpoint(setup, path, steps=150, val_every=10)
