"""healthy (CNN): a BatchNorm CNN on the standardised digits as 1x8x8 images, SGD with momentum at lr=0.005:
it trains normally. Nothing to fix; fixed_setup() is the same run."""

from __future__ import annotations

import torch

import triage
from _zoo import DigitsCNN, cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "healthy"


def setup() -> triage.Setup:
    model = DigitsCNN()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_image_batches())


def fixed_setup() -> triage.Setup:
    return setup()


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=5)  # early: most of the progress is still ahead
