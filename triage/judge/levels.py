"""What a loss against its levels means (the levels themselves, measured: triage/outcomes/levels.py)."""

from __future__ import annotations

import math
from typing import Optional

from triage.outcomes.levels import LevelKind, LossLevels

__all__ = ["LevelKind", "LossLevels", "below_floor", "gap_ratio"]

# Under the floor by more than rounding: a thousandth of the loss of learning nothing (of 1 where unknown).
BELOW_FLOOR = 1e-3


def below_floor(levels: LossLevels, loss: Optional[float]) -> bool:
    """`loss` lies under the loss's floor by more than rounding: a term with the wrong sign, never a fix."""
    if levels.floor is None or loss is None or not math.isfinite(loss):
        return False
    scale = abs(levels.nothing_learned) if levels.nothing_learned else 1.0
    return loss < levels.floor - BELOW_FLOOR * scale


# The room above a perfect prediction a gap is read on: a tenth of the start loss (else the gap is noise).
GAP_ROOM = 0.1


def gap_ratio(start: Optional[float], end: Optional[float], perfect: Optional[float]) -> Optional[float]:
    """How much of its distance to a perfect prediction's loss a replay kept: (end - perfect) / (start -
    perfect). A listwise or soft-target loss cannot fall under its targets' entropy: halving it is no test
    of learning, halving its distance to that entropy is. None where the start is not a tenth above it."""
    if None in (start, end, perfect) or not all(math.isfinite(v) for v in (start, end, perfect)):
        return None
    room = start - perfect
    if room <= GAP_ROOM * abs(start):
        return None
    return (end - perfect) / room
