"""no_gradient_flow: the loss is computed on a copy of the outputs made through NumPy, wrapped back with
requires_grad=True "so backward works" (a forum fix for 'element 0 of tensors does not require grad'):
backward runs, but no gradient reaches any weight and the loss never moves. 1-D CNN on pulse traces.
Fix: compute the loss on the model's output tensor itself."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch.nn import functional as F

import triage
from _holdout2 import PulseCNN, pulse_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "no_gradient_flow"


def loss_through_numpy(model, batch):
    x, y = batch
    logits = model(x)
    copy = torch.tensor(logits.detach().cpu().numpy(), requires_grad=True)  # the bug: a new leaf
    return F.cross_entropy(copy, y)


def _setup(loss_fn) -> triage.Setup:
    model = PulseCNN()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=loss_fn, batches=pulse_batches())


def setup() -> triage.Setup:
    return _setup(loss_through_numpy)


def fixed_setup() -> triage.Setup:
    return _setup(cross_entropy)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=30)
