"""exploding_gradients (deep MLP regression): a 10-layer He-initialised ReLU MLP without normalisation fits
house-price-like targets in units of $10k (spread +-60) with MSE and SGD+momentum at lr=1e-3: the first
gradients are huge (the error is large and depth multiplies it), the loss overflows to Inf within a few steps; lr x0.1
still blows up. Fix: clip the global gradient norm at 1.0."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch
from torch import nn

import triage
from _holdout import mlp, mse_loss, regression_batches
from _zoo import write_run_checkpoint

ROOT_CAUSE = "exploding_gradients"
DEPTH, WIDTH, TARGET_SCALE = 10, 128, 30.0


def _model() -> nn.Sequential:
    model = mlp([16] + [WIDTH] * (DEPTH - 1) + [1])
    for layer in model:
        if isinstance(layer, nn.Linear):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")  # He init: keeps the forward scale
            nn.init.zeros_(layer.bias)
    return model


def _setup(grad_clip: float | None) -> triage.Setup:
    model = _model()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
                        loss_fn=mse_loss, batches=regression_batches(target_scale=TARGET_SCALE),
                        grad_clip=grad_clip)


def setup() -> triage.Setup:
    return _setup(grad_clip=None)


def fixed_setup() -> triage.Setup:
    return _setup(grad_clip=1.0)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=0)
