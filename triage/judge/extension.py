"""Whether a counterfactual that is not verified after its steps deserves more (up to `extend_to`): a fix
that starts slowly is not ruled out by a window that was too short for it."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from triage.judge.fix import end_of, judge_fix
from triage.judge.levels import LossLevels

# A replay that ends 20% above the loss of learning nothing has blown up: it scores worse than a constant
# prediction, which a model at a sane LR never does. (1.5 missed the 40M LR fault's restart at the run's LR,
# 1.48x on CPU; at 1.2 every suite split, tune, heldout, lofo and blind, walks as at 1.5, case by case.)
BLOWN_UP = 1.2
# A counterfactual learns once its end window is 5% under its start window.
LEARNS = 0.95


class ReferenceFigures(BaseModel):
    """What the extension rule reads of the run a fix is paired with."""

    model_config = ConfigDict(frozen=True)

    finite: bool
    loss_end: Optional[float]
    loss_ratio: Optional[float]
    level_ratio: Optional[float]


def worth_more_steps(*, start: Optional[float], end: Optional[float], reference: ReferenceFigures,
                     levels: LossLevels, margin: float, level_margin: float) -> bool:
    """The fix (its start and end windows so far) is not verified yet, but it learns (its loss down 5%)
    where the run it is paired with did not: down less than 10%, or not finite, or down only to chance
    level (90% of the loss of learning nothing or above: a restart at a blown-up LR falls from its init's
    18 there, and stays) while the fix already learns past it (under 90% of that loss). Or the fix holds
    at the loss of learning nothing or below where the run it is paired with blew up (BLOWN_UP): a large
    model restarted at a good LR sits at chance for its first 40 steps (300M parameters restarted at lr
    3.2e-5: 6.06 at step 40, against chance 6.17 and a restart at the run's lr 0.1 at 18.7; at 3e-5 it
    reaches 4.70 by step 80)."""
    if start is None or end is None or not start > 0:
        return False
    nothing = levels.nothing_learned
    held = (reference.finite and reference.level_ratio is not None and reference.level_ratio > BLOWN_UP
            and nothing is not None and 0 < nothing and end <= nothing)
    if end > LEARNS * start and not held:
        return False
    if not held and reference.finite and reference.loss_ratio is not None and reference.loss_ratio < 0.9:
        # The reference fell: worth extending only where it fell no further than chance level and the fix
        # already learns past it (a restart at the same blown-up LR falls from 18 to chance level too).
        learned_nothing = reference.level_ratio is not None and reference.level_ratio > level_margin
        if not learned_nothing or not nothing or nothing <= 0 or end / nothing > level_margin:
            return False
    reference_end = end_of(reference.finite, reference.loss_end)
    return not judge_fix(finite=True, loss_start=start, loss_end=end, reference_end=reference_end, levels=levels,
                         margin=margin, level_margin=level_margin).fix_works
