"""wrong_loss: a GRU language model trained with F.nll_loss on raw logits (nll_loss expects log-probabilities;
the log_softmax was forgotten): the "loss" is minus the target logit, which Adam drives down without bound while
the true next-token cross-entropy gets no better. Fix: F.cross_entropy on the logits."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch.nn import functional as F

import triage
from _holdout2 import GRULanguageModel, markov_text_batches, next_token_loss
from _zoo import write_run_checkpoint

ROOT_CAUSE = "wrong_loss"


def nll_on_logits(model, batch):
    x, y = batch
    logits = model(x)
    return F.nll_loss(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))  # the bug: no log_softmax


def _setup(loss_fn) -> triage.Setup:
    model = GRULanguageModel()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=loss_fn, batches=markov_text_batches())


def setup() -> triage.Setup:
    return _setup(nll_on_logits)


def fixed_setup() -> triage.Setup:
    return _setup(next_token_loss)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=30)
