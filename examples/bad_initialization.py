"""bad_initialization: a 6-layer ReLU MLP on the digits initialised with normal(std=1) weights ("unit
variance"), which multiplies activations ~8x per layer: the first loss is ~1e5 instead of ln(10) = 2.3.
Fix: PyTorch's default init (each layer's reset_parameters()) starts near ln(10) and trains."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "bad_initialization"
DEPTH, WIDTH = 6, 128


def _model() -> nn.Sequential:
    layers, width = [], 64
    for _ in range(DEPTH - 1):
        layers += [nn.Linear(width, WIDTH), nn.ReLU()]
        width = WIDTH
    return nn.Sequential(*layers, nn.Linear(width, 10))


def unit_normal_init(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=1.0)
            nn.init.zeros_(module.bias)


def _setup(bad_init: bool) -> triage.Setup:
    model = _model()
    if bad_init:
        unit_normal_init(model)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=digits_batches())


def setup() -> triage.Setup:
    return _setup(bad_init=True)


def fixed_setup() -> triage.Setup:
    return _setup(bad_init=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=1)
