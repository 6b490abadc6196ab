"""vanishing_gradients: a 12-layer sigmoid MLP on the wine table with SGD: each sigmoid passes at most a quarter
of the gradient, so the first layers get gradients orders of magnitude smaller than the last and the loss sits
at chance. Fix: ReLU activations (the same depth and optimizer train)."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "vanishing_gradients"
DEPTH, WIDTH = 12, 32


def _model(activation) -> nn.Sequential:
    layers = [nn.Linear(13, WIDTH), activation()]
    for _ in range(DEPTH - 2):
        layers += [nn.Linear(WIDTH, WIDTH), activation()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 3))


def _setup(activation) -> triage.Setup:
    model = _model(activation)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=table_batches("wine", batch_size=16))


def setup() -> triage.Setup:
    return _setup(nn.Sigmoid)


def fixed_setup() -> triage.Setup:
    return _setup(nn.ReLU)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=40)
