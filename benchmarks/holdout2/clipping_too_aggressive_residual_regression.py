"""clipping_too_aggressive: a residual MLP regressing a wine's alcohol content with SGD and grad_clip=0.005 (a
per-parameter value-clip setting reused as a global-norm bound) while gradient norms are ~1-10: every step is a
few hundred times too short and the error barely moves. Fix: clip at 1.0."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import ResidualMLP, table_batches
from _zoo import mse, write_run_checkpoint

ROOT_CAUSE = "clipping_too_aggressive"


def _batches():
    return [(x[:, 1:], x[:, 0]) for x, _ in table_batches("wine", batch_size=16)]


def _setup(clip: float) -> triage.Setup:
    model = ResidualMLP(12, 1, width=32, depth=3)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                        loss_fn=mse, batches=_batches(), grad_clip=clip)


def setup() -> triage.Setup:
    return _setup(0.005)


def fixed_setup() -> triage.Setup:
    return _setup(1.0)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=40)
