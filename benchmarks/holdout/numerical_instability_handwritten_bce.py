"""numerical_instability (log of a probability that rounds to 0): a multi-label MLP on the digits (even, >= 5,
prime, has a loop) trained with a hand-written binary cross-entropy, y*log(sigmoid(z)) + (1-y)*log(1-sigmoid(z)).
Once the model grows confident, some logit passes ~17, sigmoid(z) rounds to exactly 1.0 in fp32, log(1 - 1) is
-Inf and 0 * -Inf is NaN: the loss goes NaN at any learning rate. Fix: binary_cross_entropy_with_logits (which
computes the log-sigmoid stably)."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch
from torch import nn

import triage
from _holdout import mlp, multilabel_digit_batches
from _zoo import write_run_checkpoint

ROOT_CAUSE = "numerical_instability"


def handwritten_bce(model, batch):
    x, y = batch
    p = torch.sigmoid(model(x))
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()  # the bug: log(0) once p rounds to 1


def bce_with_logits(model, batch):
    x, y = batch
    return nn.functional.binary_cross_entropy_with_logits(model(x), y)


def _setup(loss_fn) -> triage.Setup:
    model = mlp([64, 256, 256, 4])
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=loss_fn, batches=multilabel_digit_batches())


def setup() -> triage.Setup:
    return _setup(handwritten_bce)


def fixed_setup() -> triage.Setup:
    return _setup(bce_with_logits)


FINITE_STEPS = 19  # measured with _zoo.train_plain: step 19 is the first NaN loss


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=FINITE_STEPS)
