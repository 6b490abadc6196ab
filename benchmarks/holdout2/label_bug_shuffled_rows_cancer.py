"""label_bug: the breast-cancer features were shuffled (df.sample(frac=1)) but the label column was taken from
the unshuffled frame: labels are unrelated to their inputs and the MLP's loss stays at the class-prior entropy
(~0.66). Fix: shuffle features and labels together."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "label_bug"


def _batches(aligned: bool):
    batches = table_batches("breast_cancer")
    if aligned:
        return batches
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    x = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(5))]  # the bug: x alone reshuffled
    return [(x[i:i + 32], y[i:i + 32]) for i in range(0, len(x), 32)]


def _setup(aligned: bool) -> triage.Setup:
    model = nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 2))
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=_batches(aligned))


def setup() -> triage.Setup:
    return _setup(aligned=False)


def fixed_setup() -> triage.Setup:
    return _setup(aligned=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
