"""dead_relu: an MLP whose custom init sets every hidden bias to -3 ("start sparse"): no ReLU unit ever fires on
the data, so only the output bias learns and the loss sits at the label entropy. Fix: PyTorch's default init."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "dead_relu"
SPARSE_BIAS = -3.0


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def _sparse_init(model: nn.Sequential) -> None:
    """The faulty init: hidden pre-activations have std ~0.6 on standardised inputs, far below 3."""
    for layer in list(model)[:-1]:
        if isinstance(layer, nn.Linear):
            nn.init.constant_(layer.bias, SPARSE_BIAS)


def _setup(sparse_init: bool) -> triage.Setup:
    model = _mlp()
    if sparse_init:
        _sparse_init(model)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_batches())


def setup() -> triage.Setup:
    return _setup(sparse_init=True)


def fixed_setup() -> triage.Setup:
    return _setup(sparse_init=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
