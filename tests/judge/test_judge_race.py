"""Racing's rules (judge/race.py, judge/fix.highest_working_end, judge/search.to_beat) on figures alone, and
which candidates of the default playbook may race (walk/reads.raceable)."""

import math

import numpy as np
import pytest

from triage.judge.fix import highest_working_end, judge_fix
from triage.judge.levels import LossLevels
from triage.judge.race import Bar, noise, out_of_contention
from triage.judge.search import to_beat, to_matter
from triage.walk.playbook import load_playbook
from triage.walk.reads import raceable

NEVER_EXTENDED = lambda start, end: False  # noqa: E731
BAR = Bar(4.9, "work against 'baseline'")


def curve(values, spread=0.02, seed=0):
    return list(np.asarray(values, dtype=float) + np.random.default_rng(seed).normal(0, spread, len(values)))


def test_a_flat_candidate_far_above_its_bar_stops_at_a_quarter_of_its_first_window():
    losses = curve([6.2] * 40)
    assert out_of_contention(losses[:5], steps=40, extend_to=120, bar=BAR, run_noise=0.02,
                             extendable=NEVER_EXTENDED) is None  # before a quarter of its first window
    reason = out_of_contention(losses[:10], steps=40, extend_to=120, bar=BAR, run_noise=0.02,
                               extendable=NEVER_EXTENDED)
    assert reason is not None and reason.startswith("stopped after 10 of its 40 steps") and "4.9" in reason


def test_a_candidate_falling_fast_enough_to_reach_its_bar_stays_in():
    losses = curve(np.linspace(6.2, 4.5, 40))  # crosses the bar at about step 32
    for done in range(10, 40, 5):
        assert out_of_contention(losses[:done], steps=40, extend_to=120, bar=BAR, run_noise=0.02,
                                 extendable=NEVER_EXTENDED) is None


def test_a_slow_fix_that_could_earn_its_extension_is_projected_to_the_extension():
    losses = curve(np.linspace(6.2, 6.0, 20))  # 0.01 a step: 5.8 at step 40, 5.0 at step 120
    kwargs = dict(steps=40, extend_to=120, bar=Bar(5.2, "work"), run_noise=0.02)
    assert out_of_contention(losses, **kwargs, extendable=lambda start, end: True) is None
    assert out_of_contention(losses, **kwargs, extendable=NEVER_EXTENDED) is not None


def test_noise_large_against_the_gap_keeps_a_candidate_in():
    losses = curve([5.3] * 20, spread=0.02)
    assert out_of_contention(losses, steps=40, extend_to=0, bar=BAR, run_noise=0.02, extendable=NEVER_EXTENDED)
    assert out_of_contention(losses, steps=40, extend_to=0, bar=BAR, run_noise=0.2, extendable=NEVER_EXTENDED) is None


def test_a_candidate_on_the_runs_own_batches_is_raced_by_its_gap_to_the_run_step_by_step():
    """A Barlow Twins replay at its schedule's peak LR (the thirteenth round; these are its figures): its
    batches' losses spread over 196-244, it ran 15 under the run by step 19 and was stopped as flat, where that
    LR wins over 120 steps. Paired with the run's own losses on the same batches, the gap's fall keeps it in;
    a gap that stays flat is stopped, however noisy the batches; another first loss is not the same start."""
    run = [211.0, 222.8, 215.0, 221.8, 224.8, 207.3, 234.0, 217.9, 231.2, 225.5, 204.9, 196.1, 212.4, 216.7, 218.7,
           220.0, 235.2, 231.4, 233.7, 223.4, 244.4, 212.7, 229.5, 213.2, 228.6, 225.7, 223.1, 227.5, 226.1, 218.1,
           211.6, 230.9, 232.4, 219.3, 224.3, 220.8, 217.0, 228.9, 230.8, 234.4]
    at_peak = [211.0, 222.0, 213.4, 220.2, 221.7, 202.9, 229.6, 212.5, 224.1, 218.5, 195.6, 188.7, 201.5, 201.9,
               204.8, 208.1, 220.3, 214.7, 217.4, 204.8]
    kwargs = dict(steps=40, extend_to=120, bar=Bar(181.3, "work against 'baseline'"), run_noise=noise(run),
                  extendable=lambda start, end: True)
    assert out_of_contention(at_peak, **kwargs) is not None  # read alone: flat within its batches' spread
    assert out_of_contention(at_peak, **kwargs, paired=run) is None
    flat = [x - 1.0 for x in run[:20]]
    flat[0] = run[0]
    reason = out_of_contention(flat, **kwargs, paired=run)
    assert reason is not None and "gap" in reason
    elsewhere = [run[0] + 5.0] + at_peak[1:]
    assert out_of_contention(elsewhere, **kwargs, paired=run) == out_of_contention(elsewhere, **kwargs)
    broke_later = run[:30] + [float("nan")] * 10  # a run that goes non-finite after: its end is no anchor
    assert out_of_contention(at_peak, **kwargs, paired=broke_later) == out_of_contention(at_peak, **kwargs)


def test_step_to_step_noise_is_not_inflated_by_a_trend_or_one_spike():
    falling = curve(np.linspace(10, 2, 40), spread=0.05)
    falling[7] = 40.0
    assert 0.01 < noise(falling) < 0.1  # the noise is 0.05; a straight-line fit would say 5


@pytest.mark.parametrize("reference_end, levels", [
    (6.2, LossLevels(kind="classification", num_classes=512, chance=math.log(512), constant=6.2, floor=0.0)),
    (2.0, LossLevels(kind="regression", constant=1.0, floor=0.0)),  # the sane level binds, under the margin's
    (-0.5, LossLevels(kind="unknown")),  # a loss that can go negative
    (math.inf, LossLevels(kind="regression", constant=1.0, floor=0.0)),  # the run blew up: only the level binds
])
def test_the_highest_working_end_is_where_judge_fix_turns(reference_end, levels):
    bar = highest_working_end(reference_end=reference_end, levels=levels)
    nudge = 1e-6 * max(1.0, abs(bar))

    def works(end):
        return judge_fix(finite=True, loss_start=max(abs(reference_end), 10.0) if math.isfinite(reference_end)
                         else 10.0, loss_end=end, reference_end=reference_end, levels=levels).fix_works
    assert works(bar - nudge) and not works(bar + nudge)


def test_no_bar_where_any_end_could_work():
    assert highest_working_end(reference_end=math.inf, levels=LossLevels(kind="unknown")) is None


class Figures:
    def __init__(self, fix_works, loss_end):
        self.fix_works, self.loss_end = fix_works, loss_end


def test_a_later_trial_must_end_below_the_best_trial_that_works():
    trials = [(0.1, Figures(False, 6.2)), (0.01, Figures(True, 3.4))]
    bar = to_beat(trials, lambda f: f"lr x{f:g}", factor=0.001)
    assert bar.level == 3.4 and "lr x0.01" in bar.what
    assert to_beat(trials[:1], lambda f: f"lr x{f:g}", factor=0.01) is None  # none works yet
    # nearer the run's own LR than every trial that works: it could be the least that works
    assert to_beat([(0.01, Figures(True, 3.4))], lambda f: f"lr x{f:g}", factor=0.1) is None


def test_before_any_trial_works_a_later_one_matters_by_working_or_by_ending_lowest():
    class Trial(Figures):
        finite = True
    trials = [(10.0, Trial(False, 2.0)), (100.0, Trial(False, 5.0))]
    bar = to_matter(trials, lambda f: f"lr x{f:g}", working=1.2)
    assert bar.level == 2.0 and "lr x10" in bar.what  # the lowest so far binds: it lies above what works
    assert to_matter(trials, lambda f: f"lr x{f:g}", working=2.5).level == 2.5  # the lowest failed on another count
    assert to_matter(trials, lambda f: f"lr x{f:g}", working=None) is None  # any end could work


def test_only_candidates_no_other_node_reads_may_race():
    book = load_playbook()
    raced = raceable(book)
    assert {"lower_lr", "clip", "restart_lower_lr", "no_decay"} <= raced
    assert "higher_lr" not in raced  # plateau_long replays its chosen factor (lr_factor_of: higher_lr)
    assert "restart" not in raced and "restart_stuck" not in raced  # controls: every candidate is judged against them
    assert "standard_loss" not in raced  # not a replay


def test_a_restart_at_chance_has_not_begun_and_stays_in():
    """A fresh init can sit at chance and then fall fast (a ViT restart at lr x0.01: 2.298 for 15 steps, then
    0.93): a restart is raced only once it has begun to learn."""
    at_chance = curve([2.30] * 15, spread=0.005)
    kwargs = dict(steps=40, extend_to=0, bar=Bar(1.7, "work"), run_noise=0.005, extendable=NEVER_EXTENDED)
    assert out_of_contention(at_chance, **kwargs) is not None  # from the checkpoint: stuck at chance
    assert out_of_contention(at_chance, **kwargs, restart=True, learned_nothing=0.9 * 2.30) is None
    # fell 13% (under its start and under the level), then flattened: begun, and out of contention
    begun = curve(list(np.linspace(2.3, 2.0, 8)) + [2.0] * 7, spread=0.005)
    assert out_of_contention(begun, **kwargs, restart=True, learned_nothing=0.9 * 2.30 + 0.1) is not None
