"""vanishing_gradients (a deep tanh net): a 20-layer, 48-wide tanh MLP with PyTorch's default Linear init (weights
~U(+-1/sqrt(fan_in)), a gain of ~1/sqrt(3) per layer) on the digits, SGD with momentum: the signal and the
gradient shrink ~1.7x per layer, the first layers get gradients orders of magnitude below the last and the
loss sits at chance. Fix: tanh's Xavier gain (5/3), so each layer keeps the scale."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch
from torch import nn

import triage
from _holdout import mlp
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "vanishing_gradients"
DEPTH, WIDTH = 20, 48


def deep_tanh(xavier_tanh_gain: bool) -> nn.Sequential:
    model = mlp([64] + [WIDTH] * (DEPTH - 1) + [10], activation=nn.Tanh)
    if xavier_tanh_gain:
        for layer in model:
            if isinstance(layer, nn.Linear):
                nn.init.xavier_normal_(layer.weight, gain=nn.init.calculate_gain("tanh"))
                nn.init.zeros_(layer.bias)
    return model


def _setup(xavier_tanh_gain: bool) -> triage.Setup:
    model = deep_tanh(xavier_tanh_gain)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_batches())


def setup() -> triage.Setup:
    return _setup(xavier_tanh_gain=False)


def fixed_setup() -> triage.Setup:
    return _setup(xavier_tanh_gain=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=100)
