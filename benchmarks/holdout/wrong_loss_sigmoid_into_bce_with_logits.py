"""wrong_loss (sigmoid twice): a multi-label MLP on the digits (even, >= 5, prime, has a loop) that ends in
nn.Sigmoid, trained with BCEWithLogitsLoss (which applies the sigmoid again): the scores the loss sees live in
(0.5, 0.73), so the loss cannot go below ~0.50 (a positive's best is -log(sigmoid(1)) = 0.31, a negative's
-log(1 - sigmoid(0)) = 0.69) and its gradient is squashed. Fix: drop the final Sigmoid (logits in)."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch
from torch import nn

import triage
from _holdout import mlp, multilabel_digit_batches
from _zoo import write_run_checkpoint

ROOT_CAUSE = "wrong_loss"


def bce_with_logits(model, batch):
    x, y = batch
    return nn.functional.binary_cross_entropy_with_logits(model(x), y)


def _setup(sigmoid_output: bool) -> triage.Setup:
    body = mlp([64, 128, 128, 4])
    model = nn.Sequential(body, nn.Sigmoid()) if sigmoid_output else body
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=bce_with_logits, batches=multilabel_digit_batches())


def setup() -> triage.Setup:
    return _setup(sigmoid_output=True)


def fixed_setup() -> triage.Setup:
    return _setup(sigmoid_output=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=200)
