"""bad_batch: an MLP on the digits where one shard was exported without standardisation and in other units
(batch 5 of 16: inputs x1000): its loss and gradient are outliers by orders of magnitude and the run is
wrecked at it. Fix: drop (or re-export) batch 5; the other 15 train normally."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "bad_batch"
BAD_BATCH = 5
LOCATION = {"batch": BAD_BATCH}  # what triage should point at


def _batches(drop_bad: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    batches = digits_batches()
    x, y = batches[BAD_BATCH]
    batches[BAD_BATCH] = (x * 1000.0, y)
    if drop_bad:
        del batches[BAD_BATCH]
    return batches


def _setup(drop_bad: bool) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=_batches(drop_bad))


def setup() -> triage.Setup:
    return _setup(drop_bad=False)


def fixed_setup() -> triage.Setup:
    return _setup(drop_bad=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=BAD_BATCH)  # trained up to the corrupt batch
