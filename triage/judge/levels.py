"""What a loss against its levels means (the levels themselves, measured: triage/outcomes/levels.py)."""

from __future__ import annotations

import math
from typing import Optional

from triage.outcomes.levels import LevelKind, LossLevels

__all__ = ["LevelKind", "LossLevels", "below_floor"]

# Under the floor by more than rounding: a thousandth of the loss of learning nothing (of 1 where unknown).
BELOW_FLOOR = 1e-3


def below_floor(levels: LossLevels, loss: Optional[float]) -> bool:
    """`loss` lies under the loss's floor by more than rounding: a term with the wrong sign, never a fix."""
    if levels.floor is None or loss is None or not math.isfinite(loss):
        return False
    scale = abs(levels.nothing_learned) if levels.nothing_learned else 1.0
    return loss < levels.floor - BELOW_FLOOR * scale
