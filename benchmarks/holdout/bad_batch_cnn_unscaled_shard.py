"""bad_batch (a CNN, an unscaled shard): a CNN without normalisation layers on the digits as images, batches of 32,
SGD with Nesterov momentum; one shard (batch 20 of 24) was exported as raw 8-bit pixels (0..255) instead of
standardised values. Its loss and gradient are outliers and the step taken on it wrecks the run. Fix: drop (or
re-standardise) batch 20; the other 23 train normally."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import PlainCNN
from _zoo import cross_entropy, digits_raw_image_batches, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "bad_batch"
BAD_BATCH = 20
LOCATION = {"batch": BAD_BATCH}  # what triage should point at


def _batches(drop_bad: bool):
    batches = digits_image_batches(batch_size=32, n_batches=24)
    raw = digits_raw_image_batches(255.0, batch_size=32, n_batches=24)  # the same digits, in 0..255
    batches[BAD_BATCH] = raw[BAD_BATCH]
    if drop_bad:
        del batches[BAD_BATCH]
    return batches


def _setup(drop_bad: bool) -> triage.Setup:
    model = PlainCNN()
    return triage.Setup(model=model,
                        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True),
                        loss_fn=cross_entropy, batches=_batches(drop_bad))


def setup() -> triage.Setup:
    return _setup(drop_bad=False)


def fixed_setup() -> triage.Setup:
    return _setup(drop_bad=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=BAD_BATCH)  # trained up to the raw shard
