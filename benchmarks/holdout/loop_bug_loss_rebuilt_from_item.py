"""loop_bug (the loss rebuilt from .item()): a regression MLP whose train_step logs the loss as a float and then,
to silence "element 0 of tensors does not require grad" after a refactor, calls backward() on
torch.tensor(loss.item(), requires_grad=True): a leaf cut from the model, so no parameter ever gets a gradient,
Adam never moves anything and the loss is flat. Fix: call backward() on the loss itself."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import mlp, mse_loss, regression_batches
from _zoo import write_run_checkpoint

ROOT_CAUSE = "loop_bug"


def train_step_rebuilt_loss(model, optimizer, batch):
    optimizer.zero_grad()
    value = mse_loss(model, batch).item()  # logged as a float
    loss = torch.tensor(value, requires_grad=True)  # the bug: a new leaf, unrelated to the model
    loss.backward()
    optimizer.step()
    return value


def train_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = mse_loss(model, batch)
    loss.backward()
    optimizer.step()
    return loss.item()


def _setup(step) -> triage.Setup:
    model = mlp([16, 64, 64, 1])
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=mse_loss, batches=regression_batches(batch_size=64), train_step=step)


def setup() -> triage.Setup:
    return _setup(train_step_rebuilt_loss)


def fixed_setup() -> triage.Setup:
    return _setup(train_step)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
