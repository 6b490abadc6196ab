"""lr_too_low (recurrent family): a GRU counting tokens in synthetic sequences, trained by Adam at lr=2e-4,
crawls for hundreds of steps. Fix: lr=1e-2 (lr x10 already makes clear progress)."""

from __future__ import annotations

import torch

import triage
from _zoo import SequenceClassifier, cross_entropy, majority_token_batches, write_run_checkpoint

ROOT_CAUSE = "lr_too_low"
FAULTY_LR, FIXED_LR = 2e-4, 1e-2


def _setup(lr: float) -> triage.Setup:
    model = SequenceClassifier()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                        loss_fn=cross_entropy, batches=majority_token_batches())


def setup() -> triage.Setup:
    return _setup(FAULTY_LR)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_LR)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
