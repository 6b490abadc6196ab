"""vanishing_gradients: a 10-layer 1-D CNN with sigmoid activations and no normalisation on pulse traces, SGD with
momentum: each sigmoid passes at most a quarter of the gradient, the first convolutions get gradients orders of
magnitude below the head's and the loss sits at chance (ln 4). Fix: ReLU + BatchNorm in each block."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import pulse_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "vanishing_gradients"
DEPTH, CHANNELS = 10, 16


class DeepConv1d(nn.Module):
    def __init__(self, modern: bool):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(DEPTH):
            layers.append(nn.Conv1d(1 if i == 0 else CHANNELS, CHANNELS, 3, padding=1))
            layers += [nn.BatchNorm1d(CHANNELS), nn.ReLU()] if modern else [nn.Sigmoid()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(CHANNELS, 4)

    def forward(self, x):
        return self.head(self.features(x).mean(-1))


def _setup(modern: bool) -> triage.Setup:
    model = DeepConv1d(modern)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=pulse_batches())


def setup() -> triage.Setup:
    return _setup(modern=False)


def fixed_setup() -> triage.Setup:
    return _setup(modern=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=40)
