"""loop_bug (step before backward): a CNN run whose train_step calls optimizer.step() right after zero_grad(), before
the forward and backward (reordered while adding AMP): every step sees the gradients that zero_grad() has just
set to None, so SGD skips every parameter and the weights never move. Fix: step after backward."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import PlainCNN
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "loop_bug"


def train_step_step_first(model, optimizer, batch):
    optimizer.zero_grad()
    optimizer.step()  # the bug: the gradients of this batch do not exist yet
    loss = cross_entropy(model, batch)
    loss.backward()
    return loss.detach()


def train_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _setup(step) -> triage.Setup:
    model = PlainCNN()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_image_batches(batch_size=32, n_batches=24),
                        train_step=step)


def setup() -> triage.Setup:
    return _setup(train_step_step_first)


def fixed_setup() -> triage.Setup:
    return _setup(train_step)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
