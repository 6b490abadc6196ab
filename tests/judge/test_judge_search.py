"""A search's judgements (judge/search.py) on trial figures alone: when it stops, when a half-decade
between grid points earns a trial, and which trial it chooses."""

import math
from types import SimpleNamespace

from triage.judge import search


def trial(loss_end, *, works=False, finite=True, loss_ratio=0.8, improvement=0.9):
    return SimpleNamespace(loss_end=loss_end, fix_works=works, finite=finite, loss_ratio=loss_ratio,
                           improvement=improvement)


def test_going_up_a_search_stops_at_the_first_trial_that_diverges_not_before():
    assert not search.settled([(10.0, trial(2.0))], "up")
    assert search.settled([(10.0, trial(2.0)), (100.0, trial(9.0, loss_ratio=1.6))], "up")
    assert search.settled([(10.0, trial(None, finite=False))], "up")


def test_a_search_goes_on_while_each_working_trial_beats_the_last():
    better = [(0.1, trial(1.0, works=True)), (0.01, trial(0.5, works=True))]
    assert not search.settled(better, "down")
    assert search.settled([*better, (0.001, trial(0.7, works=True))], "down")
    assert search.choose([*better, (0.001, trial(0.7, works=True))])[0] == 0.01


def test_going_down_a_search_stops_once_the_lr_is_too_small_to_move_the_loss():
    assert search.settled([(0.1, trial(2.0)), (0.01, trial(2.0, loss_ratio=0.99))], "down")
    assert not search.settled([(0.1, trial(2.0)), (0.01, trial(1.9, loss_ratio=0.99))], "down")


def test_the_half_decade_is_tried_only_where_the_best_grid_trial_beat_the_run():
    beat = [(0.1, trial(1.0, improvement=0.7)), (0.01, trial(1.5))]
    assert math.isclose(search.between(beat, "down"), math.sqrt(0.1 * 1.0))
    assert search.between([(0.1, trial(1.0, improvement=1.1))], "down") is None  # no grid LR beat the run
    assert search.between([(0.1, trial(1.0, works=True))], "down") is None  # one already works


def test_with_nothing_working_the_finite_trial_that_ends_lowest_is_chosen():
    assert search.choose([(1, trial(None, finite=False)), (2, trial(3.0)), (3, trial(2.0))])[0] == 3
    assert search.choose([(1, trial(None, finite=False)), (2, trial(None, finite=False))])[0] == 2


def test_the_least_working_factor_is_the_working_trial_nearest_the_runs_own_lr():
    # LoRA at 1/100 of its LR (the real-programs benchmark): x1000 and x10000 both work, x10000 ends lower by
    # memorising the snapshot; how far the LR must move is x1000, not the factor chosen.
    trials = [(10.0, trial(0.67)), (100.0, trial(0.59)), (1e3, trial(0.17, works=True)),
              (1e4, trial(0.0006, works=True)), (1e5, trial(0.94))]
    assert search.choose(trials)[0] == 1e4
    assert search.least_working(trials) == 1e3
    assert search.least_working([(0.1, trial(0.5, works=True)), (0.01, trial(0.4, works=True))]) == 0.1
    assert search.least_working([(10.0, trial(0.67))]) is None
