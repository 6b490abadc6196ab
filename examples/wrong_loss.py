"""wrong_loss: an MLP that ends in nn.Softmax trained with F.cross_entropy (which applies log_softmax again):
the loss cannot go below ln(1 + 9/e) ~ 1.46 and the gradients are squashed. Fix: drop the Softmax (logits in)."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "wrong_loss"
# A probability vector p gives cross_entropy(p, y) = -p_y + log(sum_j exp(p_j)) >= -1 + log(e + 9).
DOUBLE_SOFTMAX_FLOOR = -1.0 + float(torch.log(torch.tensor(torch.e + 9.0)))


def _setup(softmax_output: bool) -> triage.Setup:
    layers = [nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)]
    model = nn.Sequential(*layers, nn.Softmax(dim=1)) if softmax_output else nn.Sequential(*layers)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=digits_batches())


def setup() -> triage.Setup:
    return _setup(softmax_output=True)


def fixed_setup() -> triage.Setup:
    return _setup(softmax_output=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=150)
