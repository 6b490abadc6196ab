"""bad_initialization: a residual MLP on the breast-cancer table whose author initialised every Linear weight
with nn.init.normal_(std=1.0) ("unit variance"): each residual block multiplies the signal's scale by ~10, the
logits start in the thousands and the loss is orders of magnitude above ln 2; Adam never recovers in the run.
Fix: PyTorch's default (Kaiming-uniform) init."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import ResidualMLP, table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "bad_initialization"


def _model(unit_normal: bool) -> nn.Module:
    model = ResidualMLP(30, 2, width=64, depth=4, norm=False)
    if unit_normal:
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=1.0)
                nn.init.zeros_(module.bias)
    return model


def _setup(unit_normal: bool) -> triage.Setup:
    model = _model(unit_normal)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=table_batches("breast_cancer"))


def setup() -> triage.Setup:
    return _setup(unit_normal=True)


def fixed_setup() -> triage.Setup:
    return _setup(unit_normal=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=10)
