"""Every optimizer of torch.optim (and a user's own subclass) and every scheduler of torch.optim.lr_scheduler,
saved mid-run in a checkpoint as a user saves it, is triaged to a verdict: loaded, replayed, judged (issue 22)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.optim import lr_scheduler as sched

import triage
from tests.load.test_optimizer_loading import OPTIMIZERS, _batches, _factory, _loss, _model

STEPS = 10  # replay steps: enough to reach a verdict, short enough for CI

SCHEDULERS = {
    "LambdaLR": lambda o: sched.LambdaLR(o, lambda s: min(1.0, (s + 1) / 5)),
    "MultiplicativeLR": lambda o: sched.MultiplicativeLR(o, lambda s: 0.99),
    "StepLR": lambda o: sched.StepLR(o, step_size=3, gamma=0.5),
    "MultiStepLR": lambda o: sched.MultiStepLR(o, milestones=[2, 5], gamma=0.5),
    "ConstantLR": lambda o: sched.ConstantLR(o, factor=0.5, total_iters=4),
    "LinearLR": lambda o: sched.LinearLR(o, start_factor=0.1, total_iters=10),
    "ExponentialLR": lambda o: sched.ExponentialLR(o, gamma=0.95),
    "SequentialLR": lambda o: sched.SequentialLR(o, [sched.LinearLR(o, start_factor=0.1, total_iters=3),
                                                     sched.CosineAnnealingLR(o, T_max=20)], milestones=[3]),
    "CosineAnnealingLR": lambda o: sched.CosineAnnealingLR(o, T_max=20),
    "ChainedScheduler": lambda o: sched.ChainedScheduler([sched.ConstantLR(o, factor=0.5, total_iters=2),
                                                          sched.ExponentialLR(o, gamma=0.95)]),
    "ReduceLROnPlateau": lambda o: sched.ReduceLROnPlateau(o, patience=1),
    "CyclicLR": lambda o: sched.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=4),
    "CosineAnnealingWarmRestarts": lambda o: sched.CosineAnnealingWarmRestarts(o, T_0=5),
    "OneCycleLR": lambda o: sched.OneCycleLR(o, max_lr=0.1, total_steps=100),
    "PolynomialLR": lambda o: sched.PolynomialLR(o, total_iters=50),
}


def _scheduled(name: str):
    def setup() -> triage.Setup:
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return triage.Setup(model=model, optimizer=optimizer, loss_fn=_loss, batches=_batches(),
                            scheduler=SCHEDULERS[name](optimizer))
    return setup


def _triage_mid_run(factory, tmp_path) -> triage.Report:
    """Train 3 steps as the run did (closure-stepped, scheduler stepped after each), save as a user would,
    and triage the checkpoint."""
    torch.manual_seed(0)
    s = factory()
    for step, batch in enumerate(_batches()):
        def closure(batch=batch):
            s.optimizer.zero_grad()
            loss = _loss(s.model, batch)
            loss.backward()
            return loss
        loss = s.optimizer.step(closure)
        if isinstance(s.scheduler, sched.ReduceLROnPlateau):
            s.scheduler.step(float(loss.detach()))
        elif s.scheduler is not None:
            s.scheduler.step()
    path = triage.save_checkpoint(tmp_path / "ckpt.pt", s.model, s.optimizer, scheduler=s.scheduler, step=3)
    report, _ = triage.run(factory, path, out=tmp_path / "report", steps=STEPS)
    return report


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_saved_mid_run_is_triaged_to_a_verdict(name, tmp_path):
    report = _triage_mid_run(_factory(name), tmp_path)
    assert report.status == "complete" and report.root_cause not in ("inconclusive", "incomplete"), (
        report.root_cause, report.title, report.fix)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_saved_mid_run_is_triaged_to_a_verdict(name, tmp_path):
    report = _triage_mid_run(_scheduled(name), tmp_path)
    assert report.status == "complete" and report.root_cause not in ("inconclusive", "incomplete"), (
        report.root_cause, report.title, report.fix)
    failed = [e.node for e in report.experiments if e.status == "error"]
    assert not failed, f"experiments raised under {name}: {failed}"


def test_every_scheduler_class_is_covered():
    classes = {n for n, c in inspect.getmembers(sched, inspect.isclass)
               if (issubclass(c, sched.LRScheduler) or c is sched.ReduceLROnPlateau)
               and c.__module__.startswith("torch.optim") and n not in ("LRScheduler", "_LRScheduler")}
    assert classes <= set(SCHEDULERS), f"not covered: {sorted(classes - set(SCHEDULERS))}"
