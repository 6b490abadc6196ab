"""vanishing_gradients: a 12-layer sigmoid MLP with PyTorch's default init trained by SGD: the first layers get
gradients orders of magnitude below the last, and the loss stays at chance. Fix: ReLU with Kaiming init."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "vanishing_gradients"
DEPTH, WIDTH = 12, 64


def deep_mlp(activation: type[nn.Module], kaiming: bool) -> nn.Sequential:
    """DEPTH linear layers: 64 -> WIDTH ... WIDTH -> 10, `activation` between them."""
    layers: list[nn.Module] = []
    widths = [64] + [WIDTH] * (DEPTH - 1)
    for fan_in, fan_out in zip(widths, widths[1:]):
        linear = nn.Linear(fan_in, fan_out)
        if kaiming:
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
            nn.init.zeros_(linear.bias)
        layers += [linear, activation()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


def _setup(model: nn.Module) -> triage.Setup:
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_batches())


def setup() -> triage.Setup:
    return _setup(deep_mlp(nn.Sigmoid, kaiming=False))


def fixed_setup() -> triage.Setup:
    return _setup(deep_mlp(nn.ReLU, kaiming=True))


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=100)
