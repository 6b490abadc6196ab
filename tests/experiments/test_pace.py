"""Slow learning judged in steps of this run (issue 26, item 5): a replay's pace against the run's own."""

from types import SimpleNamespace

import pytest

from triage.experiments.pace import pace_vs_run
from triage.judge.named import SLOW_PACE
from triage.load.history import HistoryPoint


def session(step, history=()):
    return SimpleNamespace(checkpoint=SimpleNamespace(
        step=step, history=[HistoryPoint(step=s, loss=v) for s, v in history]))


def falling(start, end, steps):
    return [start + (end - start) * i / (steps - 1) for i in range(steps)]


def test_a_run_still_learning_at_its_own_pace_is_not_stalled():
    """The issue's 1M language model: 6.27 -> 5.25 over its 80 steps, then 7% in the 40 replay steps,
    under the old 10% threshold (lr_too_low, high, in some runs), at ~0.7 of its own pace here."""
    logged = [(s, v) for s, v in zip(range(80), falling(6.27, 5.25, 80))]
    pace = pace_vs_run(session(80, logged), falling(5.25, 5.25 * 0.93, 40), nothing=6.24)
    assert pace > 0.5 > SLOW_PACE


def test_a_run_that_slowed_to_a_crawl_is_stalled():
    pace = pace_vs_run(session(80), falling(5.25, 5.24, 40), nothing=6.24)
    assert pace < 0.5 * SLOW_PACE


def test_without_a_log_the_pace_is_counted_from_the_loss_of_learning_nothing():
    # from 2.30 (nothing learned) to 1.30 in 100 steps: 0.01 per step; the replay sheds 0.001 per step
    pace = pace_vs_run(session(100), falling(1.30, 1.30 - 0.039, 40), nothing=2.30)
    assert pace == pytest.approx(0.1, rel=0.05)


def test_a_fall_from_an_absurd_init_to_chance_is_not_learning_pace():
    # logged from 40 down to 2.4 (chance level 2.3), then 2.3: the run's pace below chance is what counts
    logged = [(0, 40.0), (10, 2.4), (20, 2.36), (30, 2.35)]
    assert pace_vs_run(session(40, logged), falling(2.35, 2.34, 40), nothing=2.3) is None  # never below chance


def test_no_step_no_pace():
    assert pace_vs_run(session(None), falling(2.0, 1.0, 40), nothing=2.3) is None
