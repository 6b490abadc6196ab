"""The verification figures a counterfactual's outcome carries (VerifiedFix), filled by the judge
(triage/judge/fix.py: what "the fix works" means) from the counterfactual's figures and its reference's.
"""

from __future__ import annotations

from typing import Optional

from triage.experiments.base import Outcome
from triage.judge.fix import DEFAULT_LEVEL_MARGIN, DEFAULT_MARGIN, end_of, judge_fix
from triage.judge.levels import LossLevels
from triage.outcomes.verify import VerifiedFix

__all__ = ["DEFAULT_LEVEL_MARGIN", "DEFAULT_MARGIN", "VerifiedFix", "verification"]


def verification(*, finite: bool, loss_start: Optional[float], loss_end: Optional[float],
                 reference: Optional[Outcome], against: Optional[str], levels: LossLevels,
                 val_end: Optional[float] = None,
                 margin: float = DEFAULT_MARGIN, level_margin: float = DEFAULT_LEVEL_MARGIN) -> dict:
    """The VerifiedFix fields of a counterfactual whose own figures are given, against `reference`
    (a replay-like outcome with `finite` and `loss_end`), as the judge reads them."""
    if against is None or reference is None:
        return {}
    reference_val = getattr(reference, "val_final", None)
    verdict = judge_fix(finite=finite, loss_start=loss_start, loss_end=loss_end, reference_end=_end(reference),
                        levels=levels, margin=margin, level_margin=level_margin, fix_val=val_end,
                        reference_val=reference_val)
    return dict(against=against, reference_steps=getattr(reference, "steps_run", None), fix_val=val_end,
                reference_val=reference_val, **verdict.model_dump())


def _end(reference: Outcome) -> float:
    return end_of(getattr(reference, "finite", False), getattr(reference, "loss_end", None))
