"""nonfinite_data (Inf in the targets): a regression MLP predicting log(price) of synthetic tabular listings, with
the target made by torch.log(price): a few listings in batch 6 have a price of 0 (gifted transfers), so their
target is -Inf, and the MSE is Inf at the first step that sees them (then NaN weights). The inputs are clean.
Fix: drop the zero-price rows (or use log1p)."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import mlp, mse_loss, regression_batches
from _zoo import write_run_checkpoint

ROOT_CAUSE = "nonfinite_data"
BAD_BATCH = 6
LOCATION = {"batch": BAD_BATCH}  # what triage should point at


def _batches(drop_zero_prices: bool):
    out = []
    for i, (x, y) in enumerate(regression_batches(batch_size=32, n_batches=12)):
        price = torch.exp(y + 12.0)  # prices around $160k
        if i == BAD_BATCH:
            price[[3, 17, 20]] = 0.0  # gifted transfers, recorded at $0
        keep = price > 0 if drop_zero_prices else torch.ones_like(price, dtype=torch.bool)
        out.append((x[keep], torch.log(price[keep]) - 12.0))  # the target: log price, centred
    return out


def _setup(drop_zero_prices: bool) -> triage.Setup:
    model = mlp([16, 64, 64, 1])
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=mse_loss, batches=_batches(drop_zero_prices))


def setup() -> triage.Setup:
    return _setup(drop_zero_prices=False)


def fixed_setup() -> triage.Setup:
    return _setup(drop_zero_prices=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=BAD_BATCH)  # trained up to the batch with the -Inf targets
