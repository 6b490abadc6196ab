"""A search's trials two at a time (experiments/lanes.py): this process and a forked copy each measure a trial,
the search stops where it would one at a time, and every trial's figures are the ones measured one at a time."""

import pytest
import torch

from tests.tiny import context, mlp_setup
from triage import forks
from triage.experiments import lanes
from triage.experiments.replay import REPLAY, ReplayParams
from triage.experiments.search import LR_SEARCH, LrSearchParams
from triage.speedups import Speedups, using

pytestmark = pytest.mark.skipif(not forks.can_fork(torch.device("cpu"), 1), reason="needs Linux and two cores")


def searched(speedups: Speedups, lr: float, direction: str, monkeypatch, sent: list):
    """An LR search on the tiny MLP at `lr`, each trial paired with the run replayed over 30 steps."""
    send = forks.Forked.send
    monkeypatch.setattr(forks.Forked, "send", lambda self, job, payload: (sent.append(job), send(self, job, payload)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with using(speedups):
            ctx = context(lambda: mlp_setup(lr=lr))
            ctx.outcomes["base"] = REPLAY.measure(ctx, ReplayParams(steps=30))
            ctx.restart()
            return LR_SEARCH.measure(ctx, LrSearchParams(steps=30, direction=direction, against="base"))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("lr, direction", [(500.0, "down"), (5e-4, "up")])
def test_two_at_a_time_a_search_measures_what_it_measures_one_at_a_time(monkeypatch, lr, direction):
    """lr 500 down: x0.1 .. x0.001 blow up, x1e-4 works, x1e-5 is no better (five trials). lr 5e-4 up: it stops
    once a higher LR does worse, so a trial measured ahead of that is dropped, not reported."""
    sent: list = []
    together = searched(Speedups(draw_ahead=False), lr, direction, monkeypatch, sent)
    assert sent, "no trial went to the forked copy"
    alone_sent: list = []
    alone = searched(Speedups.none(), lr, direction, monkeypatch, alone_sent)
    assert alone_sent == []
    assert together.model_dump() == alone.model_dump()


def test_a_copy_that_dies_leaves_its_trial_to_this_process(monkeypatch):
    def dies(run_one, inbox, outbox):
        raise RuntimeError("the copy dies before it answers")

    monkeypatch.setattr(forks, "_serve", dies)
    sent: list = []
    together = searched(Speedups(draw_ahead=False), 500.0, "down", monkeypatch, sent)
    assert sent  # it was sent a trial, and died
    assert together.model_dump() == searched(Speedups.none(), 500.0, "down", monkeypatch, []).model_dump()


def test_a_trial_is_raced_against_every_trial_before_it_but_the_one_just_before():
    """Two at a time, the trial just before may still be running: a trial's bar never waits for it, so the
    figures do not depend on which process finished first."""
    seen = []

    def bar(earlier, setting):
        seen.append((setting, [s for s, _ in earlier]))
        return None

    class Lanes(lanes._Lanes):
        def __init__(self):
            self.settings, self.bar_of, self.done = ["a", "b", "c", "d"], bar, {0: None, 1: None, 2: None}
            self.failed = {}

    one = Lanes()
    assert [one._may_start(i) for i in range(5)] == [True, True, True, True, False]
    for index in range(4):
        one._bar(index)
    assert seen == [("a", []), ("b", []), ("c", ["a"]), ("d", ["a", "b"])]
    one.done = {0: None, 2: None}  # the third finished before the second: the fourth waits for the second
    assert not one._may_start(3) and one._may_start(2)


def test_a_trial_measured_here_ahead_of_time_stops_once_the_copy_settles_the_search():
    """The copy measures the first trial, this process the second; the first settles the search, so the
    second stops at its next step and is not reported, as one at a time it would never have run."""
    import time

    from triage.experiments.base import Abandoned

    abandoned = []

    def measure(ctx, setting, bar):
        for _ in range(300 if setting == "second" else 20):  # the second would take 3 s
            if ctx.abandon is not None and ctx.abandon():
                abandoned.append(setting)
                raise Abandoned
            time.sleep(0.01)
        return f"{setting} done"

    def settled(trials):
        return trials[0][0] == "first"

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with using(Speedups(draw_ahead=False)):
            ctx = context(lambda: mlp_setup(lr=1e-3))
            together = lanes.run_trials(ctx, ["first", "second", "third"], measure, lambda t, s: None, settled)
        with using(Speedups.none()):
            alone = lanes.run_trials(ctx, ["first", "second", "third"], measure, lambda t, s: None, settled)
    finally:
        torch.set_num_threads(threads)
    assert together == alone == [("first", "first done")]
    assert abandoned == ["second"]


def test_the_copy_never_asks_this_process_whether_to_stop(tmp_path):
    """As for the reference replayed alongside (test_alongside.py): Context.abandon is this process's question."""
    import os

    asked = tmp_path / "asked"

    def abandon() -> bool:
        with asked.open("a") as file:
            file.write(f"{os.getpid()}\n")
        return False
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with using(Speedups(draw_ahead=False)):
            ctx = context(lambda: mlp_setup(lr=500.0))
            ctx.outcomes["base"] = REPLAY.measure(ctx, ReplayParams(steps=30))
            ctx.restart()
            ctx.abandon = abandon
            out = LR_SEARCH.measure(ctx, LrSearchParams(steps=30, direction="down", against="base"))
    finally:
        torch.set_num_threads(threads)
    assert len(out.trials) >= 4
    assert set(asked.read_text().split()) == {str(os.getpid())}


def test_a_trial_that_raises_ahead_of_a_settled_search_is_not_its_error():
    """One at a time, a search that settles after its first trial never runs the second: that the second raised
    while measured ahead is no error of the search's. Where the search reaches it, its error is the search's."""
    import time

    def measure(ctx, setting, bar):
        if setting == "second":
            raise ValueError("the second trial's loss is NaN")
        time.sleep(0.3)
        return f"{setting} done"

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with using(Speedups(draw_ahead=False)):
            ctx = context(lambda: mlp_setup(lr=1e-3))
            settled = lanes.run_trials(ctx, ["first", "second"], measure, lambda t, s: None,
                                       lambda trials: trials[0][0] == "first")
            with pytest.raises(ValueError, match="second trial"):
                lanes.run_trials(ctx, ["first", "second"], measure, lambda t, s: None, lambda trials: False)
    finally:
        torch.set_num_threads(threads)
    assert settled == [("first", "first done")]
