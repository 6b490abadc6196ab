"""overfitting: a wide MLP (30-512-512-2, Adam) on only 64 breast-cancer patients (4 batches of 16), validated on
256 others: train loss goes to ~0 while validation loss turns up after its early minimum.
Fix: train on the full 320 and add weight decay (and keep the validation-best checkpoint)."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import cross_entropy, write_logged_checkpoint

ROOT_CAUSE = "overfitting"


def _setup(n_train: int, weight_decay: float) -> triage.Setup:
    model = nn.Sequential(nn.Linear(30, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2))
    return triage.Setup(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3,
                                                                 weight_decay=weight_decay),
                        loss_fn=cross_entropy, batches=table_batches("breast_cancer", batch_size=16, stop=n_train),
                        val_batches=table_batches("breast_cancer", batch_size=64, start=313))


def setup() -> triage.Setup:
    return _setup(n_train=64, weight_decay=0.0)


def fixed_setup() -> triage.Setup:
    return _setup(n_train=313, weight_decay=0.5)


def write_checkpoint(path):
    return write_logged_checkpoint(setup, path, steps=200, val_every=10)
