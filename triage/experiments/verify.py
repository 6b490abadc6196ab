"""One definition of "the fix works" (DESIGN §4), shared by every experiment that applies a fix.

A counterfactual, started from the same state as the run it is paired with (`against`), works when
- it stays finite to the end: a spike it recovers from is fine, only its end window counts;
- it ends clearly better than the run as it was: its end window (the median of its last fifth of
  steps) at most `margin` x the reference's, and lower by at least MIN_GAIN of the loss of learning
  nothing (a converged run's noise is no fault fixed), or the reference did not end finite at all;
- it ends at a sane level: clearly below (`level_margin` x) the loss of a model that learned nothing
  about its inputs — predicting the label frequencies for a classifier (ln K where they cannot be
  measured), the mean target for a regressor — or below its own start when neither is known.
  Staying finite at an absurd level (10^7 x chance) is not a fix, nor is ending at chance.
- and it does not end below the loss's floor (0 for cross-entropy, MSE, BCE, ...: levels.py measures it):
  a loss under the least it can score is a symptom (a term with the wrong sign), however low.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

from pydantic import Field

from triage.experiments.base import Outcome
from triage.experiments.levels import LossLevels

DEFAULT_MARGIN = 0.8  # "clearly better": the end window at least 20% below the run's
DEFAULT_LEVEL_MARGIN = 0.9  # "clearly below" learning nothing: 10% under it, more than noise
# "Clearly better" in size too: the gain at least 1% of the loss of learning nothing. A run that has all but
# memorised its data (0.008 against ln 10 = 2.3) ends 40% "better" by the noise of a few batches.
MIN_GAIN = 0.01


class VerifiedFix(Outcome):
    """The verification figures of a counterfactual (None where it was not paired with a reference)."""

    against: Optional[str] = Field(default=None, description="The node it is paired with: the run as it was.")
    reference_end: Optional[float] = Field(
        default=None, description="The reference's end-window loss (inf when it did not end finite).")
    reference_steps: Optional[int] = Field(
        default=None, description="The steps of the reference it was compared with: as many as its own (a fix "
                                  "extended past the reference's length is compared with the reference replayed "
                                  "as long).")
    improvement: Optional[float] = Field(
        default=None, description="loss_end / reference_end: lower is better; 0 when the reference blew up.")
    better: Optional[bool] = Field(default=None, description="Ends at most margin x the reference's end.",
                                   json_schema_extra={"ranks": "all"})
    sane_level: Optional[float] = Field(default=None, description="The level it must end below.")
    sane_kind: Optional[Literal["constant", "chance", "start"]] = Field(
        default=None, description="constant: level_margin x the best constant prediction's loss (label "
                                  "frequencies, mean target); chance: level_margin x ln K; start: its own start.")
    sane: Optional[bool] = Field(default=None, description="Ends below sane_level, and not below the loss's floor.",
                                 json_schema_extra={"ranks": "all"})
    fix_works: Optional[bool] = Field(default=None, description="Finite, better and sane: the fix is verified.",
                                      json_schema_extra={"ranks": "all"})


def verification(*, finite: bool, loss_start: Optional[float], loss_end: Optional[float],
                 reference: Optional[Outcome], against: Optional[str], levels: LossLevels,
                 margin: float = DEFAULT_MARGIN, level_margin: float = DEFAULT_LEVEL_MARGIN) -> dict:
    """The VerifiedFix fields of a counterfactual whose own figures are given, against `reference`
    (a replay-like outcome with `finite` and `loss_end`)."""
    if against is None or reference is None:
        return {}
    reference_end = _end(reference)
    ended = finite and loss_end is not None and math.isfinite(loss_end)
    improvement, better = None, False
    if ended:
        if not math.isfinite(reference_end):
            improvement, better = 0.0, True
        elif reference_end > 0:
            improvement = loss_end / reference_end
            nothing = levels.nothing_learned
            better = improvement <= margin and not (nothing and reference_end - loss_end < MIN_GAIN * nothing)
        else:  # a loss that can go negative: "clearly" is the same share of its size
            better = loss_end < reference_end - (1 - margin) * abs(reference_end)
    if levels.constant is not None and levels.constant > 0:
        level, kind = level_margin * levels.constant, "constant"
    elif levels.chance is not None:
        level, kind = level_margin * levels.chance, "chance"
    else:
        level, kind = loss_start, "start"
    sane = bool(ended and level is not None and loss_end < level and not levels.below_floor(loss_end))
    return dict(against=against, reference_end=reference_end, reference_steps=getattr(reference, "steps_run", None),
                improvement=improvement, better=better,
                sane_level=level, sane_kind=kind, sane=sane, fix_works=bool(ended and better and sane))


def _end(reference: Outcome) -> float:
    end = getattr(reference, "loss_end", None)
    if not getattr(reference, "finite", False) or end is None or not math.isfinite(end):
        return math.inf
    return float(end)
