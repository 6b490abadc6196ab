"""fp16_overflow (a Linear into LayerNorm): an MLP on tabular loan data fed raw units (income and amounts in
dollars, up to ~1e5), with a LayerNorm after the first Linear that makes the scale harmless in fp32; under fp16
autocast that Linear's output passes fp16's ceiling of 65504, becomes Inf, and LayerNorm turns it into NaN.
Fix: bf16 autocast (fp32's range)."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch
from torch import nn

import triage
from _holdout import tabular_class_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "fp16_overflow"


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(12, 128), nn.LayerNorm(128), nn.GELU(),
                         nn.Linear(128, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 3))


def _setup(precision: str) -> triage.Setup:
    model = _model()
    return triage.Setup(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=tabular_class_batches(), precision=precision)


def setup() -> triage.Setup:
    return _setup("fp16")


def fixed_setup() -> triage.Setup:
    return _setup("bf16")


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=0)
