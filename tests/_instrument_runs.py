"""Tiny in-memory runs for the instrument experiments' tests: digits (bundled with scikit-learn) and
an MLP, a session built from a setup function, and an experiment run as the engine would run it."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

import triage
from triage.experiments.base import Context, Experiment, Outcome
from triage.load.checkpoint import Checkpoint
from triage.load.session import Session, session_from_factory
from tests.tiny import judged_by_walk


def digits(n_batches: int = 8, batch_size: int = 64, offset: int = 0,
           shuffle_labels: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Standardised 8x8 digits as (x (B, 64) float, y (B,) long) batches, in a fixed random order."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = torch.tensor(y, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    if shuffle_labels:
        y = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(1))]
    starts = range(offset, offset + n_batches * batch_size, batch_size)
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in starts]


def mlp(hidden: int = 32, classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def cross_entropy(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def classifier_setup(batches=None, lr: float = 0.1, model: Optional[nn.Module] = None, **kwargs) -> triage.Setup:
    model = model if model is not None else mlp()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr),
                        loss_fn=kwargs.pop("loss_fn", cross_entropy),
                        batches=batches if batches is not None else digits(), **kwargs)


def session_of(factory: Callable[[], triage.Setup], checkpoint: Optional[Checkpoint] = None) -> Session:
    return session_from_factory(factory, checkpoint=checkpoint)


def run(experiment: Experiment, session: Session, **params) -> Outcome:
    """As the engine runs a node: restore the snapshot, measure (exceptions propagate here), and read a
    counterfactual's figures by the judge."""
    session.restore()
    values = experiment.params(**params)
    return judged_by_walk(experiment.measure(Context(session=session, budget_s=60), values), values)


def trained_checkpoint(factory: Callable[[], triage.Setup], steps: int) -> Checkpoint:
    """The checkpoint a stock loop (scheduler stepped each step) would have saved after `steps` steps."""
    torch.manual_seed(0)
    setup = factory()
    for step in range(steps):
        batch = setup.batches[step % len(setup.batches)]
        setup.optimizer.zero_grad()
        setup.loss_fn(setup.model, batch).backward()
        setup.optimizer.step()
        if setup.scheduler is not None:
            setup.scheduler.step()
    return Checkpoint(layout="dict", model_state=setup.model.state_dict(),
                      optimizer_state=setup.optimizer.state_dict(),
                      scheduler_state=setup.scheduler.state_dict() if setup.scheduler is not None else None,
                      step=steps)


def stock_checkpoint(tmp_path, make: Callable[[], triage.Setup], steps: int):
    """Train `make()`'s run with the stock loop (its scheduler stepped after each step) for `steps` steps and
    save its checkpoint (and loss log) the way a user would: (path, losses)."""
    torch.manual_seed(0)
    setup, losses = make(), []
    for step in range(steps):
        setup.optimizer.zero_grad()
        loss = setup.loss_fn(setup.model, setup.batches[step % len(setup.batches)])
        loss.backward()
        setup.optimizer.step()
        if setup.scheduler is not None:
            setup.scheduler.step()
        losses.append(loss.item())
    return triage.save_checkpoint(tmp_path / "ckpt.pt", setup.model, setup.optimizer, scheduler=setup.scheduler,
                                  step=steps, history=losses), losses


def train_and_triage(tmp_path, make: Callable[[], triage.Setup], steps: int) -> triage.Report:
    """Train `make()`'s run with the stock loop for `steps` steps, save its checkpoint and triage it."""
    path, _ = stock_checkpoint(tmp_path, make, steps)
    report, _ = triage.run(make, path, out=tmp_path / "report")
    return report
