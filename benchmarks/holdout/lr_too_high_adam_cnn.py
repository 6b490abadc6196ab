"""lr_too_high (Adam on a CNN): a CNN without normalisation layers on the 8x8 digits, batches of 32, trained by
Adam at lr=0.1 (a value copied from an SGD recipe): the first updates throw the loss from 2.3 to tens and it
settles at chance. Fix: lr=0.01 (x0.1) trains."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import PlainCNN
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "lr_too_high"
FAULTY_LR, FIXED_LR = 0.1, 0.01


def _setup(lr: float) -> triage.Setup:
    model = PlainCNN()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                        loss_fn=cross_entropy, batches=digits_image_batches(batch_size=32, n_batches=24))


def setup() -> triage.Setup:
    return _setup(FAULTY_LR)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_LR)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=2)
