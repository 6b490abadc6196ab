"""The verification figures a counterfactual's outcome carries (VerifiedFix), filled by the judge
(triage/judge/fix.py: what "the fix works" means) from the counterfactual's figures and its reference's.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.experiments.base import Outcome
from triage.judge.fix import DEFAULT_LEVEL_MARGIN, DEFAULT_MARGIN, SaneKind, end_of, judge_fix
from triage.judge.levels import LossLevels

__all__ = ["DEFAULT_LEVEL_MARGIN", "DEFAULT_MARGIN", "VerifiedFix", "verification"]


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
    sane_kind: Optional[SaneKind] = Field(
        default=None, description="constant: level_margin x the best constant prediction's loss (label "
                                  "frequencies, mean target); chance: level_margin x ln K; start: its own start.")
    sane: Optional[bool] = Field(default=None, description="Ends below sane_level, and not below the loss's floor.",
                                 json_schema_extra={"ranks": "all"})
    fix_val: Optional[float] = Field(
        default=None, description="Its validation loss at its end (val_final), where the run has validation data.")
    reference_val: Optional[float] = Field(
        default=None, description="The reference's validation loss at its end, over the same steps.")
    generalises: Optional[bool] = Field(
        default=None, description="Its validation loss ends lower than the reference's, clearly (None without "
                                  "validation data): a fix that only memorises the snapshot is none.",
        json_schema_extra={"ranks": "all"})
    fix_works: Optional[bool] = Field(default=None, description="Finite, better, sane and, where validation "
                                                                "data exists, generalising: the fix is verified.",
                                      json_schema_extra={"ranks": "all"})


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
