"""loop_bug: the run's train_step calls optimizer.zero_grad() between backward() and step(), wiping every gradient
before it is used: the weights never move and the loss is flat. Fix: zero_grad() before the forward pass."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "loop_bug"


def train_step_zero_grad_misplaced(model, optimizer, batch):
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.zero_grad()  # the bug: moved here while "cleaning up"; the gradients are gone before step()
    optimizer.step()
    return loss.detach()


def train_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _setup(step) -> triage.Setup:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_batches(), train_step=step)


def setup() -> triage.Setup:
    return _setup(train_step_zero_grad_misplaced)


def fixed_setup() -> triage.Setup:
    return _setup(train_step)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
