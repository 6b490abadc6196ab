"""exploding_gradients: an Elman RNN with ReLU non-linearity (nn.RNN(nonlinearity="relu")) on 64-step pulse
traces, recurrent weights initialised orthogonal x1.3 "to remember longer": backprop through 64 steps
multiplies the gradient by ~1.3 per step and SGD updates explode to NaN within a few steps.
Fix: clip the global gradient norm at 1.0."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import pulse_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "exploding_gradients"


class PulseRNN(nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.rnn = nn.RNN(1, dim, nonlinearity="relu", batch_first=True)
        nn.init.orthogonal_(self.rnn.weight_hh_l0, gain=1.3)
        self.head = nn.Linear(dim, 4)

    def forward(self, x):  # x: (B, 1, L) -> sequence (B, L, 1)
        out, _ = self.rnn(x.transpose(1, 2))
        return self.head(out[:, -1])


def _setup(clip) -> triage.Setup:
    model = PulseRNN()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                        loss_fn=cross_entropy, batches=pulse_batches(), grad_clip=clip)


def setup() -> triage.Setup:
    return _setup(None)


def fixed_setup() -> triage.Setup:
    return _setup(1.0)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=2)
