"""train_val_overlap: half of the validation digits are copies of training digits (the split was made after an
augmentation step that duplicated rows), so the validation loss looks better than the model is. Fix: deduplicate."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "train_val_overlap"
VAL_OFFSET = 1024  # held-out digits start after the 16 training batches of 64


def leaky_validation(train, held_out):
    """The bug: each validation batch is half held-out digits, half copies of training digits."""
    out = []
    for (tx, ty), (vx, vy) in zip(train, held_out):
        half = len(vx) // 2
        out.append((torch.cat([vx[:half], tx[:half]]), torch.cat([vy[:half], ty[:half]])))
    return out


def _setup(val_batches) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=cross_entropy, batches=digits_batches(), val_batches=val_batches)


def held_out() -> list:
    return digits_batches(batch_size=64, n_batches=8, offset=VAL_OFFSET)


def setup() -> triage.Setup:
    return _setup(leaky_validation(digits_batches(), held_out()))


def fixed_setup() -> triage.Setup:
    return _setup(held_out())


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=150)
