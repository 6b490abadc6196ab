"""lr_too_high: an MLP on the digits trained by SGD with momentum at lr=1.0: the loss falls to 0.6, then spikes
(4 to 20) and settles at chance level (~2.2); at lr=0.1 (x0.1) the same run trains."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "lr_too_high"
FAULTY_LR, FIXED_LR = 1.0, 0.1


def _setup(lr: float) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_batches())


def setup() -> triage.Setup:
    return _setup(FAULTY_LR)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_LR)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=3)
