"""clipping_too_aggressive (regression, a "standard" clip of 1.0): an MLP regressing targets in raw units (spread
~+-60) with MSE and SGD+momentum, gradient norm clipped at 1.0 as in a language-model recipe; here the gradient
norm is in the hundreds, so every step is cut ~100x and the loss crawls. Fix: clip at 100 (a bound on outliers,
not on every step)."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import mlp, mse_loss, regression_batches
from _zoo import write_run_checkpoint

ROOT_CAUSE = "clipping_too_aggressive"
FAULTY_CLIP, FIXED_CLIP = 1.0, 100.0


def _setup(clip: float) -> triage.Setup:
    model = mlp([16, 64, 64, 1])
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
                        loss_fn=mse_loss, batches=regression_batches(target_scale=30.0), grad_clip=clip)


def setup() -> triage.Setup:
    return _setup(FAULTY_CLIP)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_CLIP)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=80)
