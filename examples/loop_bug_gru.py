"""loop_bug (recurrent family): the GRU run's train_step never calls optimizer.zero_grad(), so each step applies
the sum of every gradient so far: Adam keeps pushing along stale directions and the loss stalls. Fix: zero_grad()."""

from __future__ import annotations

import torch

import triage
from _zoo import SequenceClassifier, cross_entropy, majority_token_batches, write_run_checkpoint

ROOT_CAUSE = "loop_bug"


def train_step_without_zero_grad(model, optimizer, batch):
    loss = cross_entropy(model, batch)
    loss.backward()  # the bug: .grad accumulates across steps
    optimizer.step()
    return loss.detach()


def train_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _setup(step) -> triage.Setup:
    model = SequenceClassifier()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                        loss_fn=cross_entropy, batches=majority_token_batches(), train_step=step)


def setup() -> triage.Setup:
    return _setup(train_step_without_zero_grad)


def fixed_setup() -> triage.Setup:
    return _setup(train_step)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
