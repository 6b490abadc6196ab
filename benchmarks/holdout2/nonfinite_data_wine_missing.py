"""nonfinite_data: the wine table exported with missing measurements as NaN (a lab left 'magnesium' blank for
some samples); standardising with nan-aware statistics keeps the NaN, so the first batch holding one gives a
NaN loss and NaN weights. Adagrad on a small MLP. Fix: impute missing values (column median) before training."""

from __future__ import annotations

import _holdout2  # noqa: F401  (puts examples/ on sys.path)
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "nonfinite_data"
MISSING_COLUMN = 4  # magnesium


def _batches(impute: bool):
    g = torch.Generator().manual_seed(3)
    out = []
    for x, y in table_batches("wine", batch_size=16):
        x = x.clone()
        x[torch.rand(len(x), generator=g) < 0.1, MISSING_COLUMN] = float("nan")
        if impute:
            x = torch.nan_to_num(x, nan=0.0)  # the column is standardised: 0 is its mean
        out.append((x, y))
    return out


def _setup(impute: bool) -> triage.Setup:
    model = nn.Sequential(nn.Linear(13, 32), nn.Tanh(), nn.Linear(32, 3))
    return triage.Setup(model=model, optimizer=torch.optim.Adagrad(model.parameters(), lr=0.05),
                        loss_fn=cross_entropy, batches=_batches(impute))


def setup() -> triage.Setup:
    return _setup(impute=False)


def fixed_setup() -> triage.Setup:
    return _setup(impute=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=0)  # NaN on the first batch with a missing value
