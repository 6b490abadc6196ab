"""fp16_overflow: a 1-D CNN with BatchNorm on raw ADC counts (traces scaled to ~±20000) trained under fp16
autocast: the first convolution's sums pass fp16's 65504 and the loss is NaN/inf from the first step, while
BatchNorm makes the raw scale harmless in fp32 or bf16. Fix: bf16 autocast (or scale the inputs)."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import PulseCNN, pulse_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "fp16_overflow"
ADC_SCALE = 20000.0


def _setup(precision: str) -> triage.Setup:
    model = PulseCNN(norm=True)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=pulse_batches(amplitude=ADC_SCALE), precision=precision)


def setup() -> triage.Setup:
    return _setup("fp16")


def fixed_setup() -> triage.Setup:
    return _setup("bf16")


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=0)
