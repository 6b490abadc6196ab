"""fp16_overflow: a 1-D CNN on raw 12-bit ADC counts (traces up to ~±2000) that normalises its first conv's
output by a hand-written RMS over time, h / h.pow(2).mean(-1).sqrt(), trained under fp16 autocast: h.pow(2)
passes fp16's 65504, the RMS is inf, the features are zeros and the loss sits at chance (ln 4) - silently, no NaN
in the loss. In fp32 or bf16 the same run learns. Fix: bf16 autocast (or compute the RMS in fp32)."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import pulse_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "fp16_overflow"
ADC_FULL_SCALE = 2048.0


class RMSNormalisedCNN(nn.Module):
    def __init__(self, channels: int = 16):
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, padding=2)
        self.conv2 = nn.Conv1d(channels, 2 * channels, 5, padding=2)
        self.head = nn.Linear(2 * channels, 4)

    def forward(self, x):  # x: (B, 1, L)
        h = self.conv1(x)
        h = h / h.pow(2).mean(-1, keepdim=True).sqrt()  # per-channel RMS over time (in the autocast dtype)
        h = torch.relu(self.conv2(torch.relu(h)))
        return self.head(h.mean(-1))


def _setup(precision: str) -> triage.Setup:
    model = RMSNormalisedCNN()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=pulse_batches(amplitude=ADC_FULL_SCALE), precision=precision)


def setup() -> triage.Setup:
    return _setup("fp16")


def fixed_setup() -> triage.Setup:
    return _setup("bf16")


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=20)
