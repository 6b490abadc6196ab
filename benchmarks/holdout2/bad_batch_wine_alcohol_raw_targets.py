"""bad_batch: regression of a wine's alcohol content from its 12 other measurements (standardised target);
one shard (batch 4) was exported before the target was standardised (raw % alcohol, ~13): its squared error is
~170x the others' and one step on it wrecks the SGD run. Fix: re-export (or drop) batch 4."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import mse, write_run_checkpoint

ROOT_CAUSE = "bad_batch"
BAD_BATCH = 4
LOCATION = {"batch": BAD_BATCH}


def _batches(drop_bad: bool):
    raw = table_batches("wine", batch_size=16, standardise=False)
    everything = torch.cat([x for x, _ in raw])
    mean, std = everything.mean(0), everything.std(0)
    out = []
    for i, (x, _) in enumerate(raw):
        z = (x - mean) / std
        target = x[:, 0] if i == BAD_BATCH else z[:, 0]  # the bug: raw % alcohol in one shard
        out.append((z[:, 1:], target))
    if drop_bad:
        del out[BAD_BATCH]
    return out


def _setup(drop_bad: bool) -> triage.Setup:
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 1))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                        loss_fn=mse, batches=_batches(drop_bad))


def setup() -> triage.Setup:
    return _setup(drop_bad=False)


def fixed_setup() -> triage.Setup:
    return _setup(drop_bad=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=BAD_BATCH)
