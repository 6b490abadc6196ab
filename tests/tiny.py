"""Tiny in-memory runs for unit tests (synthetic data, seconds at most)."""

from __future__ import annotations

import torch
from torch import nn

import triage
from triage.experiments.base import Context
from triage.load.session import session_from_factory


def blobs(n_batches: int = 6, batch_size: int = 32, features: int = 8, classes: int = 3, seed: int = 0):
    """Separable Gaussian blobs as (x, y) batches; `seed` draws other examples of the same blobs."""
    centers = torch.randn(classes, features, generator=torch.Generator().manual_seed(1234)) * 3
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        y = torch.randint(0, classes, (batch_size,), generator=g)
        batches.append((centers[y] + torch.randn(batch_size, features, generator=g), y))
    return batches


def cross_entropy(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def mlp_setup(lr: float = 0.05, optimizer: str = "sgd", **extra) -> triage.Setup:
    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))
    opt = (torch.optim.Adam(model.parameters(), lr=lr) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
    return triage.Setup(model=model, optimizer=opt, loss_fn=cross_entropy, batches=blobs(), **extra)


def context(factory, budget_s: float = 60.0) -> Context:
    session = session_from_factory(factory)
    session.restore()
    return Context(session=session, budget_s=budget_s)


def judged_by_walk(outcome, params=None):
    """A counterfactual's outcome with the judge's reading of it, as the walk records it (an experiment
    measures the pairing; the walk asks the judge whether the fix works), at `params`' bars."""
    from triage.walk.measuring import judged_outcome

    return judged_outcome(outcome, params)
