"""What a run's own loss log says (`triage read-history`, cli/watch/reading.py): the judge's rules for a
logged curve, read on figures that reading measures from it (smoothed by a running median). A log has many
more points than a replay's 40 steps, so these rules are its own, not the replay's."""

from __future__ import annotations

# Oscillating: over the log's last half the loss swings around its smoothed trend (10th to 90th percentile of
# the residuals) by more than half the trend's level, more than twice its swing over the first quarter (a
# swing the run had from its start is its batch noise), while the trend itself moved less than the swing.
SWING_REL = 0.5
SWING_GROWTH = 2.0
# Diverged: the loss ended above its best by more than half of what it gained from its start to that best,
# and by more than a tenth of the best's size.
DIVERGE_SHARE = 0.5
DIVERGE_MIN_REL = 0.1
# Plateau: over the last third the loss fell less than 1% of its level, or within chance of its noise.
PLATEAU_REL = 0.01


def oscillates(swing: float, level: float, early_swing: float, trend_moved: float) -> bool:
    return swing > SWING_REL * level and swing > SWING_GROWTH * early_swing and abs(trend_moved) < swing


def gave_back(start: float, best: float, end: float) -> bool:
    given_back = end - best
    return given_back > DIVERGE_SHARE * (start - best) and given_back > DIVERGE_MIN_REL * abs(best)


def stalled(fell: float, end: float, chance: float) -> bool:
    return fell < max(PLATEAU_REL * abs(end or 1e-12), chance)
