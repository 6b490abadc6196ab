"""healthy (a CNN without normalisation, Adam): the digits as images in batches of 32, Adam at lr=1e-3: it trains
normally. Nothing to fix; fixed_setup() is the same run."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import PlainCNN
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "healthy"


def setup() -> triage.Setup:
    model = PlainCNN()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=digits_image_batches(batch_size=32, n_batches=24))


def fixed_setup() -> triage.Setup:
    return setup()


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=10)  # early: most of the progress is still ahead
