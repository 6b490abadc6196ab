"""The judge's rules for a run's own loss log (judge/history.py), on figures alone, each side of its threshold."""

from triage.judge import history


def test_an_oscillation_is_a_swing_over_half_the_level_that_grew_while_the_trend_stood_still():
    assert history.oscillates(swing=0.6, level=1.0, early_swing=0.2, trend_moved=0.1)
    assert not history.oscillates(swing=0.4, level=1.0, early_swing=0.1, trend_moved=0.0)  # under half the level
    assert not history.oscillates(swing=0.6, level=1.0, early_swing=0.5, trend_moved=0.0)  # it had it from the start
    assert not history.oscillates(swing=0.6, level=1.0, early_swing=0.1, trend_moved=0.7)  # the trend moved more


def test_divergence_gives_back_half_the_gain_and_a_tenth_of_the_best():
    assert history.gave_back(start=2.0, best=1.0, end=1.6)
    assert not history.gave_back(start=2.0, best=1.0, end=1.4)  # under half the gain given back
    assert not history.gave_back(start=1.0, best=0.99, end=1.05)  # over half of a tiny gain, under 10% of the best


def test_a_plateau_falls_under_a_percent_of_its_level_or_within_chance():
    assert history.stalled(fell=0.005, end=1.0, chance=0.0)
    assert not history.stalled(fell=0.02, end=1.0, chance=0.01)
    assert history.stalled(fell=0.02, end=1.0, chance=0.05)  # within its noise
