"""nonfinite_data: an MLP on the digits whose feature pipeline writes NaN for missing pixels (batch 3, a few
rows): the first step that sees it returns a NaN loss and NaN weights. Fix: impute the missing values
(0, the mean of standardised features) before they reach the model."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "nonfinite_data"
BAD_BATCH = 3
LOCATION = {"batch": BAD_BATCH}  # what triage should point at


def _batches(impute: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    batches = digits_batches()
    x, y = batches[BAD_BATCH]
    x = x.clone()
    x[5:9, 10:20] = float("nan")  # four records with ten missing pixels each
    if impute:
        x = torch.where(torch.isnan(x), torch.zeros_like(x), x)
    batches[BAD_BATCH] = (x, y)
    return batches


def _setup(impute: bool) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                        loss_fn=cross_entropy, batches=_batches(impute))


def setup() -> triage.Setup:
    return _setup(impute=False)


def fixed_setup() -> triage.Setup:
    return _setup(impute=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=BAD_BATCH)  # trained up to the batch with the NaN
