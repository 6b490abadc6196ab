"""Issue 20's situations from real runs, each a tiny stock-PyTorch run triaged end to end: schedules,
param groups the candidates change, and verdicts that must say what the run measured."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import triage
from tests._instrument_runs import cross_entropy, digits


def _train_own_loop(setup: triage.Setup, steps: int) -> list[float]:
    torch.manual_seed(0)
    losses = []
    for step in range(steps):
        losses.append(float(setup.train_step(setup.model, setup.optimizer, setup.batches[step % len(setup.batches)])))
    return losses


def decayed_per_micro_batch() -> triage.Setup:
    """A linear decay to 0 planned over 100 steps but stepped once per micro-batch (4 a step): by step 25
    of the run its LR is 0, and no loop moves the weights any more."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / 100))

    def train_step(model, optimizer, batch):
        x, y = batch
        optimizer.zero_grad()
        total = 0.0
        for xs, ys in zip(x.chunk(4), y.chunk(4)):
            loss = cross_entropy(model, (xs, ys)) / 4
            loss.backward()
            total += float(loss)
            scheduler.step()  # the bug: once per micro-batch, not once per optimizer step
        optimizer.step()
        return torch.tensor(total)

    return triage.Setup(model=model, optimizer=optimizer, loss_fn=cross_entropy, batches=digits(16),
                        scheduler=scheduler, train_step=train_step, total_steps=100)


def test_a_schedule_at_lr_zero_is_the_schedule_not_a_loop_bug(tmp_path):
    """Issue 20, situation 12: `loop_bug` (high, "the weights never moved") before."""
    setup = decayed_per_micro_batch()
    losses = _train_own_loop(setup, 40)
    assert setup.optimizer.param_groups[0]["lr"] == 0.0
    path = triage.save_checkpoint(tmp_path / "ckpt.pt", setup.model, setup.optimizer, scheduler=setup.scheduler,
                                  step=40, history=losses)
    report, _ = triage.run(decayed_per_micro_batch, path, out=tmp_path / "report")
    assert report.root_cause == "lr_schedule_decayed", (report.root_cause, report.title)


def ctc_setup() -> triage.Setup:
    """A CTC speech-like model: batches of (features, targets, input lengths, target lengths). The target
    lengths (6..12) run past the 5 classes: read as labels they are "out of range"."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    classes, frames, batch = 5, 30, 16
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, classes))

    def loss_fn(model, b):
        x, targets, input_lengths, target_lengths = b
        log_probs = model(x).log_softmax(-1).transpose(0, 1)  # (T, B, C)
        return nn.functional.ctc_loss(log_probs, targets, input_lengths, target_lengths)

    batches = []
    for _ in range(8):
        target_lengths = torch.randint(6, 13, (batch,), generator=g)
        targets = torch.randint(1, classes, (batch, 12), generator=g)
        x = torch.randn(batch, frames, 8, generator=g)
        batches.append((x, targets, torch.full((batch,), frames, dtype=torch.long), target_lengths))
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), loss_fn=loss_fn,
                        batches=batches)


def test_the_label_check_reads_the_tensor_the_loss_scores_against():
    """Issue 20, situation 13: the last integer tensor (the target lengths) was taken for the labels."""
    from tests._instrument_runs import run, session_of
    from triage.experiments.labels import LABEL_CHECK

    outcome = run(LABEL_CHECK, session_of(ctc_setup))
    assert outcome.target == "[1]" and outcome.target_ambiguous
    assert outcome.out_of_range_count == 0 and outcome.label_max <= 4


def test_a_plain_classifier_has_one_unambiguous_target():
    from tests._instrument_runs import classifier_setup, run, session_of
    from triage.experiments.labels import LABEL_CHECK

    outcome = run(LABEL_CHECK, session_of(classifier_setup))
    assert (outcome.target, outcome.target_ambiguous) == ("[1]", False)


def warmup_to_a_peak_too_high() -> triage.Setup:
    """SGD warming up linearly over 100 steps to a peak LR of 50 (0.05 trains this MLP): by step 30 the
    LR is ~15 and the run diverges."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=50.0)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.001, end_factor=1.0, total_iters=100)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=cross_entropy, batches=digits(16),
                        scheduler=scheduler, total_steps=1000)


def _stock_run(make, tmp_path, steps: int):
    torch.manual_seed(0)
    setup, losses = make(), []
    for step in range(steps):
        setup.optimizer.zero_grad()
        loss = setup.loss_fn(setup.model, setup.batches[step % len(setup.batches)])
        loss.backward()
        setup.optimizer.step()
        setup.scheduler.step()
        losses.append(loss.item())
    return triage.save_checkpoint(tmp_path / "ckpt.pt", setup.model, setup.optimizer, scheduler=setup.scheduler,
                                  step=steps, history=losses), losses


def test_a_warmup_to_a_peak_lr_too_high_is_the_lr_not_the_init(tmp_path):
    """Issue 20, situation 1: restarts replayed the warmup from step 0 (a tiny LR that "works"), and the
    verdict was bad_initialization, high. (This run was right before the change too: the issue's own run
    was not reproduced here; it guards the restart's schedule position.)"""
    path, losses = _stock_run(warmup_to_a_peak_too_high, tmp_path, 12)
    report, _ = triage.run(warmup_to_a_peak_too_high, path, out=tmp_path / "report")
    assert report.root_cause == "lr_too_high", (report.root_cause, report.confidence, losses)


def slow_then_fast() -> triage.Setup:
    """A schedule whose LR is a fifth of its value for the first 45 steps (a warmup): over the replay's 40
    steps the run falls ~8%, and it trains at full speed only after them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.2 if step < 45 else 1.0)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=cross_entropy, batches=digits(16),
                        scheduler=scheduler)


def test_a_fix_extended_past_the_run_is_compared_over_the_same_steps():
    """Issue 20, situation 8: a candidate extended to 120 steps had its end set against the run's end at
    step 40. A candidate that changes nothing, extended, then "worked": it is the run itself."""
    from tests._instrument_runs import session_of, trained_checkpoint
    from triage.experiments.base import Context
    from triage.experiments.replay import REPLAY, ReplayParams

    session = session_of(slow_then_fast, trained_checkpoint(slow_then_fast, 3))
    baseline = ReplayParams(steps=40)
    ctx = Context(session=session, budget_s=600, params={"baseline": baseline})
    session.restore()
    ctx.outcomes["baseline"] = REPLAY.measure(ctx, baseline)
    assert 0.9 < ctx.outcomes["baseline"].loss_ratio < 0.95  # slow: a fix that learns would be extended
    session.restore()
    unchanged = REPLAY.measure(ctx, ReplayParams(steps=40, extend_to=120, against="baseline", wd_scale=1.0))
    assert unchanged.steps_run == 120 and unchanged.reference_steps == 120
    assert unchanged.improvement == pytest.approx(1.0) and not unchanged.fix_works
