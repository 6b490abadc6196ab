"""The run replayed alongside a fix that outgrows it (experiments/alongside.py): a forked copy replays the
reference over the fix's longer window while the fix trains, and its figures are the ones the walk would have
measured after the fix."""

import pytest
import torch

from tests.tiny import context, mlp_setup
from triage import forks
from triage.experiments import alongside as alongside_module
from triage.experiments import replay as replay_module
from triage.experiments.replay import REPLAY, ReplayParams
from triage.speedups import Speedups, using

pytestmark = pytest.mark.skipif(not forks.can_fork(torch.device("cpu"), 1), reason="needs Linux and two cores")


def extended_fix(speedups: Speedups, monkeypatch, answers: list):
    """A fix at lr x3 extended from 10 steps to 30, paired with the run replayed over 10."""
    monkeypatch.setattr(replay_module, "_extendable", lambda *a: True)
    result = alongside_module.Alongside.result
    monkeypatch.setattr(alongside_module.Alongside, "result", lambda self: answers.append(result(self)) or answers[-1])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with using(speedups):
            ctx = context(lambda: mlp_setup(lr=1e-3))
            ctx.params["baseline"] = ReplayParams(steps=10)
            ctx.outcomes["baseline"] = REPLAY.measure(ctx, ctx.params["baseline"])
            ctx.session.restore()
            fix = REPLAY.measure(ctx, ReplayParams(steps=10, extend_to=30, lr_scale=3.0, against="baseline"))
            return fix, ctx.session.memo["replay baseline over 30 steps"]
    finally:
        torch.set_num_threads(threads)


def test_the_reference_replayed_alongside_is_the_one_replayed_after(monkeypatch):
    answers: list = []
    fix, reference = extended_fix(Speedups(draw_ahead=False), monkeypatch, answers)
    assert len(answers) == 1 and answers[0] is not None  # the copy's replay was used
    after: list = []
    fix_after, reference_after = extended_fix(Speedups.none(), monkeypatch, after)
    assert after == []  # with the speed machinery off, no copy: the reference is replayed after the fix
    assert fix.steps_run == 30 and fix.reference_steps == 30 and reference.steps_run == 30
    assert reference.model_dump() == reference_after.model_dump()
    assert fix.model_dump() == fix_after.model_dump()


def test_a_copy_that_dies_leaves_the_reference_to_be_replayed_here(monkeypatch):
    def dies(run_one, inbox, outbox):
        raise RuntimeError("the copy dies before it answers")

    monkeypatch.setattr(forks, "_serve", dies)
    answers: list = []
    fix, reference = extended_fix(Speedups(draw_ahead=False), monkeypatch, answers)
    assert answers == [None] and reference.steps_run == 30 and fix.reference_steps == 30


def test_the_copy_never_asks_this_process_whether_to_stop(tmp_path, monkeypatch):
    """Context.abandon is this process's question (it reads this process's pipes to its other copies): the copy
    replaying the reference alongside must never ask it, or it takes another copy's answer off its pipe."""
    import os

    asked = tmp_path / "asked"

    def abandon() -> bool:
        with asked.open("a") as file:
            file.write(f"{os.getpid()}\n")
        return False
    monkeypatch.setattr(replay_module, "_extendable", lambda *a: True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with using(Speedups(draw_ahead=False)):
            ctx = context(lambda: mlp_setup(lr=1e-3))
            ctx.params["baseline"] = ReplayParams(steps=10)
            ctx.outcomes["baseline"] = REPLAY.measure(ctx, ctx.params["baseline"])
            ctx.session.restore()
            ctx.abandon = abandon
            fix = REPLAY.measure(ctx, ReplayParams(steps=10, extend_to=30, lr_scale=3.0, against="baseline"))
    finally:
        torch.set_num_threads(threads)
    assert fix.reference_steps == 30 and "replay baseline over 30 steps" in ctx.session.memo
    assert set(asked.read_text().split()) == {str(os.getpid())}
