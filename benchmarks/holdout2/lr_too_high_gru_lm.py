"""lr_too_high: a GRU language model (next-token, per-token cross-entropy) trained with Adam at lr=0.05
(a value tuned for a tiny MLP, copied over): the loss falls, then jumps and wanders far above its low.
Fix: lr=5e-3."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import GRULanguageModel, markov_text_batches, next_token_loss
from _zoo import write_run_checkpoint

ROOT_CAUSE = "lr_too_high"
FAULTY_LR, FIXED_LR = 0.05, 5e-3


def _setup(lr: float) -> triage.Setup:
    model = GRULanguageModel()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                        loss_fn=next_token_loss, batches=markov_text_batches())


def setup() -> triage.Setup:
    return _setup(FAULTY_LR)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_LR)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=20)
