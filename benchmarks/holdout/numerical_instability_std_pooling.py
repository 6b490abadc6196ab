"""numerical_instability (sqrt without eps, backward): an x-vector-style classifier of synthetic multichannel
"audio" frames, a few clips digital silence (exact zeros, a class of its own): TDNN layers ("valid" Conv1d-ReLU),
then statistics pooling (mean and standard deviation over time) written as sqrt(var) with no eps. On a silent
clip every unit is constant over time and var = 0: the forward is a finite 0, but sqrt's gradient there is
1/(2*sqrt(0)) = Inf and the step's gradients turn NaN, at any learning rate. Fix: sqrt(var + 1e-5)."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch
from torch import nn

import triage
from _holdout import tone_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "numerical_instability"
LOCATION = {"module": "pool"}  # what triage should point at


class StatsPooling(nn.Module):
    """(B, C, T) -> (B, 2C): mean and standard deviation over time."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, h):
        mean = h.mean(-1)
        var = (h - mean[..., None]).pow(2).mean(-1)
        return torch.cat([mean, torch.sqrt(var + self.eps)], -1)


class XVector(nn.Module):
    def __init__(self, eps: float, channels: int = 8, hidden: int = 64, classes: int = 5):
        super().__init__()
        self.frames = nn.Sequential(nn.Conv1d(channels, hidden, 5), nn.ReLU(),  # TDNN layers: "valid" convs
                                    nn.Conv1d(hidden, hidden, 3, dilation=2), nn.ReLU())  # (B, hidden, T - 8)
        self.pool = StatsPooling(eps)
        self.head = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.head(self.pool(self.frames(x)))


def _setup(eps: float) -> triage.Setup:
    model = XVector(eps)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=tone_batches(silence=0.03))


def setup() -> triage.Setup:
    return _setup(eps=0.0)


def fixed_setup() -> triage.Setup:
    return _setup(eps=1e-5)


FINITE_STEPS = 0  # measured with _zoo.train_plain: batch 0 holds silent clips, the first step's gradients are NaN


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=FINITE_STEPS)
