"""exploding_gradients: an MLP on the digits where every batch holds one glitched row (a reading in raw units,
x300, as a sensor fault would give): that row's gradient is tens of times the others', and each step it dominates
throws SGD with momentum (lr=0.1) back to chance, so the loss never settles. A lower LR is too slow to learn
between the glitches (lr x0.1 and below stay near chance for 40 steps). Fix: clip the global gradient norm at 1.0:
the glitch steps are bounded, the ordinary ones (norm ~1) are not, and the run trains."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "exploding_gradients"
LR = 0.1
GLITCH = 300.0  # the glitched row's scale against standardised inputs


def glitched_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The digits batches with row i of batch i multiplied by GLITCH (one glitch per batch, never the same row)."""
    out = []
    for i, (x, y) in enumerate(digits_batches()):
        x = x.clone()
        x[i % len(x)] *= GLITCH
        out.append((x, y))
    return out


def _setup(grad_clip: float | None) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                        loss_fn=cross_entropy, batches=glitched_batches(), grad_clip=grad_clip)


def setup() -> triage.Setup:
    return _setup(grad_clip=None)


def fixed_setup() -> triage.Setup:
    return _setup(grad_clip=1.0)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=0)
