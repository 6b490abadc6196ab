"""label_bug: the labels were shuffled separately from the images (two independently shuffled arrays), so they
are unrelated to the inputs and the loss stays at chance, ln(10). Fix: keep each image with its own label."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "label_bug"


def shuffled_labels(batches):
    """The bug: the labels go through their own permutation, the images do not."""
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    y = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(1))]
    size = len(batches[0][0])
    return [(x[i:i + size], y[i:i + size]) for i in range(0, len(x), size)]


def _setup(batches) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                        loss_fn=cross_entropy, batches=batches)


def setup() -> triage.Setup:
    return _setup(shuffled_labels(digits_batches()))


def fixed_setup() -> triage.Setup:
    return _setup(digits_batches())


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=80)
