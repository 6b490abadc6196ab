"""no_gradient_flow (torch.no_grad() around the encoder): an LSTM classifier on synthetic token sequences whose
forward runs the embedding and the 2-layer LSTM under torch.no_grad() (copied from its inference path to "save
memory"): the encoder gets no gradient, only the linear head learns on random features, and the loss stays high.
Fix: drop the torch.no_grad() in training."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import LSTMClassifier
from _zoo import cross_entropy, majority_token_batches, write_run_checkpoint

ROOT_CAUSE = "no_gradient_flow"


def _setup(no_grad_encoder: bool) -> triage.Setup:
    model = LSTMClassifier(no_grad_encoder=no_grad_encoder)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                        loss_fn=cross_entropy, batches=majority_token_batches(batch_size=32, n_batches=24))


def setup() -> triage.Setup:
    return _setup(no_grad_encoder=True)


def fixed_setup() -> triage.Setup:
    return _setup(no_grad_encoder=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=150)
