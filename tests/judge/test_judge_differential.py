"""The differential's judge on figures alone: how far an LR fix may move before it claims medium at most."""

import pytest

from triage.judge.differential import FAR_FACTOR, USUAL_LR, far_fetched


@pytest.mark.parametrize("factor", [1e4, 1e-4, 1e5])
def test_a_fix_over_three_orders_of_magnitude_away_is_far_fetched_whatever_the_optimizer(factor):
    assert "over 1000x away" in far_fetched(factor)
    assert far_fetched(factor, 1e-3, "Adam") is not None


@pytest.mark.parametrize("factor, moved_to, kind", [
    (1000, 1e-3, "Adam"),  # 1e-3 written as 1e-6: the slip the grid is for
    (1000, 0.05, "SGD"),
    (0.001, 3e-3, "AdamW"),  # lr 3 for AdamW, lowered to where AdamW runs
    (0.1, 0.3, "AdamW"),  # lowered, still high: moved the right way, toward the usual range
    (100, 0.1, "Adam"),  # at the edge of the usual grids: still usual
    (10, 50.0, "MyOptimizer"),  # no known range: the factor alone decides
])
def test_a_fix_that_lands_where_the_optimizer_is_run_keeps_its_confidence(factor, moved_to, kind):
    assert far_fetched(factor, moved_to, kind) is None


@pytest.mark.parametrize("factor, moved_to, kind, side", [
    (1000, 1000.0, "LBFGS", "above"),  # the real-programs benchmark's L-BFGS closure without zero_grad()
    (100, 1.0, "Adam", "above"),
    (1e-3, 1e-8, "SGD", "below"),
    (1e-3, 1e-10, "AdamW", "below"),
])
def test_a_fix_past_the_optimizers_usual_lrs_in_its_own_direction_is_far_fetched(factor, moved_to, kind, side):
    reason = far_fetched(factor, moved_to, kind)
    low, high = USUAL_LR[kind]
    assert reason is not None and f"is {side} the LRs {kind} is usually run at ({low:g} to {high:g})" in reason


def test_unknown_figures_decide_nothing():
    assert far_fetched(None) is None and far_fetched(float("nan")) is None and far_fetched(True) is None
    assert far_fetched(FAR_FACTOR, None, "LBFGS") is None  # the LR it moved to was not measured
