"""healthy (LSTM): a 2-layer LSTM classifier counting the majority token of synthetic sequences, Adam at lr=1e-2,
batches of 32: it trains normally. Nothing to fix; fixed_setup() is the same run."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import LSTMClassifier
from _zoo import cross_entropy, majority_token_batches, write_run_checkpoint

ROOT_CAUSE = "healthy"


def setup() -> triage.Setup:
    model = LSTMClassifier()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                        loss_fn=cross_entropy, batches=majority_token_batches(batch_size=32, n_batches=24))


def fixed_setup() -> triage.Setup:
    return setup()


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)  # mid-run: the loss is on its way down
