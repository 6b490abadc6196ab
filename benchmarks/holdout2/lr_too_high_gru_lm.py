"""lr_too_high: a GRU language model (next-token, per-token cross-entropy) on 64-token sequences trained with
plain SGD at lr=5.0: the first steps throw the loss to ~4 (chance is ln 16 = 2.8) and it stays far above what
the language allows (~1.05). Fix: lr=0.5."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import GRULanguageModel, markov_text_batches, next_token_loss
from _zoo import write_run_checkpoint

ROOT_CAUSE = "lr_too_high"
FAULTY_LR, FIXED_LR = 5.0, 0.5


def _setup(lr: float) -> triage.Setup:
    model = GRULanguageModel()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr),
                        loss_fn=next_token_loss, batches=markov_text_batches(seq_len=64))


def setup() -> triage.Setup:
    return _setup(FAULTY_LR)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_LR)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=20)
