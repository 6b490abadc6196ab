"""label_bug (constant labels): a CNN on the digits whose labels come from one-hot rows through
`onehot.max(1).values.long()` (the values, where `.indices` was meant): every label is 1. The training loss
falls to ~0 (predicting "1" is easy) while the model learns nothing about digits. Fix: `.argmax(1)`."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import PlainCNN
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "label_bug"


def _batches(use_indices: bool):
    out = []
    for x, y in digits_image_batches(batch_size=32, n_batches=24):
        onehot = torch.nn.functional.one_hot(y, 10).float()  # how the labels were stored
        labels = onehot.argmax(1) if use_indices else onehot.max(1).values.long()  # the bug: 1 for every row
        out.append((x, labels))
    return out


def _setup(use_indices: bool) -> triage.Setup:
    model = PlainCNN()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=_batches(use_indices))


def setup() -> triage.Setup:
    return _setup(use_indices=False)


def fixed_setup() -> triage.Setup:
    return _setup(use_indices=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=30)
