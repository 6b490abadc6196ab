"""loop_bug: the run's own train_step for a 1-D CNN on pulse traces never calls optimizer.zero_grad():
gradients pile up across steps, so each SGD step follows the sum of every gradient so far and the run swings
and blows up. Fix: zero_grad() at the start of each step."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import PulseCNN, pulse_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "loop_bug"


def train_step_without_zero_grad(model, optimizer, batch):
    loss = cross_entropy(model, batch)
    loss.backward()  # the bug: .grad still holds every earlier step's gradient
    optimizer.step()
    return loss.detach()


def train_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _setup(step) -> triage.Setup:
    model = PulseCNN()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                        loss_fn=cross_entropy, batches=pulse_batches(), train_step=step)


def setup() -> triage.Setup:
    return _setup(train_step_without_zero_grad)


def fixed_setup() -> triage.Setup:
    return _setup(train_step)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=20)
