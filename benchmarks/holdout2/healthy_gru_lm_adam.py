"""healthy: a GRU language model on the made-up Markov language, Adam at lr=5e-3, checkpointed at step 30 while
its next-token loss is still falling toward the language's entropy. Nothing is wrong."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import GRULanguageModel, markov_text_batches, next_token_loss
from _zoo import write_run_checkpoint

ROOT_CAUSE = "healthy"


def setup() -> triage.Setup:
    model = GRULanguageModel()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                        loss_fn=next_token_loss, batches=markov_text_batches())


fixed_setup = setup


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=30)
