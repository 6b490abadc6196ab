"""dead_relu (convolutional family): a ReLU CNN on 8x8 digits first ran at lr=5 (meant 0.5), blew up, and was resumed at
lr=0.02; the blow-up had left the second conv layer dead (no ReLU there ever fires again). Fix: lr=0.02 from the start."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_image_batches, train_plain

ROOT_CAUSE = "dead_relu"
BLOWUP_LR, LR = 5.0, 0.02
BLOWUP_STEPS, RESUMED_STEPS = 5, 250


def relu_cnn() -> nn.Sequential:
    """(B, 1, 8, 8) -> conv-ReLU x2 (B, 32, 8, 8) -> 2x2 max-pool (B, 32, 4, 4) -> logits (B, 10)."""
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16, 10))


def _setup() -> triage.Setup:
    model = relu_cnn()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_image_batches())


def setup() -> triage.Setup:
    return _setup()


def fixed_setup() -> triage.Setup:
    return _setup()  # the same run, never blown up: what a fresh start at the lower lr gives


def write_checkpoint(path):
    """The run's history: BLOWUP_STEPS at BLOWUP_LR, then resumed at LR (what setup() builds) until noticed."""
    torch.manual_seed(0)
    run = setup()
    for group in run.optimizer.param_groups:
        group["lr"] = BLOWUP_LR
    history = train_plain(run, BLOWUP_STEPS)
    for group in run.optimizer.param_groups:
        group["lr"] = LR
    history += train_plain(run, RESUMED_STEPS)
    return triage.save_checkpoint(path, run.model, run.optimizer, step=len(history), history=history)
